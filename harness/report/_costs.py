"""The report's line on money: what the run's expert answers cost, from run.json."""

from __future__ import annotations

from ..run import RunLayout, RunLog, RunLogError
from ._context import ReportContext

__all__ = ["cost_section"]


def cost_section(ctx: ReportContext) -> None:
    """Dollars spent per stage over every invocation of the run (the token counts the endpoint
    reported times the expert's price; answers read from the cache cost nothing), into the
    Markdown and numbers.json. A run.json that cannot be read is said, not fatal."""
    try:
        costs = RunLog.read(RunLayout(ctx.run_dir).run_log).costs()
    except RunLogError as error:
        ctx.note(f"the dollars spent: {error}")
        return
    ctx.numbers["cost_usd"] = costs
    if not costs:
        return
    total = sum(costs.values())
    per_stage = ", ".join(f"{stage} ${usd:.4f}" for stage, usd in costs.items())
    ctx.lines += [
        f"**Cost**: ${total:.4f} at the expert ({per_stage}), over every invocation of the run: the "
        "token counts the endpoint reported times the expert's prices (answers from the cache cost "
        "nothing).",
        "",
    ]
