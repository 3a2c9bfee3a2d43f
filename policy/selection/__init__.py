"""Selection: eligibility filters, endpoint pickers inside a pool, and the per-request
P/D mode (aggregated or prefill/decode-disaggregated)."""
