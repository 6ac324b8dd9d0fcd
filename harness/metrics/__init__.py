"""Metrics: pure functions of event records (and scraped server samples) -> numbers.

`harness.metrics.summary.summarize` turns one run's records into the summary.json dictionary.
"""
