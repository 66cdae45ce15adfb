"""The in-context search loop: rounds of sample -> evaluate -> add to variants, no weight updates.

Each round draws exemplars from the task's successful variants (score buckets, softmax over
bucket means), renders the contrastive prompt with the last failure's log, asks the backend
for samples, parses each, evaluates the candidates and adds them to the variants table. Every
sample is accounted for: a response without code is still evaluated (the evaluator says why it
fails), and a request the backend could not answer is a failed sample, never a crashed loop.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import time
from collections.abc import Callable

from speedforge.config import PolicyConfig, SearchConfig
from speedforge.evaluation import BatchEvaluate
from speedforge.policy.backends import Backend
from speedforge.policy.exemplars import sample_exemplars
from speedforge.policy.parser import candidate_from
from speedforge.policy.prompts import (
    Feedback,
    exemplars_from_variants,
    feedback_from_result,
    render_prompt,
)
from speedforge.records import Candidate, EvalResult, Task, Variant
from speedforge.variants import VariantsTable, make_variant

BACKEND_ERROR = "backend_error"  # status of a sample the backend could not produce


@dataclasses.dataclass(frozen=True)
class Sample:
    """What became of one sample: its candidate's status, or why the backend produced none."""

    round: int
    candidate_id: str  # "" when the backend failed
    status: str  # an EvalResult status, or "backend_error"
    reason: str = ""
    speedup: float | None = None
    missing: tuple[str, ...] = ()  # what the parser could not find in the response
    completion_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class RoundStats:
    """One row of the live table."""

    round: int
    samples: int
    valid: int  # samples whose candidate passed (status ok)
    round_best: float | None  # best speedup among this round's valid samples
    best: float | None  # best speedup of the task on the pool so far, earlier variants included
    statuses: dict[str, int]  # sample count per status
    seconds: float

    @property
    def valid_fraction(self) -> float:
        return self.valid / self.samples if self.samples else 0.0


@dataclasses.dataclass
class SearchResult:
    task_id: str
    pool: str
    rounds: list[RoundStats]
    samples: list[Sample]
    best: Variant | None

    @property
    def backend_failed_everything(self) -> bool:
        return bool(self.samples) and all(s.status == BACKEND_ERROR for s in self.samples)


def _guarded_evaluate(evaluate: BatchEvaluate, task: Task, candidates: list[Candidate], pool: str):
    """Results for every candidate; an evaluation service that fails becomes infra_error results."""
    if not candidates:
        return []
    try:
        results = list(evaluate(candidates))
        if len(results) != len(candidates):
            raise RuntimeError(f"{len(results)} results for {len(candidates)} candidates")
    except Exception as exc:  # the loop must survive an evaluation service outage
        reason = f"evaluation failed: {type(exc).__name__}: {exc}"
        return [
            EvalResult(
                candidate_id=c.candidate_id, task_id=task.task_id, pool=pool, status="infra_error", reason=reason
            )
            for c in candidates
        ]
    by_id = {r.candidate_id: r for r in results}
    return [by_id.get(c.candidate_id) or results[i] for i, c in enumerate(candidates)]


def run_search(
    task: Task,
    backend: Backend,
    evaluate: BatchEvaluate,
    variants: VariantsTable,
    policy: PolicyConfig,
    search: SearchConfig,
    pool: str,
    store=None,
    on_round: Callable[[RoundStats], None] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> SearchResult:
    """Run `search.rounds` rounds of `search.samples` samples on one task, each round's new
    candidates measured as one batch by `evaluate` (speedforge.evaluation); returns what happened."""
    rng = random.Random(search.seed)
    progress = on_progress or (lambda message: None)
    devices: dict[str, str] = {}  # variant id -> device name it was measured on
    feedback: Feedback | None = None
    all_samples: list[Sample] = []
    rounds: list[RoundStats] = []
    for round_index in range(1, search.rounds + 1):
        started = time.monotonic()
        origin = f"model:{backend.model_name}@round{round_index}"
        parents = variants.successful(task.task_id, pool)
        prompts = collections.Counter()
        for _ in range(search.samples):
            chosen = sample_exemplars(parents, policy.exemplars, policy.tau, policy.buckets, rng)
            chosen.sort(key=lambda v: (v.score, v.variant_id))
            prompts[render_prompt(task, exemplars_from_variants(chosen, devices), feedback)] += 1

        samples: list[Sample] = []
        pending: list[tuple[Candidate, str, int, tuple[str, ...]]] = []  # candidate, analysis, tokens, missing
        for group, (prompt, count) in enumerate(prompts.items()):
            progress(f"round {round_index}: generating {count} sample(s) with {backend.model_name}")
            seed = search.seed * 1_000_003 + round_index * 1_000 + group
            try:
                generations = backend.generate(prompt.messages(), count, seed=seed)
            except Exception as exc:  # endpoint down, garbage answer, model error: failed samples
                reason = f"{type(exc).__name__}: {exc}"
                samples.extend(Sample(round_index, "", BACKEND_ERROR, reason) for _ in range(count))
                continue
            for generation in generations:
                candidate, parsed = candidate_from(
                    task,
                    generation.text,
                    origin,
                    prompt.exemplar_ids,
                    finish_reason=generation.finish_reason,
                    completion_tokens=generation.completion_tokens,
                )
                pending.append((candidate, parsed.analysis, generation.completion_tokens, parsed.missing))

        # Evaluate each new candidate once; a candidate already measured on this pool keeps its result.
        fresh = {c.candidate_id: c for c, *_ in pending if (c.candidate_id, pool) not in variants}
        progress(f"round {round_index}: evaluating {len(fresh)} candidate(s) on pool {pool}")
        results = dict(zip(fresh, _guarded_evaluate(evaluate, task, list(fresh.values()), pool)))
        new_variants: list[Variant] = []
        for candidate, analysis, tokens, missing in pending:
            result = results.get(candidate.candidate_id)
            if result is not None and candidate.candidate_id in fresh:
                variant = make_variant(candidate, result, analysis)
                variants.add(variant)
                new_variants.append(variant)
                devices[variant.variant_id] = result.device_name or pool
                del fresh[candidate.candidate_id]
                if not result.ok:
                    feedback = feedback_from_result(result, policy.feedback_log_chars)
            variant = variants.get(candidate.candidate_id, pool)
            reason = result.reason if result is not None else "duplicate of an earlier variant"
            samples.append(
                Sample(round_index, candidate.candidate_id, variant.status, reason, variant.score, missing, tokens)
            )
        if store is not None and new_variants:
            VariantsTable.append(store, new_variants)

        valid = [s for s in samples if s.status == "ok"]
        best = variants.best(task.task_id, pool)
        stats = RoundStats(
            round=round_index,
            samples=len(samples),
            valid=len(valid),
            round_best=max((s.speedup for s in valid if s.speedup is not None), default=None),
            best=best.score if best else None,
            statuses=dict(collections.Counter(s.status for s in samples)),
            seconds=time.monotonic() - started,
        )
        rounds.append(stats)
        all_samples.extend(samples)
        if on_round:
            on_round(stats)
    return SearchResult(task.task_id, pool, rounds, all_samples, variants.best(task.task_id, pool))
