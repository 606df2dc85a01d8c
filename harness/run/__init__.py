"""harness.run."""
