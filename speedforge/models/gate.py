"""The promotion gate: does a new checkpoint replace the champion?

    verdict = judge(new_eval, champion_eval, GateConfig())
    verdict.promote, verdict.reason, verdict.figures

Both models took the same held-out check (tasks, samples, seeds, pool). The metrics decide in the
order `gate.metrics` names them (default: correct fraction, then median speedup). For each, the new
model's lead over the champion (a difference for a fraction, a ratio for the median speedup) gets a
bootstrap interval: each model's samples are resampled within each task, `resamples` times, with a
seeded generator. The lead is

- better when the interval's low end is above the threshold (fractions: `fraction_margin`;
  median speedup: 1 + `speedup_margin`): promote, this metric decides;
- worse when its high end is below no change (0, or a ratio of 1): refuse, this metric decides;
- undecided otherwise (or n/a: a median speedup with no correct sample): the next metric decides.

When no metric decides, the champion stays. A new model whose check measured nothing (no sample,
or only infrastructure failures), or that took another check than the champion's, is refused.
With no champion, the first model that measured something is promoted.
"""

from __future__ import annotations

import dataclasses
import random

from speedforge.config import GateConfig
from speedforge.models.records import METRICS as METRIC_FUNCTIONS
from speedforge.models.records import Figure, HeldoutEval, Samples
from speedforge.stats import quantile

METRICS = tuple(METRIC_FUNCTIONS)
RATIO_METRICS = ("median_speedup",)  # compared as new / champion; the others as new - champion


@dataclasses.dataclass(frozen=True)
class Verdict:
    promote: bool
    reason: str  # one line
    figures: tuple[Figure, ...] = ()


def judge(new: HeldoutEval | None, champion: HeldoutEval | None, gate: GateConfig) -> Verdict:
    """The gate's verdict on `new` against `champion` (None: there is none); see the module docstring."""
    if new is None or new.infra_failed:
        return Verdict(
            False, "the new model's held-out check measured nothing (failed or only infra_error): the champion stays"
        )
    if champion is None:
        return Verdict(True, f"no champion yet: the first model that was checked ({_summary(new)})")
    differs = new.same_check(champion)
    if differs:
        return Verdict(False, f"not the champion's held-out check ({differs}): the champion stays")
    figures = []
    for metric in gate.metrics:
        figure = compare(metric, new, champion, gate)
        figures.append(figure)
        if figure.verdict == "better":
            return Verdict(True, f"{_say(figure)}: better than the champion by more than the margin", tuple(figures))
        if figure.verdict == "worse":
            return Verdict(False, f"{_say(figure)}: worse than the champion: the champion stays", tuple(figures))
    said = "; ".join(_say(f) for f in figures)
    return Verdict(False, f"not better by the margin on any metric ({said}): the champion stays", tuple(figures))


def compare(metric: str, new: HeldoutEval, champion: HeldoutEval, gate: GateConfig) -> Figure:
    """One metric's figure: both values, the lead, its interval and what it says."""
    if metric not in METRIC_FUNCTIONS:
        raise ValueError(f"unknown gate metric {metric!r}; known: {', '.join(METRICS)}")
    fn = METRIC_FUNCTIONS[metric]
    ratio = metric in RATIO_METRICS
    a, b = fn(_flat(new)), fn(_flat(champion))
    threshold = 1.0 + gate.speedup_margin if ratio else gate.fraction_margin
    if a is None or b is None:
        return Figure(metric, a, b, None, None, None, threshold, "n/a")
    lead = _lead(a, b, ratio)
    rng = random.Random(gate.seed)
    leads = []
    for _ in range(gate.resamples):
        x, y = fn(_resample(new, rng)), fn(_resample(champion, rng))
        if x is not None and y is not None:
            leads.append(_lead(x, y, ratio))
    if len(leads) < gate.resamples / 2:  # most resamples had no correct sample: no interval to speak of
        return Figure(metric, a, b, lead, None, None, threshold, "undecided")
    tail = (1 - gate.confidence) / 2
    lo, hi = quantile(leads, tail), quantile(leads, 1 - tail)
    none = 1.0 if ratio else 0.0
    verdict = "better" if lo > threshold else "worse" if hi < none else "undecided"
    return Figure(metric, a, b, lead, lo, hi, threshold, verdict)


def _lead(a: float, b: float, ratio: bool) -> float:
    return a / b if ratio else a - b


def _flat(evaluation: HeldoutEval) -> Samples:
    return list(zip(evaluation.statuses, evaluation.speedups))


def _resample(evaluation: HeldoutEval, rng: random.Random) -> Samples:
    """Each task's samples drawn again with replacement (the tasks stay as they are)."""
    return [rng.choice(samples) for samples in evaluation.by_task() for _ in samples]


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _say(figure: Figure) -> str:
    if figure.lead is None:
        return f"{figure.metric} {_fmt(figure.new)} vs {_fmt(figure.champion)}"
    ratio = figure.metric in RATIO_METRICS
    lead = f"x{figure.lead:.3g}" if ratio else f"{figure.lead:+.3g}"
    interval = f" [{_fmt(figure.lo)}, {_fmt(figure.hi)}]" if figure.lo is not None else ""
    return (
        f"{figure.metric} {_fmt(figure.new)} vs {_fmt(figure.champion)}: lead {lead}{interval}, "
        f"needs > {_fmt(figure.threshold)}"
    )


def _summary(evaluation: HeldoutEval) -> str:
    return ", ".join(f"{k} {_fmt(v)}" for k, v in evaluation.summary().items() if k not in ("pool", "samples"))
