"""Shared test configuration."""

from __future__ import annotations

import os

from hypothesis import settings

# CI runs property tests on a fixed sequence of examples, so a landing never hinges on a
# random draw; locally they explore new examples on every run.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
