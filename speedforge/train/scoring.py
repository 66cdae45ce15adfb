"""A step's completions -> candidates -> one evaluation batch -> rewards, rollouts and variants.

    scorer = Scorer(config, tasks, evaluate, pool, stage="grpo", store=store, variants=live)
    scored = scorer.score(step, completions)     # rewards in order; rollouts and variants written
    scored = scorer.score(step, completions, policy_steps=step - 2)   # generated a step ahead (lookahead)

Invariants, enforced in `score`:

- every completion is evaluated (a response without code too: the evaluator says why it fails),
  each distinct candidate once per step, all of them in one batch;
- no reward is computed from a missing result: an evaluation that raises, returns too few
  results or returns infra_error is tried again (`train.eval_retries` times, waiting
  `train.eval_retry_wait_s`, doubling); if results are still missing, RewardsUnavailable is
  raised and nothing of the step is written, so the trainer stops before the update and the
  run resumes from its last checkpoint;
- an unstable result is measured again first when `rewards.unstable` is `remeasure`;
- the step's rollouts are written as one part, after all its rewards are known; its successful
  candidates are added to the variants table (and the store's), so later prompts draw them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence

from speedforge.config import Config
from speedforge.errors import first_line
from speedforge.evaluation import BatchEvaluate
from speedforge.policy.parser import candidate_from
from speedforge.records import Candidate, EvalResult, Rollout, Task, content_id
from speedforge.variants import VariantsTable, make_variant
from speedforge.train.rewards import UNSCORED, Sample, rewards_by_name
from speedforge.train.rollouts import RolloutsTable, make_rollout


class RewardsUnavailable(RuntimeError):
    """The evaluation of a step failed after every retry: the step must not train."""


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sample to score: the prompt it answered and what the policy wrote."""

    task_id: str
    prompt: str  # the user message
    text: str
    group_id: str  # the samples of one prompt in one step
    parent_ids: tuple[str, ...] = ()  # the variants the prompt showed


@dataclasses.dataclass(frozen=True)
class ScoredStep:
    rewards: list[float]  # the weighted sum, one per completion, in order
    rollouts: list[Rollout]
    new_variants: int  # successful candidates added to the variants table
    evaluation_s: float  # wall time of the evaluation batch(es), retries included
    attempts: int  # evaluation calls made (1 when nothing was retried)


def evaluate_with_retries(
    candidates: Sequence[Candidate],
    evaluate: BatchEvaluate,
    retries: int,
    wait_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[dict[str, EvalResult], int]:
    """A scored result (any status but infra_error) for every candidate, and the calls it took;
    RewardsUnavailable when some candidate has none after `retries` further attempts."""
    pending = list({c.candidate_id: c for c in candidates}.values())
    results: dict[str, EvalResult] = {}
    problem = ""
    attempts = 0
    for attempt in range(retries + 1):
        if attempt:
            sleep(wait_s * 2 ** (attempt - 1))
        attempts += 1
        try:
            got = list(evaluate(pending))
        except Exception as exc:  # a dead service, a lost connection: try again, then stop
            problem = f"the evaluation failed: {type(exc).__name__}: {first_line(exc, 300)}"
            continue
        by_id = {r.candidate_id: r for r in got}
        for candidate in pending:
            result = by_id.get(candidate.candidate_id)
            if result is None:
                problem = f"the evaluation returned no result for {candidate.candidate_id}"
            elif result.status in UNSCORED:
                problem = f"{result.status} for {candidate.candidate_id}: {result.reason}"
            else:
                results[candidate.candidate_id] = result
        pending = [c for c in pending if c.candidate_id not in results]
        if not pending:
            return results, attempts
    raise RewardsUnavailable(f"{len(pending)} candidate(s) have no result after {attempts} attempt(s); last: {problem}")


class Scorer:
    """Scores the steps of one stage of a run (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        tasks: Mapping[str, Task],
        evaluate: BatchEvaluate,
        pool: str,
        stage: str,
        store,
        variants: VariantsTable,
        sleep: Callable[[float], None] = time.sleep,
        attempt: float | None = None,
    ) -> None:
        self.config, self.train = config, config.train
        self.attempt = attempt  # the stage attempt's start (every worker's): its rollouts' created_at
        self.tasks, self.evaluate, self.pool, self.stage = tasks, evaluate, pool, stage
        self.store, self.variants, self.sleep = store, variants, sleep

    def origin(self, step: int) -> str:
        return f"model:{self.train.run}/{self.stage}@{step}"

    def score(self, step: int, completions: Sequence[Completion], policy_steps: int | None = None) -> ScoredStep:
        """`policy_steps`: the steps the weights that generated the completions had taken, their
        rollouts' policy_version (None: step - 1, the step's own weights)."""
        started = time.perf_counter()
        made = [candidate_from(self.tasks[c.task_id], c.text, self.origin(step), c.parent_ids) for c in completions]
        candidates = [candidate for candidate, _ in made]
        results, attempts = evaluate_with_retries(
            candidates, self.evaluate, self.train.eval_retries, self.train.eval_retry_wait_s, self.sleep
        )
        if self.train.rewards.unstable == "remeasure":
            attempts += self._remeasure(candidates, results)
        evaluation_s = time.perf_counter() - started
        samples = [
            Sample(results[cand.candidate_id], c.group_id, parsed.missing)
            for c, (cand, parsed) in zip(completions, made)
        ]
        parts = rewards_by_name(samples, self.train.rewards)
        weights = self.train.rewards.weights
        totals = [sum(weights[name] * parts[name][i] for name in parts) for i in range(len(samples))]
        now = time.time() if self.attempt is None else self.attempt
        rollouts = [
            make_rollout(
                self.train.run,
                self.stage,
                step,
                i,
                c.group_id,
                c.task_id,
                c.prompt,
                c.text,
                cand,
                parsed.missing,
                results[cand.candidate_id],
                totals[i],
                {n: parts[n][i] for n in parts},
                created_at=now,
                policy_steps=policy_steps,
            )
            for i, (c, (cand, parsed)) in enumerate(zip(completions, made))
        ]
        new = self._new_variants(made, results)
        RolloutsTable.append(self.store, rollouts)
        VariantsTable.append(self.store, new)
        return ScoredStep(totals, rollouts, len(new), evaluation_s, attempts)

    def _remeasure(self, candidates: Sequence[Candidate], results: dict[str, EvalResult]) -> int:
        """Measure ok but unstable results again, up to `rewards.remeasure` times."""
        calls = 0
        for _ in range(self.train.rewards.remeasure):
            unstable = [
                c
                for c in {c.candidate_id: c for c in candidates}.values()
                if results[c.candidate_id].ok and results[c.candidate_id].unstable
            ]
            if not unstable:
                break
            again, used = evaluate_with_retries(
                unstable, self.evaluate, self.train.eval_retries, self.train.eval_retry_wait_s, self.sleep
            )
            calls += used
            results.update(again)  # the latest measurement counts; one still unstable is discounted
        return calls

    def _new_variants(self, made, results: Mapping[str, EvalResult]) -> list:
        new = {}
        for candidate, parsed in made:
            result = results[candidate.candidate_id]
            if result.ok and (candidate.candidate_id, self.pool) not in self.variants:
                new[candidate.candidate_id] = make_variant(candidate, result, parsed.analysis)
        for variant in new.values():
            self.variants.add(variant)
        return list(new.values())


def group_id(run: str, stage: str, step: int, index: int) -> str:
    """The id of the `index`-th prompt group of a step."""
    return content_id(run, stage, str(step), "group", str(index))
