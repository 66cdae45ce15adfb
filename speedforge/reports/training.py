"""Training runs for people reading a terminal: a row per step as a stage goes, and the
status of a run (its stages, then its steps)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from speedforge.reports.text import cell, format_table

STEP_COLUMNS = (
    "stage",
    "step",
    "reward mean",
    "reward max",
    "valid",
    "compiled",
    "speedup p50",
    "speedup max",
    "loss",
    "gen s",
    "eval s",
    "update s",
)
STEP_WIDTHS = (5, 4, 11, 10, 5, 8, 11, 11, 7, 6, 6, 8)


def step_row(record: dict[str, Any]) -> list[object]:
    """A metrics line as a row of STEP_COLUMNS (a self-training round shows as `r<N>`)."""
    step = f"r{record['step']}" if record.get("kind") == "round" else record.get("step")
    fraction = lambda key: f"{record[key]:.0%}" if record.get(key) is not None else None  # noqa: E731
    return [
        record.get("stage"),
        step,
        record.get("reward_mean"),
        record.get("reward_max"),
        fraction("valid_fraction"),
        fraction("compiled_fraction"),
        record.get("speedup_p50"),
        record.get("speedup_max"),
        record.get("loss"),
        record.get("generation_s"),
        record.get("evaluation_s"),
        record.get("update_s"),
    ]


def steps_table(metrics: Sequence[dict[str, Any]]) -> str:
    return format_table(STEP_COLUMNS, [step_row(m) for m in metrics if m.get("kind") != "data"])


def data_line(record: dict[str, Any]) -> str:
    """A stage's data line (kind "data"): SFT's pairs and what was left out."""
    validated = ", ".join(
        f"{k.removeprefix('validated_')} {v}" for k, v in record.items() if k.startswith("validated_")
    )
    return (
        f"{record.get('stage')} data: {record.get('pairs')} pair(s) of {record.get('tasks')} task(s)"
        f"{f' (validated: {validated})' if validated else ''}; {record.get('fewer_exemplars', 0)} with fewer "
        f"exemplars and {record.get('dropped_too_long', 0)} dropped as longer than {record.get('max_length')} "
        f"tokens; {record.get('dropped_unwritable', 0)} answer(s) left out as longer than the "
        f"{record.get('max_answer_tokens')} tokens the policy writes and {record.get('dropped_unusable', 0)} as "
        "unusable (parser, screen, constructor, precision or kept outputs: data.json names each)"
    )


def stages_table(states: dict[str, dict]) -> str:
    rows = [
        [
            stage,
            s.get("status"),
            s.get("step"),
            s.get("checkpoint") or None,
            s.get("final") or None,
            s.get("reason") or None,
        ]
        for stage, s in states.items()
    ]
    return format_table(["stage", "status", "step", "checkpoint", "final", "reason"], rows)


class TrainPrinter:
    """Prints a stage as it goes: what runs where, then one row per metrics line."""

    def __init__(self) -> None:
        self.rows = 0

    def starting(self, plan) -> None:
        train = plan.config.train
        resumed = f", resuming at step {plan.saved.get('step', 0)}" if plan.resume and plan.saved else ""
        ids = [t.task_id for t in plan.split.train]
        shown = ", ".join(ids[:6]) + (f", ... {len(ids) - 6} more" if len(ids) > 6 else "")
        print(
            f"run {train.run}: stage {plan.stage} on {len(plan.split.train)} task(s) "
            f"({shown}), held out {len(plan.split.heldout)}; "
            f"pool {plan.pool}, {train.evaluation} evaluation, {train.ray.workers} Ray Train worker(s), "
            f"model {plan.init_model or 'default (SmolLM2-135M-Instruct)'}{resumed}",
            flush=True,
        )
        print(f"  state: {plan.state.describe()}", flush=True)

    def message(self, text: str) -> None:
        print(f"  .. {text}", file=sys.stderr, flush=True)

    def metrics(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "data":
            print(f"  {data_line(record)}", flush=True)
            return
        if self.rows == 0:
            print("  ".join(c.ljust(w) for c, w in zip(STEP_COLUMNS, STEP_WIDTHS)).rstrip(), flush=True)
        print("  ".join(cell(v).ljust(w) for v, w in zip(step_row(record), STEP_WIDTHS)).rstrip(), flush=True)
        self.rows += 1
