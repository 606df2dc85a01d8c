"""Shared test configuration."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from hypothesis import settings

# CI runs property tests on a fixed sequence of examples, so a landing never hinges on a
# random draw; locally they explore new examples on every run.
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def python_interrupt_handler() -> Iterator[None]:
    """SIGINT handled as Python does by default, whatever this process was started with: under
    `nohup ... &` (as CI runs) the shell starts it with SIGINT ignored, and an ignored signal
    stays ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
