"""Live signals: the signal namespaces policies read, the per-endpoint load board, the
engines' ``/metrics`` scraper, the prefix index, and ``FleetState`` that holds them all."""
