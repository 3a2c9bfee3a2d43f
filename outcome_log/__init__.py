"""The live decision and outcome log: what Pointsman decided and what came of it, in one
SQLite file. The service writes it; training, calibration and replay read it back."""
