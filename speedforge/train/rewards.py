"""Reward functions, registered by name, computed from evaluation results alone.

    rewards = total_rewards(samples, config.train.rewards)   # the weighted sum the trainer uses

A reward function takes the samples of one step (`Sample`: the EvalResult, its group, what the
answer parser missed) and returns one float per sample:

    speedup      the measured speedup, clipped to max_speedup
    log_speedup  ln(speedup), clipped to +- ln(max_speedup)
    auc          the ann family's AUC ratio over the baseline, minus 1 (clipped like speedup)
    cudal1       CUDA-L1's: speedup gated by correctness (0 when not ok, minus rejected_penalty
                 for a cheat), clipped to max_speedup
    format       the fraction of the answer's three sections and its code that were found
    graded       correctness before speed: credit for the furthest stage the sample reached (GRADES:
                 no program 0 < screened < compiled < ran < correct), plus `graded.speed` times the
                 speedup once correct, so that in a group where nothing is correct a sample that
                 compiled still scores above one that did not; a cheat `rejected_penalty` below 0

Every status has a reward: a failure `failed_penalty` below the lowest correct score, a cheat
(hack_detected, an exploit rule of the screen) `rejected_penalty` below it, an unstable result's
speedup pulled towards 1 (1 + (s - 1) * unstable_discount); an infra_error raises MissingReward.
The graded reward replaces failed_penalty by its credits.
None normalises: TRL does, once per group (docs/concepts/training.md). This module imports only
the standard library, the records and the registry helper.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from speedforge.records import EvalResult
from speedforge.registry import Registry

if TYPE_CHECKING:
    from speedforge.config import RewardConfig

UNSCORED = ("infra_error",)  # no reward: measured again, or the step stops
# The stages a sample can reach, lowest first, each from the statuses that stop there (a cheat
# reaches none: `cheated`). A status is the evaluator's verdict, so a grade needs no trust in the
# candidate; `compiled` is as the metrics count it (NOT_COMPILED: refused, or compile_error).
GRADES = {
    "no_program": ("screen_rejected",),  # the screen found no program (NOT_A_PROGRAM rules)
    "screened": ("compile_error",),  # a program the screen let through, which did not build
    "compiled": ("runtime_error", "timeout", "crashed"),  # built, failed when run
    "ran": ("incorrect",),  # ran to the end, with outputs that differ from the reference's
    "correct": ("ok",),  # correct and timed
}
NOT_A_PROGRAM = ("not-python", "no-model-new")  # screen rules that refuse an answer, not a trick
_RULE = re.compile(r"\[([a-z][a-z0-9-]*)\]")


class MissingReward(RuntimeError):
    """A sample whose result says nothing about the candidate (infra_error): it has no reward."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """What a reward function sees of one sample."""

    result: EvalResult
    group: str = ""  # the samples of one prompt in one step share it
    missing: tuple[str, ...] = ()  # answer sections and/or "code" the parser did not find


RewardFn = Callable[[Sequence[Sample], "RewardConfig"], list[float]]
REWARDS: Registry[RewardFn] = Registry("reward")
register_reward = REWARDS.register  # `f(samples, config) -> one reward per sample` under a name
known_rewards = REWARDS.names
reward_fn = REWARDS.get
FORMAT_PARTS = 4  # the three sections and the code


def rewards_by_name(samples: Sequence[Sample], config: "RewardConfig") -> dict[str, list[float]]:
    """Each weighted reward function's values for `samples`."""
    return {name: [float(v) for v in reward_fn(name)(samples, config)] for name in config.weights}


def total_rewards(samples: Sequence[Sample], config: "RewardConfig") -> list[float]:
    """The weighted sum of the configured reward functions, one per sample."""
    parts = rewards_by_name(samples, config)
    return [sum(config.weights[name] * parts[name][i] for name in parts) for i in range(len(samples))]


def effective_speedup(result: EvalResult, config: "RewardConfig") -> float:
    """The speedup an ok result counts with: discounted when unstable, clipped to (0, max_speedup]."""
    check_scored(result)
    if result.speedup is None or not math.isfinite(result.speedup) or result.speedup <= 0:
        raise MissingReward(f"{result.candidate_id}: an ok result without a positive speedup ({result.speedup})")
    speedup = result.speedup
    if result.unstable:
        speedup = 1.0 + (speedup - 1.0) * config.unstable_discount
    return min(max(speedup, 1e-6), config.max_speedup)


def check_scored(result: EvalResult) -> None:
    """MissingReward for a result that has no reward (infra_error)."""
    if result.status in UNSCORED:
        raise MissingReward(
            f"{result.candidate_id} on {result.pool}: {result.status} ({result.reason or 'no reason'}) "
            "says nothing about the candidate; it must be measured again, not scored"
        )


def cheated(result: EvalResult) -> bool:
    """hack_detected, or screen_rejected by a rule that names an exploit (the reason ends with
    the rule id in brackets, speedforge.evaluator.screen)."""
    if result.status == "hack_detected":
        return True
    if result.status != "screen_rejected":
        return False
    rule = _RULE.search(result.reason)
    return not (rule and rule.group(1) in NOT_A_PROGRAM)


def per_result(
    samples: Sequence[Sample], config: "RewardConfig", score: Callable[[float], float], lowest: float
) -> list[float]:
    """`score(effective speedup)` for ok results; failures `lowest` minus their penalty."""
    out = []
    for sample in samples:
        result = sample.result
        check_scored(result)
        if result.ok:
            out.append(score(effective_speedup(result, config)))
        elif cheated(result):
            out.append(lowest - config.rejected_penalty)
        else:
            out.append(lowest - config.failed_penalty)
    return out


@register_reward("speedup")
def speedup_reward(samples: Sequence[Sample], config: "RewardConfig") -> list[float]:
    return per_result(samples, config, lambda s: s, lowest=0.0)


@register_reward("log_speedup")
def log_speedup_reward(samples: Sequence[Sample], config: "RewardConfig") -> list[float]:
    bound = math.log(config.max_speedup)
    return per_result(samples, config, lambda s: min(max(math.log(s), -bound), bound), lowest=-bound)


@register_reward("auc")
def auc_reward(samples: Sequence[Sample], config: "RewardConfig") -> list[float]:
    # the ann family's evaluator reports the AUC ratio over the baseline in `speedup`
    return per_result(samples, config, lambda ratio: ratio - 1.0, lowest=-1.0)


@register_reward("cudal1")
def cudal1_reward(samples: Sequence[Sample], config: "RewardConfig") -> list[float]:
    out = []
    for sample in samples:
        result = sample.result
        check_scored(result)
        if result.ok:
            out.append(effective_speedup(result, config))
        elif cheated(result):
            out.append(-config.rejected_penalty)
        else:
            out.append(0.0)
    return out


@register_reward("format")
def format_reward(samples: Sequence[Sample], config: "RewardConfig") -> list[float]:
    for sample in samples:
        check_scored(sample.result)
    return [1.0 - min(len(sample.missing), FORMAT_PARTS) / FORMAT_PARTS for sample in samples]


def grade(result: EvalResult) -> str | None:
    """The furthest stage (a GRADES key) `result` reached; None for a cheat."""
    check_scored(result)
    if cheated(result):
        return None
    return next(name for name, statuses in GRADES.items() if result.status in statuses)


@register_reward("graded")
def graded_reward(samples: Sequence[Sample], config: "RewardConfig") -> list[float]:
    credit = config.graded
    out = []
    for sample in samples:
        reached = grade(sample.result)
        if reached is None:
            out.append(-config.rejected_penalty)
        elif reached == "correct":
            out.append(credit.correct + credit.speed * effective_speedup(sample.result, config))
        else:
            out.append(0.0 if reached == "no_program" else getattr(credit, reached))
    return out
