"""Runtime adapters (installed as harness.adapters): one module per runtime behind one Protocol."""
