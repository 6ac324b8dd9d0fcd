"""`python -m harness` runs the command line."""

from harness.entry import main

main()
