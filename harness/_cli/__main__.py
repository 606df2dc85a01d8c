"""`python -m harness._cli` (what `accelerate launch -m harness._cli eval ...` runs)."""

from . import main

main()
