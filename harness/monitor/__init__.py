"""The calibrated cascade as a deployable monitor: a bundle (`ctd monitor calibrate`), the Python
API (`await Monitor.load(bundle)`, `await monitor.check(conversation)` -> `Decision`), the drift
watch and the HTTP server (`ctd monitor serve`). Importing this package does not load the model:
`Monitor.load` does (and imports the probe side then)."""

from ._bundle import BUNDLE_VERSION, CONTROL_MODES, Bundle, ControlMode, read_bundle
from ._certify import BundleWritten, calibrate_bundle
from ._drift import Alarm, DelegationCap, RateWatch
from ._monitor import Decision, Latency, Monitor

__all__ = [
    "BUNDLE_VERSION",
    "CONTROL_MODES",
    "Alarm",
    "Bundle",
    "BundleWritten",
    "ControlMode",
    "Decision",
    "DelegationCap",
    "Latency",
    "Monitor",
    "RateWatch",
    "calibrate_bundle",
    "read_bundle",
]
