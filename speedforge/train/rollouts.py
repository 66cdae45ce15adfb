"""The rollouts table: one Rollout per training sample, appended to the store once its step's
rewards are all known (a step whose evaluation failed writes nothing).

Every worker of a stage attempt (its start, or a resume) stamps its rows with the attempt's
start (`created_at`), so a step's rows from several Ray Train workers stay together. A resume
first deletes the parts of steps after its checkpoint (`supersede`: steps an interrupted attempt
began or finished without a checkpoint), which it then runs again; readers keep, for each
(run, stage, step), only the rows of the latest attempt, so no sample is ever counted twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from speedforge.records import TABLES, Candidate, EvalResult, Rollout, content_id

TABLE = "rollouts"


def policy_version(run: str, stage: str, steps_done: int) -> str:
    """The name of the weights after `steps_done` steps of a stage of a run."""
    return f"{run}/{stage}@{steps_done}"


def make_rollout(
    run: str,
    stage: str,
    step: int,
    index: int,
    group_id: str,
    task_id: str,
    prompt: str,
    completion: str,
    candidate: Candidate,
    missing: Sequence[str],
    result: EvalResult,
    reward: float,
    rewards: dict[str, float],
    created_at: float | None = None,
    policy_steps: int | None = None,
) -> Rollout:
    """The record of sample `index` of a step; `policy_steps`: the steps the weights that wrote it
    had taken (None: step - 1, the step's own weights; a step earlier when generated a step ahead)."""
    return Rollout(
        rollout_id=content_id(run, stage, str(step), str(index)),
        run=run,
        stage=stage,
        step=step,
        group_id=group_id,
        policy_version=policy_version(run, stage, step - 1 if policy_steps is None else policy_steps),
        task_id=task_id,
        prompt=prompt,
        completion=completion,
        candidate_id=candidate.candidate_id,
        candidate_source=candidate.source,
        missing=tuple(missing),
        status=result.status,
        speedup=result.speedup if result.ok else None,
        unstable=result.unstable,
        reward=reward,
        rewards_json=json.dumps(rewards, sort_keys=True),
        result_json=result.to_json(),
        created_at=time.time() if created_at is None else created_at,
    )


class RolloutsTable:
    """Reads and appends the `rollouts` table of a store."""

    name = TABLE  # the store table, and the class of its rows (speedforge.records.TABLES)
    record = TABLES[TABLE]

    @classmethod
    def append(cls, store, rollouts: list[Rollout]) -> None:
        """One new part holding one step's rollouts."""
        if rollouts:
            store.append_records(cls.name, rollouts)

    @classmethod
    def supersede(cls, store, run: str, stage: str, after_step: int) -> int:
        """Delete the parts of `run`'s `stage` whose step is after `after_step`; how many."""
        from speedforge.store.base import decode_records

        deleted = 0
        for key in store.table_parts(cls.name):
            rows = decode_records(store.get_bytes(key), cls.record, store.describe(key))
            if rows and all(r.run == run and r.stage == stage and r.step > after_step for r in rows):
                store.delete(key)
                deleted += 1
        return deleted

    @classmethod
    def load(cls, store, run: str | None = None, stage: str | None = None) -> list[Rollout]:
        """The rollouts of a run (and stage), by step; a step written twice keeps its latest write."""
        rows = [
            r
            for r in store.read_records(cls.name, cls.record)
            if (run is None or r.run == run) and (stage is None or r.stage == stage)
        ]
        latest: dict[tuple[str, str, int], float] = {}
        for row in rows:
            key = (row.run, row.stage, row.step)
            latest[key] = max(latest.get(key, 0.0), row.created_at)
        # a step's rows of one attempt share its created_at (one part per worker)
        kept = [r for r in rows if r.created_at == latest[(r.run, r.stage, r.step)]]
        return sorted(kept, key=lambda r: (r.run, r.stage, r.step))  # stable: a step's samples in order
