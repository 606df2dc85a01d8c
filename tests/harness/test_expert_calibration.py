"""`--expert-calibration none|contextual|dev` in a run and in a bundle:

- the option: one default (ExpertSettings), in the query stage's fingerprint when it is not none, a
  bad value one line (exit 2) before any work;
- the fit: dev reads the dev split's labels and never the test split's; the calibrated column is
  written from the raw one (writing it again does not calibrate twice), and the stages after the
  query stage read the calibrated one;
- the real query stage on the embedded expert (a llama.cpp server of its own): the content-free
  inputs go through the same client and cache as the examples, so a rerun finds them cached;
- the one-class warning: there for an expert calling ~96% high, gone once it is calibrated;
- a monitor bundle carrying a calibration scores a delegated item with the calibrated answer.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from ctd_cli import assert_one_line_error, run_ctd
from eval_data import eval_env
from fault_server import RunningServer, item_score
from monitor_bundle import write_untrained_bundle

import calibrate
import experts
from harness import ExpertSettings, InputError
from harness.data import load_data, read_json, read_table, scores_from_columns, write_table
from harness.expert import resolve_expert
from harness.monitor import Monitor, read_bundle

# Private: the report's degenerate-score check, on the expert's raw and calibrated scores.
from harness.report._checks import check_scores

# Private: the report's context and its calibration section, given a damaged file.
from harness.report._context import ReportContext
from harness.report._expert_calibration import expert_calibration_section
from harness.run import (
    Manifests,
    QueryLayout,
    Roots,
    RunConfig,
    RunContext,
    RunLayout,
    RunLog,
    StageProgress,
    StageStatus,
)
from harness.stages import QueryStage, ReportStage, cascade_expert_scores, preflight_cache

# Private: the fit and the writer behind the query stage's calibration.
from harness.stages._expert_calibration import (
    content_free_items,
    fit_expert_calibration,
    write_expert_calibration,
)
from probes import ModelInfo


def _context(tmp: Path, **config: object) -> RunContext:
    """The query stage's context for a run of 4 examples per split of the built-in data."""
    roots = Roots(runs=tmp / "runs", store=tmp / "store", cache=tmp / "cache.sqlite")
    layout = roots.run("calibrated")
    return RunContext(
        config=RunConfig(name="calibrated", limit=4, **config),  # type: ignore[arg-type]
        roots=roots,
        layout=layout,
        manifests=Manifests(layout),
        data=load_data(None, limit=4),
        expert=resolve_expert("smollm2", named="the default expert smollm2"),
        model=ModelInfo(identity="unused by the query stage", n_layers=1, config=None),
        progress=StageProgress(enabled=False),
    )


def test_the_option_has_one_default_and_changes_the_query_fingerprint_when_set(tmp_path: Path) -> None:
    assert RunConfig().expert_calibration == ExpertSettings().expert_calibration
    assert RunConfig(expert_calibration="dev").expert_settings.expert_calibration == "dev"
    prints = {
        kind: QueryStage(_context(tmp_path, expert_calibration=kind)).fingerprint()[0]
        for kind in calibrate.EXPERT_CALIBRATIONS
    }
    assert len(set(prints.values())) == 3


def test_a_bad_choice_is_one_line_before_any_work(tmp_path: Path) -> None:
    result = run_ctd("eval", "--expert-calibration", "platt", cwd=tmp_path, env=eval_env(tmp_path))
    assert_one_line_error(result, "--expert-calibration platt", "none, contextual, dev")
    assert not (tmp_path / "runs").exists()


def _query_table() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    split = np.array(["dev"] * 40 + ["test"] * 40)
    label = (rng.random(80) < 0.4).astype(np.int64)
    expert = 1 / (1 + np.exp(-(rng.normal(2.0, 1.0, 80) + label)))  # ~96% above 0.5, as smollm2's
    expert[5] = np.nan  # a failed row
    return {"id": np.array([f"e{i}" for i in range(80)]), "split": split, "label": label, "expert": expert}


def test_the_dev_fit_reads_dev_labels_only() -> None:
    table = _query_table()
    fitted = fit_expert_calibration("dev", table)
    assert fitted == calibrate.fit_logit_shift(table["expert"][:40], table["label"][:40])
    flipped_test = table | {"label": np.concatenate([table["label"][:40], 1 - table["label"][40:]])}
    assert fit_expert_calibration("dev", flipped_test) == fitted  # the test labels are never read
    flipped_dev = table | {"label": np.concatenate([1 - table["label"][:40], table["label"][40:]])}
    assert fit_expert_calibration("dev", flipped_dev).shift != fitted.shift
    assert fit_expert_calibration("none", table) == calibrate.ExpertCalibration()
    with pytest.raises(Exception, match=r"--expert-calibration contextual: .*not scored"):
        fit_expert_calibration("contextual", table)


def test_the_calibrated_column_comes_from_the_raw_one_and_is_what_later_stages_read(tmp_path: Path) -> None:
    layout = QueryLayout(tmp_path / "query")
    layout.root.mkdir()
    table = _query_table()
    write_table(layout.expert_scores, table)
    calibration = fit_expert_calibration("dev", table)
    write_expert_calibration(layout, calibration)
    write_expert_calibration(layout, calibration)  # again: from the raw column, not calibrated twice
    written = read_table(layout.expert_scores).columns
    np.testing.assert_array_equal(written["expert"], table["expert"])  # raw scores stay as answered
    np.testing.assert_allclose(written[QueryLayout.calibrated_column], calibration.apply(table["expert"]))
    assert read_json(layout.expert_calibration) == calibration.to_json()
    read = cascade_expert_scores(layout)
    assert read[("test", "e50")] == pytest.approx(float(calibration.apply(table["expert"][50])))
    assert np.isnan(read[("dev", "e5")])


def _expert_check(expert: np.ndarray, label: np.ndarray) -> calibrate.Scores:
    n = expert.size
    columns = {
        "id": np.array([f"e{i}" for i in range(n)]),
        "group": np.full(n, "g"),
        "split": np.full(n, "test"),
        "label": label,
        "probe": np.linspace(0.01, 0.99, n),
        "expert": expert,
        "dv": np.zeros(n),
        "seed": np.zeros(n, np.int64),
        "arch": np.full(n, "mean"),
    }
    return check_scores(scores_from_columns(columns, "scores"))[0]


def test_the_one_class_warning_is_there_raw_and_gone_once_calibrated() -> None:
    table = _query_table()
    rows = np.isfinite(table["expert"])
    raw, label = table["expert"][rows], table["label"][rows]
    before = _expert_check(raw, label)
    assert before.scorer == "expert" and before.one_class and before.warnings()
    calibration = fit_expert_calibration("dev", table)
    after = _expert_check(calibration.apply(raw), label)
    assert not after.one_class and not after.warnings()
    # Twice calibrated (the broken variant) moves the scores again: not what the run used.
    assert not np.allclose(calibration.apply(calibration.apply(raw)), calibration.apply(raw))


def test_the_query_stage_asks_the_content_free_inputs_through_the_same_cache(tmp_path: Path) -> None:
    """The real embedded expert on its own llama.cpp server: 8 examples and 3 content-free inputs."""
    ctx = _context(tmp_path, expert_calibration="contextual")
    stage = QueryStage(ctx, start_server=ctx.expert.preflight(serve=True), may_serve=True)
    stage.run()
    calibration = calibrate.ExpertCalibration.from_json(read_json(ctx.layout.query.expert_calibration))
    assert calibration.kind == "contextual" and calibration.n == len(calibrate.CONTENT_FREE_INPUTS)
    assert calibration.prior is not None and 0 < calibration.prior < 1
    table = read_table(ctx.layout.query.expert_scores).columns
    np.testing.assert_allclose(table[QueryLayout.calibrated_column], calibration.apply(table["expert"]))
    items = [e.item() for e in stage.examples()] + content_free_items()
    assert preflight_cache(ctx.roots.cache, ctx.expert.spec, items) == 0  # all cached, raw
    # A rerun from the cache (the expert neither checked nor started) finds the same calibration.
    replace(stage, start_server=False, may_serve=False, checked=False).run()
    assert read_json(ctx.layout.query.expert_calibration) == calibration.to_json()


def test_a_bundle_with_a_calibration_scores_a_delegated_item_with_the_calibrated_answer(
    tmp_path: Path,
) -> None:
    calibration = calibrate.ExpertCalibration("dev", shift=-1.5, n=40)
    bundle = write_untrained_bundle(tmp_path / "bundle", threshold=-1e9, expert=True)  # delegates all
    record = json.loads((bundle / "bundle.json").read_text())
    record["expert"]["calibration"] = calibration.to_json()
    (bundle / "bundle.json").write_text(json.dumps(record))
    assert read_bundle(bundle).expert_calibration == calibration

    async def decide(url: str) -> dict:
        monitor = await Monitor.load(bundle, expert_url=url)
        try:
            return (await monitor.check("How do I reset my router?")).to_json()
        finally:
            await monitor.aclose()

    with RunningServer(model="stand-in") as expert:
        decision = asyncio.run(decide(expert.url))
    assert decision["delegated"] and decision["expert"] is not None
    # The stand-in answers P(high) = item_score(-1) for a text naming no item. The decision's
    # expert score is that answer calibrated once (as the run's scores.parquet holds it), and
    # with overwrite the cascade's score is that.
    raw = item_score(-1)
    assert decision["expert"] == pytest.approx(float(calibration.apply(raw)))
    assert decision["score"] == pytest.approx(decision["expert"])
    assert decision["expert"] != pytest.approx(raw)


def test_a_damaged_calibration_file_is_one_line_in_the_report(tmp_path: Path) -> None:
    """The report reads the run's query/expert_calibration.json: a file that is not one is an
    InputError naming it (one line, exit 2 from `ctd`), not a KeyError traceback."""
    run = tmp_path / "run"
    layout = RunLayout(run).query
    layout.root.mkdir(parents=True)
    write_table(layout.expert_scores, _query_table())
    layout.expert_calibration.write_text(json.dumps({"kind": "dev"}))
    ctx = ReportContext(run, tmp_path / "out", None, {}, {}, lambda _line: None)  # type: ignore[arg-type]
    with pytest.raises(InputError) as info:
        expert_calibration_section(ctx)
    message = str(info.value)
    assert (
        message.startswith(f"{layout.expert_calibration}: not an expert calibration") and "\n" not in message
    )


def test_a_template_file_edited_since_the_run_changes_the_query_fingerprint(tmp_path: Path) -> None:
    """The cache keys the template by its content: so does the query stage, or a rerun after an
    edit of the prompt would keep the old prompt's answers (the stage skipped as up to date)."""
    template = tmp_path / "my-template.toml"
    original = (Path(experts.__file__).parent / "prompts" / "fine-v1.toml").read_text()
    template.write_text(original)
    ctx = _context(tmp_path)
    ctx = replace(ctx, expert=replace(ctx.expert, spec=replace(ctx.expert.spec, template=str(template))))
    before = QueryStage(ctx).fingerprint()[0]
    assert QueryStage(ctx).fingerprint()[0] == before
    template.write_text(original.replace("Is everything fine here?", "Is anything wrong here?"))
    assert QueryStage(ctx).fingerprint()[0] != before


def test_the_report_is_built_again_when_the_dollars_or_the_config_it_shows_change(tmp_path: Path) -> None:
    """The report prints run.json's dollars and the run's config: a query stage that paid for
    answers again (`--retry-failed`), or another option, must not leave it up to date."""
    ctx = _context(tmp_path)
    ctx.layout.root.mkdir(parents=True)
    log = RunLog()
    log.started({})
    log.record("query", StageStatus.RAN, 1.0, "", 19.924)
    log.write(ctx.layout.run_log)
    before = ReportStage(ctx).fingerprint()[0]
    assert ReportStage(ctx).fingerprint()[0] == before
    log.record("query", StageStatus.RAN, 1.0, "", 0.503)  # three answers paid for again
    log.write(ctx.layout.run_log)
    paid = ReportStage(ctx).fingerprint()[0]
    assert paid != before
    assert ReportStage(replace(ctx, config=replace(ctx.config, max_failed=0.2))).fingerprint()[0] != paid
