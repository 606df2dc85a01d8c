"""The calibrated cascade as a deployable monitor: a bundle (`ctd monitor calibrate`), the Python
API (`Monitor.load`, `await monitor.check(conversation)` -> `Decision`), the drift alarm and the
HTTP server (`ctd monitor serve`). Importing this package does not import torch: `Monitor.load`
does."""

from ._bundle import BUNDLE_VERSION, CONTROL_MODES, Bundle, ControlMode, calibrate_bundle, read_bundle

__all__ = ["BUNDLE_VERSION", "CONTROL_MODES", "Bundle", "ControlMode", "calibrate_bundle", "read_bundle"]
