"""GRPO's curriculum: the prompts of a step come from the easiest levels of tasks admitted so far,
and the next level is admitted once enough of the recent samples are correct (train.grpo.curriculum).

    freeze_levels(state, tasks, config.train)                # the stage's first start: task_levels, frozen
    curriculum = resumed(state, config.train, steps_done)    # every start: the state after its checkpoint
    dataset.with_transform(curriculum.choosing(live))        # each row's task, when the row is drawn
    record_step(curriculum, step, rows, statuses, gather, state)   # in the reward function: persisted

A task's level is its KernelBench level (`Task.level`); a task without one (level 0) gets one
from how often this run's earlier samples of it (self-training) were correct: 1 at half or more,
2 when some were, 3 when none were or there were none. The first `start_levels` levels present
are admitted from step 1; the next one is admitted at the first step at which either
`steps_per_level` steps have drawn from the current levels, or the last `window` steps at the
current levels whose results are known had at least `pass_share` of their samples correct.

Invariants:

- the levels of step s depend only on the records of steps up to s - lag: the trainer's data
  loader draws a step's rows one step ahead, before the rewards of the step in between are known
  (lag LAG; one more with train.grpo.stale_steps 1, which generates each step's batch a step early),
  so a run that is resumed decides every step as the uninterrupted run did; a row drawn before
  the records it needs exist is an error, never a guess;
- a row's task is a function of (seed, row, the levels and the step they were admitted at), and
  the rows after an admission go through the admitted tasks epoch by epoch, each epoch a seeded
  permutation, so each admitted task is drawn equally often;
- a step is recorded once, with the levels its rows were drawn at; a resume keeps the records of
  the steps its checkpoint covers (`truncated`) and records the later steps again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from speedforge.config import CurriculumConfig, TrainConfig
from speedforge.records import Rollout, Task, content_id

LAG = 2  # the rows of step s are drawn once the results of step s - LAG are known (see the docstring)
EASY_SHARE = 0.5  # a task without a level whose earlier samples passed this often is level 1
LEVEL_OF_UNSEEN = 3  # a task without a level none of whose earlier samples passed


class CurriculumError(RuntimeError):
    """A curriculum asked for what it cannot decide exactly (a row drawn too early, a step recorded twice)."""


def task_levels(tasks: Iterable[Task], earlier: Iterable[Rollout] = ()) -> dict[str, int]:
    """Each task's level: its KernelBench level, else from the share of `earlier` samples of it
    that were correct (see the module docstring)."""
    seen: dict[str, list[bool]] = {}
    for rollout in earlier:
        seen.setdefault(rollout.task_id, []).append(rollout.status == "ok")
    levels = {}
    for task in tasks:
        if task.level > 0:
            levels[task.task_id] = task.level
            continue
        passed = seen.get(task.task_id, [])
        share = sum(passed) / len(passed) if passed else 0.0
        levels[task.task_id] = 1 if share >= EASY_SHARE else 2 if share > 0 else LEVEL_OF_UNSEEN
    return levels


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """What one step's samples did, at the levels its rows were drawn from."""

    step: int
    levels: tuple[int, ...]
    samples: int
    correct: int  # samples that measured ok


@dataclasses.dataclass(frozen=True)
class Phase:
    """The levels a step draws from, and the step from which they have been admitted."""

    levels: tuple[int, ...]
    since: int


class Curriculum:
    """The levels and tasks of GRPO's steps (see the module docstring)."""

    def __init__(
        self,
        levels: Mapping[str, int],
        config: CurriculumConfig,
        seed: int,
        per_step: int,
        records: Sequence[StepRecord] = (),
        lag: int = LAG,
    ) -> None:
        if not levels:
            raise CurriculumError("a curriculum needs at least one task")
        self.task_level = dict(levels)
        self.levels = tuple(sorted(set(levels.values())))
        self.config, self.seed, self.per_step, self.lag = config, seed, per_step, lag
        self.records: dict[int, StepRecord] = {}
        for record in records:
            self._keep(record)

    # -- decisions -------------------------------------------------------------------------------

    def phase(self, step: int) -> Phase:
        """The levels step `step` draws from, decided from the records of steps up to step - lag."""
        admitted, since = min(self.config.start_levels, len(self.levels)), 1
        for s in range(2, step + 1):
            if admitted < len(self.levels) and self._admits(since, s):
                admitted, since = admitted + 1, s
        return Phase(self.levels[:admitted], since)

    def _admits(self, since: int, step: int) -> bool:
        """Whether step `step` admits the next level, the current ones admitted at `since`."""
        if self.config.steps_per_level and step - since >= self.config.steps_per_level:
            return True
        last = step - self.lag  # the latest step whose results step `step` may use
        if last - since + 1 < self.config.window:
            return False
        recent = [self._record(t, step) for t in range(last - self.config.window + 1, last + 1)]
        samples = sum(r.samples for r in recent)
        return samples > 0 and sum(r.correct for r in recent) / samples >= self.config.pass_share

    def _record(self, step: int, needed_by: int) -> StepRecord:
        record = self.records.get(step)
        if record is None:
            raise CurriculumError(
                f"the rows of step {needed_by} were drawn before the results of step {step} were recorded: "
                f"the curriculum decides a step from the steps up to {self.lag} before it"
            )
        return record

    def task_for(self, row: int) -> str:
        """The task of GRPO's row `row` (rows of step s: (s - 1) * per_step ...)."""
        step = row // self.per_step + 1
        phase = self.phase(step)
        tasks = sorted(t for t, level in self.task_level.items() if level in phase.levels)
        epoch, index = divmod(row - (phase.since - 1) * self.per_step, len(tasks))
        levels = ",".join(map(str, phase.levels))
        return sorted(tasks, key=lambda t: content_id(str(self.seed), "curriculum", levels, str(epoch), t))[index]

    def choosing(self, transform: Callable[[dict], dict]) -> Callable[[dict], dict]:
        """A `datasets` transform: `transform` of the batch with each row's task chosen here."""

        def choose(batch: dict[str, list]) -> dict[str, list]:
            return transform({**batch, "task_id": [self.task_for(int(row)) for row in batch["row"]]})

        return choose

    # -- records ---------------------------------------------------------------------------------

    def record(self, step: int, rows: Sequence[int], statuses: Sequence[str]) -> StepRecord:
        """Record step `step` from its samples' rows and statuses (every worker's)."""
        strays = sorted({int(r) for r in rows if int(r) // self.per_step + 1 != step})
        if strays:
            raise CurriculumError(f"step {step} scored rows {strays[:4]} of other steps")
        record = StepRecord(step, self.phase(step).levels, len(statuses), sum(s == "ok" for s in statuses))
        self._keep(record)
        return record

    def _keep(self, record: StepRecord) -> None:
        if record.step in self.records and self.records[record.step] != record:
            raise CurriculumError(f"step {record.step} is recorded twice, differently")
        self.records[record.step] = record

    def figures(self, step: int) -> dict[str, Any]:
        """What a reader of step `step`'s metrics line sees of the curriculum: the levels its rows
        came from and the step they were admitted at, the share correct at those levels over the
        last `window` steps, and the levels admitted at step + lag (the first step its results
        decide), if any."""
        phase = self.phase(step)
        steps = [t for t in range(max(phase.since, step - self.config.window + 1), step + 1) if t in self.records]
        samples = sum(self.records[t].samples for t in steps)
        correct = sum(self.records[t].correct for t in steps)
        before = self.phase(step + self.lag - 1).levels
        admitted = [level for level in self.phase(step + self.lag).levels if level not in before]
        return {
            "curriculum_levels": list(phase.levels),
            "curriculum_top_level": phase.levels[-1],
            "curriculum_since": phase.since,
            "curriculum_pass_share": correct / samples if samples else None,
            "curriculum_admitted": admitted,
        }

    def truncated(self, steps_done: int) -> "Curriculum":
        """This curriculum as it was after `steps_done` steps (what a resume goes on from)."""
        kept = [r for s, r in sorted(self.records.items()) if s <= steps_done]
        return Curriculum(self.task_level, self.config, self.seed, self.per_step, kept, self.lag)

    def to_dict(self) -> dict[str, Any]:
        return {
            "levels": dict(sorted(self.task_level.items())),
            "records": [dataclasses.asdict(r) for _, r in sorted(self.records.items())],
        }

    @classmethod
    def from_dict(
        cls, value: Mapping[str, Any], config: CurriculumConfig, seed: int, per_step: int, lag: int = LAG
    ) -> "Curriculum":
        """The curriculum `to_dict` wrote, under `config`; CurriculumError when `config` would have
        drawn a recorded step from other levels (its settings changed since)."""
        records = [
            StepRecord(int(r["step"]), tuple(int(v) for v in r["levels"]), int(r["samples"]), int(r["correct"]))
            for r in value["records"]
        ]
        curriculum = cls({str(k): int(v) for k, v in value["levels"].items()}, config, seed, per_step, records, lag)
        for record in records:
            now = curriculum.phase(record.step).levels
            if now != record.levels:
                raise CurriculumError(
                    f"step {record.step} drew from levels {list(record.levels)}, and these settings would have drawn "
                    f"it from {list(now)}: train.grpo.curriculum (or prompts_per_step, or stale_steps) changed since the stage "
                    "started; resume it with the settings it started with"
                )
        return curriculum


# -- the GRPO stage's use -----------------------------------------------------------------------

STATE_FILE = "curriculum.json"  # in the stage's state (speedforge.train.state): the levels and every step's record


def freeze_levels(state, tasks: Sequence[Task], config: TrainConfig) -> Curriculum:
    """The curriculum of a stage's first start over `tasks` (its training rows' tasks), its levels
    from the run's earlier samples (every stage but this one), written to the stage's state."""
    from speedforge.train.rollouts import RolloutsTable

    unlevelled = {t.task_id for t in tasks if t.level <= 0}
    earlier = [
        r
        for r in (RolloutsTable.load(state.store, run=config.run) if unlevelled else ())
        if r.stage != state.stage and r.task_id in unlevelled
    ]
    grpo = config.grpo
    curriculum = Curriculum(
        task_levels(tasks, earlier), grpo.curriculum, config.seed, grpo.prompts_per_step, lag=LAG + grpo.stale_steps
    )
    state.put_json(STATE_FILE, curriculum.to_dict())
    return curriculum


def resumed(state, config: TrainConfig, steps_done: int) -> Curriculum:
    """The curriculum in the stage's state, as it was after `steps_done` steps."""
    saved = state.get_json(STATE_FILE)
    if saved is None:
        raise CurriculumError(
            f"train.grpo.curriculum is on, and the {state.stage} stage of run {config.run} started without it "
            f"(no {STATE_FILE} in {state.describe()}): resume it with the curriculum off, or start a new run"
        )
    grpo = config.grpo
    lag = LAG + grpo.stale_steps
    return Curriculum.from_dict(saved, grpo.curriculum, config.seed, grpo.prompts_per_step, lag).truncated(steps_done)


def record_step(
    curriculum: Curriculum,
    step: int,
    rows: Sequence[int],
    statuses: Sequence[str],
    gather: Callable[[Any], list],
    state=None,
) -> dict[str, Any]:
    """Record a step from this worker's samples and, through `gather`, every other worker's;
    with `state` (rank 0) persist the curriculum. The step's figures for its metrics line."""
    parts = gather(([int(r) for r in rows], list(statuses)))
    curriculum.record(step, [r for mine, _ in parts for r in mine], [s for _, theirs in parts for s in theirs])
    if state is not None:
        state.put_json(STATE_FILE, curriculum.to_dict())
    return curriculum.figures(step)
