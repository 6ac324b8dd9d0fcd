"""The jobs' inputs, declared once: each field with its flag, type, bounds, default and help
(`fields.py`), those several jobs share (`shared.py`), and one typed spec per job (`run.py`,
`bench.py`, `simulate.py`, `capacity.py`, `advise.py`). The commands generate their flags from
these; a benchmark file (`--config`) gives the same inputs; run.json records the spec that
`harness rerun` runs again."""
