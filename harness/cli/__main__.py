"""`python -m harness.cli` (what `accelerate launch -m harness.cli eval ...` runs)."""

from . import main

main()
