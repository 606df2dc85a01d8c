"""The typed records of a run's files: each goes record -> file -> record unchanged, writes the
bytes the stages wrote before they were typed, and refuses a wrong version or a bad entry in one
line naming the file."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest

from harness import InputError, read_summary
from harness.data import dumps, read_json, write_json, write_table
from harness.monitor import JOINT_BUNDLE_VERSION, BundleRecord

# Private: the bundle record's parts, built by hand to write bundles of each shape.
from harness.monitor._bundle_record import BundleCandidates, BundleSources, ProbeSource, ScoresSource
from harness.report import SUMMARY_COLUMNS, SummaryRow, summary_tables
from harness.stages import DVMetrics, ProbeMetrics, read_dv_metrics, read_probe_metrics

# Private: the DV metrics' parts and a run's by-target object, built by hand to write each shape.
from harness.stages._dv_metrics import DVRun, dv_metrics_json

# Private: the probe metrics' parts, built by hand to write files of each shape.
from harness.stages._probe_metrics import ProbeRun, SplitExtraction

# summary.csv as the report wrote it before its rows were typed (two rows of the default run).
SUMMARY_CSV = (
    "arch,part,metric,column,at,value,low,high,kind,title\r\n"
    "attention,budget,CTD AUROC,0.1,0.1,0.8149623987907901,,,score,t\r\n"
    "attention,budget,CTD - probe AUROC,0.2,0.2,0.05248725844774597,0.032924107142857095,"
    '0.07035595105672976,gain,"t, with a comma"\r\n'
)


def _write_summary(path: Path, rows: list[SummaryRow]) -> None:
    """As the report writes it (ReportContext.table of the rows as dicts)."""
    dicts = [asdict(row) for row in rows]
    write_table(path, {k: np.asarray([r[k] for r in dicts]) for k in dicts[0]})


def test_summary_rows_round_trip_byte_for_byte(tmp_path: Path) -> None:
    before = tmp_path / "before.csv"
    before.write_text(SUMMARY_CSV, encoding="utf-8", newline="")
    rows = read_summary(before)
    assert rows[1].low == 0.032924107142857095 and math.isnan(rows[0].low) and rows[1].kind == "gain"
    after = tmp_path / "after.csv"
    _write_summary(after, list(rows))
    assert after.read_bytes() == before.read_bytes()
    assert read_summary(after) == rows and len(rows) == 2
    # `ctd eval --json` prints the cells as the CSV holds them, as it did before.
    assert rows[0].cells()["low"] == "" and rows[1].cells()["value"] == "0.05248725844774597"
    table = summary_tables(rows)[0]
    assert table.rows[1] == ("CTD - probe AUROC", ["—", "+0.052 [+0.033, +0.070]"])


def test_a_summary_of_other_columns_or_a_bad_cell_is_one_line(tmp_path: Path) -> None:
    old = tmp_path / "old.csv"
    old.write_text("arch,metric,value\nattention,CTD AUROC,0.8\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"old\.csv: columns arch, metric, value; expected arch, part"):
        read_summary(old)
    bad = tmp_path / "bad.csv"
    bad.write_text(SUMMARY_CSV.replace("0.8149623987907901", "high"), encoding="utf-8", newline="")
    with pytest.raises(InputError, match=r"bad\.csv: line 2: value 'high' is not a number"):
        read_summary(bad)
    assert tuple(SUMMARY_CSV.splitlines()[0].split(",")) == SUMMARY_COLUMNS
    assert read_summary(tmp_path / "absent.csv") == ()


def _probe_metrics() -> ProbeMetrics:
    extraction = SplitExtraction(80, 4413, 0, 4, 4648, 0, 0.03, "/store/a", 0.05055938037865748)
    runs = (
        ProbeRun("attention", 0, 59, 60, 64, 16, 0.4655, 0.8489, 0.68125, 0.8413, 0.6875),
        ProbeRun("attention", 1, 59, 60, 64, 16, 0.5019, None, 0.65, 0.7870, 0.6375),
    )
    return ProbeMetrics(
        "smollm2", "gguf:b1", 20, 30, 576, "float32", {"train": extraction}, runs, ProbeMetrics.means(runs)
    )


def test_probe_metrics_round_trip_and_keep_the_files_keys(tmp_path: Path) -> None:
    metrics = _probe_metrics()
    path = write_json(tmp_path / "probe_metrics.json", metrics.to_json())
    assert read_probe_metrics(path) == metrics
    written = json.loads(path.read_text())
    assert list(written) == [
        *("model", "model_identity", "layer", "n_layers", "hidden_size", "dtype"),
        *("extraction", "runs", "mean"),
    ]
    assert "version" not in written  # an unchanged run writes the same bytes as before
    assert written["mean"]["attention"] == {
        "dev_auroc": 0.8489,  # the seed with one class has no AUROC: the mean is of the other
        "dev_accuracy": (0.68125 + 0.65) / 2,
        "test_auroc": (0.8413 + 0.7870) / 2,
        "test_accuracy": (0.6875 + 0.6375) / 2,
    }


def test_probe_metrics_of_another_version_or_shape_are_one_line(tmp_path: Path) -> None:
    record = _probe_metrics().to_json()
    same = write_json(tmp_path / "same.json", {**record, "version": ProbeMetrics.VERSION})
    assert read_probe_metrics(same) == _probe_metrics()
    newer = write_json(tmp_path / "newer.json", {**record, "version": 99})
    with pytest.raises(InputError, match=r"newer\.json: probe metrics version 99, expected 1"):
        read_probe_metrics(newer)
    record["runs"][0]["extra"] = 1
    odd = write_json(tmp_path / "odd.json", record)
    with pytest.raises(InputError, match=r"odd\.json: not probe metrics \(.*extra"):
        read_probe_metrics(odd)


# dv/dv_metrics.json of a ctd eval run as the DV stage wrote it before its records were typed
# (its first run, from the default run, and a second run whose Spearman is undefined).
DV_METRICS_JSON = """{
  "continuous": {
    "target": "continuous",
    "missing_expert": 0,
    "runs": [
      {
        "arch": "attention",
        "seed": 0,
        "target": "continuous",
        "best_epoch": 48,
        "n_train": 128,
        "n_val": 32,
        "test_mse": 0.019384520582849608,
        "test_spearman": 0.7493159603465336,
        "dev_mean_v": -0.040479050246663,
        "test_mean_v": -0.03914379632328651
      },
      {
        "arch": "attention",
        "seed": 1,
        "target": "continuous",
        "best_epoch": 57,
        "n_train": 128,
        "n_val": 32,
        "test_mse": 0.019945558981606895,
        "test_spearman": null,
        "dev_mean_v": -0.04334089938579568,
        "test_mean_v": -0.03979388864261437
      }
    ],
    "mean": {
      "attention": {
        "test_mse": 0.01966503978222825,
        "test_spearman": null
      }
    }
  }
}
"""


def _dv_metrics() -> DVMetrics:
    runs = (
        DVRun("attention", 0, "binary", 48, 128, 32, 0.0194, 0.7493, -0.0405, -0.0391),
        DVRun("linear", 0, "binary", 57, 128, 32, 0.0199, 0.6560, -0.0433, -0.0398),
        DVRun("linear", 1, "binary", 59, 128, 32, 0.0131, 0.8274, -0.0441, -0.0405),
    )
    return DVMetrics("binary", 3, runs, DVMetrics.means(runs))


def test_dv_metrics_round_trip_and_write_the_bytes_the_stage_wrote(tmp_path: Path) -> None:
    metrics = _dv_metrics()
    single = write_json(tmp_path / "dv_metrics.json", metrics.to_json())  # as ctd dv writes it
    assert read_dv_metrics(single) == {"binary": metrics}
    assert list(read_json(single)) == ["target", "missing_expert", "runs", "mean"]
    assert "version" not in read_json(single)  # an unchanged run writes the same bytes as before
    assert metrics.mean["linear"].test_mse == pytest.approx((0.0199 + 0.0131) / 2)
    assert list(metrics.mean) == ["attention", "linear"]  # in the order of the runs

    before = tmp_path / "eval" / "dv_metrics.json"  # as ctd eval writes it: one object per target
    before.parent.mkdir()
    before.write_text(DV_METRICS_JSON)
    by_target = read_dv_metrics(before)
    assert list(by_target) == ["continuous"]
    spearmans = [run.test_spearman for run in by_target["continuous"].runs]
    assert spearmans[0] == 0.7493159603465336 and math.isnan(spearmans[1])  # null is NaN again
    assert math.isnan(by_target["continuous"].mean["attention"].test_spearman)
    recomputed = DVMetrics.means(by_target["continuous"].runs)  # a NaN seed makes the mean NaN
    assert dumps({arch: asdict(means) for arch, means in recomputed.items()}) == dumps(
        read_json(before)["continuous"]["mean"]
    )
    rewritten = write_json(tmp_path / "rewritten.json", dv_metrics_json(by_target))
    assert rewritten.read_bytes() == before.read_bytes()


def test_dv_metrics_of_another_version_or_shape_are_one_line(tmp_path: Path) -> None:
    record = _dv_metrics().to_json()
    same = write_json(tmp_path / "same.json", {"binary": {**record, "version": DVMetrics.VERSION}})
    assert read_dv_metrics(same) == {"binary": _dv_metrics()}
    newer = write_json(tmp_path / "newer.json", {**record, "version": 99})
    with pytest.raises(InputError, match=r"newer\.json: DV metrics version 99, expected 1$"):
        read_dv_metrics(newer)
    misfiled = write_json(tmp_path / "misfiled.json", {"continuous": record})
    with pytest.raises(InputError, match=r"misfiled\.json: the metrics under 'continuous' are of DV target"):
        read_dv_metrics(misfiled)
    unknown = write_json(tmp_path / "unknown.json", {**record, "target": "ternary"})
    with pytest.raises(
        InputError, match=r"unknown\.json: DV target 'ternary': choose from continuous, binary"
    ):
        read_dv_metrics(unknown)
    with pytest.raises(InputError, match=r"empty\.json: no DV metrics"):
        read_dv_metrics(write_json(tmp_path / "empty.json", {}))
    with pytest.raises(InputError, match=r"scalar\.json: not DV metrics \(an object per target"):
        read_dv_metrics(write_json(tmp_path / "scalar.json", {"continuous": 1}))
    record["runs"][0]["extra"] = 1
    odd = write_json(tmp_path / "odd.json", record)
    with pytest.raises(InputError, match=r"odd\.json: not DV metrics \(.*extra"):
        read_dv_metrics(odd)
    del record["mean"]
    with pytest.raises(InputError, match=r"nomean\.json: missing key 'mean'"):
        read_dv_metrics(write_json(tmp_path / "nomean.json", record))


def _bundle_record() -> BundleRecord:
    probe = ProbeSource("probe/probes/attention-seed0", "aa", "bb")
    return BundleRecord(
        version=2,
        run="/runs/t",
        created="2025-01-01T00:00:00Z",
        policy="ctd",
        signal="dv",
        merge="overwrite",
        mode="budget",
        alpha=0.2,
        delta=0.1,
        objective="auroc",
        test_order="est_budget",
        selection="est_objective",
        threshold=0.125,
        arch="attention",
        dv_target="continuous",
        seed=0,
        split_seed=0,
        n_test=240,
        est_budget=0.15,
        est_error=None,
        expert={"name": "smollm2", "base_urls": ["http://127.0.0.1:8080/v1"]},
        ltt={"k": [0, 1], "n_cal": 168},
        candidates=BundleCandidates((math.inf, 0.5, 0.125), (0.0, 0.1, 0.15), (0.8, 0.81, 0.82)),
        sources=BundleSources(ScoresSource("scores.parquet", "cc"), probe, replace(probe, path="dv/x")),
        cal_ids=("a", "b"),
        est_ids=("c",),
    )


def test_a_bundle_record_round_trips_with_the_keys_bundle_json_has_always_had(tmp_path: Path) -> None:
    record = _bundle_record()
    path = write_json(tmp_path / "bundle.json", record.to_json())
    read = read_json(path)
    assert BundleRecord.from_json(read, path) == record
    assert list(read) == [
        *("version", "run", "created", "policy", "signal", "merge", "mode", "alpha", "delta"),
        *("objective", "test_order", "selection", "threshold", "arch", "dv_target", "seed"),
        *("split_seed", "n_test", "est_budget", "est_error", "expert", "ltt", "candidates"),
        *("sources", "cal_ids", "est_ids"),
    ]
    assert read["candidates"]["thresholds"][0] == "inf"  # JSON has no infinity
    assert read["sources"]["safety"] == {
        "path": "probe/probes/attention-seed0",
        "safetensors": "aa",
        "json": "bb",
    }
    assert dumps(BundleRecord.from_json(read, path).to_json()) == dumps(read)


def test_a_bundle_record_of_another_version_or_shape_is_one_line(tmp_path: Path) -> None:
    record = _bundle_record().to_json()
    source = tmp_path / "bundle.json"
    with pytest.raises(InputError, match=r"bundle version 1, expected 2 or 3 \(recalibrate it"):
        BundleRecord.from_json({**record, "version": 1}, source)
    with pytest.raises(InputError, match=r"bundle\.json: missing key 'candidates'"):
        BundleRecord.from_json({k: v for k, v in record.items() if k != "candidates"}, source)
    with pytest.raises(InputError, match=r"bundle\.json: not a bundle record \(.*"):
        BundleRecord.from_json({**record, "sources": {**record["sources"], "dv": {"path": "x"}}}, source)
    with pytest.raises(InputError, match=r"mode 'both' unknown"):
        BundleRecord.from_json({**record, "mode": "both"}, source)


def _joint_record() -> BundleRecord:
    return replace(
        _bundle_record(),
        version=JOINT_BUNDLE_VERSION,
        mode="joint",
        alpha=None,
        levels={"budget": 0.2, "error": 0.15, "fnr": 0.1},
        test_order="est_max_pvalue",
    )


def test_a_joint_bundle_record_is_version_3_with_a_level_per_risk_beside_version_2(tmp_path: Path) -> None:
    record = _joint_record()
    path = write_json(tmp_path / "bundle.json", record.to_json())
    read = read_json(path)
    assert BundleRecord.from_json(read, path) == record
    single = list(_bundle_record().to_json())  # version 2's keys, unchanged
    assert list(read) == [
        *single[: single.index("alpha") + 1],
        "levels",
        *single[single.index("alpha") + 1 :],
    ]
    assert (read["version"], read["alpha"], read["levels"]) == (
        3,
        None,
        {"budget": 0.2, "error": 0.15, "fnr": 0.1},
    )
    assert record.certified_levels == {"budget": 0.2, "error": 0.15, "fnr": 0.1}
    assert _bundle_record().certified_levels == {"budget": 0.2}
    assert replace(_bundle_record(), mode="performance").certified_levels == {"error": 0.2}
    assert dumps(BundleRecord.from_json(read, path).to_json()) == dumps(read)


def test_a_joint_bundle_record_of_the_wrong_shape_is_one_line(tmp_path: Path) -> None:
    joint, single = _joint_record().to_json(), _bundle_record().to_json()
    source = tmp_path / "bundle.json"
    for record, message in (
        ({**single, "mode": "joint"}, r"mode 'joint' in a version 2 bundle"),  # an old reader's shape
        ({**single, "levels": {"budget": 0.2}}, r"mode 'budget' in a version 2 bundle"),
        ({**joint, "mode": "budget"}, r"mode 'budget' in a version 3 bundle"),
        ({**joint, "alpha": 0.2}, r"mode 'joint' in a version 3 bundle .* no `alpha`"),
        ({k: v for k, v in joint.items() if k != "levels"}, r"missing key 'levels'"),
        ({**joint, "levels": {}}, r"levels \{\}: not a mapping of risks to levels"),
        ({**joint, "levels": {"latency": 0.2}}, r"levels: unknown risk 'latency'"),
        ({**joint, "levels": {"budget": 1.2}}, r"levels: budget 1\.2 must lie in \(0, 1\)"),
        ({**joint, "levels": {"error": True}}, r"levels: error True must lie in \(0, 1\)"),
    ):
        with pytest.raises(InputError, match=r"bundle\.json: " + message):
            BundleRecord.from_json(record, source)
