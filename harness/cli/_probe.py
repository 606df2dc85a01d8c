"""`ctd probe` and `ctd dv`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from calibrate import DV_TARGETS, DVTarget
from probes import ARCHS, ProbeConfig

from .._bounds import LIMITS
from .._errors import InputError
from ..data import check_writable_folder, load_data
from ..run import ProbeLayout, ProbeSettings, Roots, StageProgress
from ._common import clean_errors, parse_names, parse_seeds, print_json, stdout

# The commands' defaults are the probe section's own: one place for each.
_PROBE = ProbeSettings()

DataOption = Annotated[
    list[str] | None,
    typer.Option(
        "--data",
        help=(
            "Data spec: 'train=PATH dev=GROUP:PATH,... test=GROUP:PATH,...' (one option or several). "
            "Without test=, each dev file is cut into dev and test halves. Default: the built-in set."
        ),
    ),
]


def probe_command(
    *,
    data: DataOption = None,
    out: Annotated[Path, typer.Option("--out", help="Output folder of the stage.")],
    limit: Annotated[
        int | None,
        typer.Option("--limit", help="At most N examples per split, stratified by group and label."),
    ] = None,
    model: Annotated[
        str, typer.Option("--model", help="'smollm2' (embedded), a .gguf file, a model folder or a hub id.")
    ] = _PROBE.model,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub revision.")] = None,
    layer: Annotated[
        int | None,
        typer.Option(
            "--layer", help="hidden_states index (default: 11 for Llama-3.2-1B, else 2/3 of depth)."
        ),
    ] = None,
    max_tokens: Annotated[
        int,
        typer.Option("--max-tokens", min=1, max=LIMITS["--max-tokens"], help="Token limit per conversation."),
    ] = _PROBE.max_tokens,
    batch_tokens: Annotated[
        int,
        typer.Option("--batch-tokens", min=1, max=LIMITS["--batch-tokens"], help="Padded tokens per batch."),
    ] = _PROBE.batch_tokens,
    arch: Annotated[str, typer.Option("--arch", help=f"Probe architectures: {', '.join(ARCHS)}.")] = ",".join(
        _PROBE.archs
    ),
    seeds: Annotated[str, typer.Option("--seeds", help="Probe training seeds.")] = ",".join(
        map(str, _PROBE.seeds)
    ),
    epochs: Annotated[
        int, typer.Option("--epochs", min=1, max=LIMITS["--epochs"], help="Maximum training epochs.")
    ] = _PROBE.training.epochs,
    store: Annotated[
        Path | None,
        typer.Option("--store", help="Activation store (default: $CTD_STORE or runs/cache/activations)."),
    ] = None,
    device_map: Annotated[
        str | None, typer.Option("--device-map", help="'auto' for multi-GPU models.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the metrics as one JSON object.")] = False,
) -> None:
    """Extract activations, train the safety probe on train, and score dev and test."""
    # torch loads only for the commands that train probes
    from ..stages import probe_stage

    # A bad --out found before the model loads, not after extraction and training.
    check_writable_folder(out, "--out")
    splits = load_data(data, limit=limit)
    settings = ProbeSettings(
        model=model,
        revision=revision,
        layer=layer,
        max_tokens=max_tokens,
        batch_tokens=batch_tokens,
        device_map=device_map,
        archs=parse_names(arch, "--arch", ARCHS),
        seeds=parse_seeds(seeds, "--seeds"),
        training=ProbeConfig(epochs=epochs),
    )
    with StageProgress(enabled=not json_out) as progress:
        result = probe_stage(
            splits, settings, out, store_root=store or Roots.resolve().store, progress=progress
        )
    if result is None:  # a non-main process of `accelerate launch`: it only extracted
        return
    if json_out:
        print_json(result.metrics.to_json())
        return
    table = Table(title=f"safety probes, layer {result.layer}")
    for column in ("arch", "dev AUROC", "dev acc", "test AUROC", "test acc"):
        table.add_column(column)
    for arch_name, means in result.metrics.mean.items():
        shown_means = (means.dev_auroc, means.dev_accuracy, means.test_auroc, means.test_accuracy)
        table.add_row(arch_name, *(f"{m:.3f}" if m is not None else "-" for m in shown_means))
    stdout.print(table)
    stdout.print(f"scores: {result.scores}")


def dv_command(
    *,
    probe_dir: Annotated[Path, typer.Option("--probe-dir", help="Output folder of `ctd probe`.")],
    expert_scores: Annotated[
        list[str],
        typer.Option(
            "--expert-scores",
            help=(
                "Tables from `ctd query` (id, expert); repeatable. GROUP:PATH reads the table's ids as "
                "GROUP/ID, as `ctd probe` names them where ids repeat across the groups of a split."
            ),
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="The scores table to write (.parquet or .csv).")],
    target: Annotated[
        DVTarget, typer.Option("--target", help="DV target: v or the binary variant.")
    ] = DV_TARGETS[0],
    epochs: Annotated[
        int, typer.Option("--epochs", min=1, max=LIMITS["--epochs"], help="Maximum training epochs.")
    ] = _PROBE.training.epochs,
    json_out: Annotated[bool, typer.Option("--json", help="Print the metrics as one JSON object.")] = False,
) -> None:
    """Train the DV probe on dev (targets from probe and expert scores) and score test."""
    # torch loads only for the commands that train probes
    from ..data import check_writable
    from ..stages import dv_stage, expert_for_probe, read_expert_scores

    groups, paths = zip(*map(_grouped_table, expert_scores), strict=True) if expert_scores else ((), ())
    check_writable(out, "--out", inputs=[("--expert-scores", path) for path in paths])
    by_id = read_expert_scores(paths, groups)
    probe_scores = ProbeLayout(probe_dir).scores
    if not probe_scores.is_file():
        raise InputError(
            f"--probe-dir {probe_dir}: not an output folder of `ctd probe` (no {probe_scores.name})"
        )
    expert = expert_for_probe(probe_dir, by_id)
    with StageProgress(enabled=not json_out) as progress:
        result = dv_stage(
            probe_dir, expert, out, target=target, training=ProbeConfig(epochs=epochs), progress=progress
        )
    if json_out:
        print_json(result.metrics.to_json())
        return
    for arch_name, means in result.metrics.mean.items():
        stdout.print(f"{arch_name}: DV test MSE {means.test_mse:.4f}, Spearman {means.test_spearman:.3f}")
    if result.missing_expert:
        stdout.print(f"left out {result.missing_expert} examples the expert failed on")
    stdout.print(f"scores: {result.scores}")


_GROUPED = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*):(.+)")  # the data spec's GROUP:PATH


def _grouped_table(value: str) -> tuple[str | None, Path]:
    """An --expert-scores value as (group, path): GROUP:PATH as in the data spec, unless the whole
    value names an existing file (a path may hold a colon)."""
    match = _GROUPED.fullmatch(value)
    if match is None or Path(value).exists():
        return None, Path(value)
    return match[1], Path(match[2])


def register(app: typer.Typer) -> None:
    app.command("probe")(clean_errors(probe_command))
    app.command("dv")(clean_errors(dv_command))
