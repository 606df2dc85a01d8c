"""harness.data."""
