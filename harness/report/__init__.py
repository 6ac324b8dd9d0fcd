"""Reports: pure functions of results directories (HTML, comparison verdicts, history, export)."""
