"""harness.report."""
