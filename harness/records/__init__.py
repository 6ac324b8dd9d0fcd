"""Run records: one row per lifecycle event, append-only Parquet parts in a results directory."""
