"""harness.stages."""
