"""Run at the start of every Python process of a local SGLang server (this folder is on its
PYTHONPATH): installs the pin-release valve in its scheduler (`harness_pin_valve`) when the
launcher configured one."""

import harness_pin_valve

harness_pin_valve.install()
