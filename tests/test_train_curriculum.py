"""GRPO's curriculum, driven as the trainer drives it (a step's rows drawn one step ahead, its
results recorded after): it starts at the easiest levels, admits the next one once the recent
share correct passes the threshold or after its steps, draws only admitted tasks and each of them
equally often, refuses to guess, and a resume from its persisted state decides every later step
as the uninterrupted run did."""

from __future__ import annotations

import collections

import pytest

from speedforge.config import ConfigError, CurriculumConfig, TrainConfig, loads_config
from speedforge.records import Candidate, EvalResult, Task
from speedforge.train.curriculum import (
    LAG,
    LEVEL_OF_UNSEEN,
    Curriculum,
    CurriculumError,
    freeze_levels,
    record_step,
    resumed,
    task_levels,
)
from speedforge.train.rollouts import RolloutsTable, make_rollout
from speedforge.train.state import RunState

LEVELS = {"l1/a": 1, "l1/b": 1, "l2/a": 2, "l2/b": 2, "l2/c": 2, "l3/a": 3}
PER_STEP = 2


def passes(levels_that_pass: set[int]):
    """Statuses of a policy that solves the tasks of these levels and no other."""
    return lambda task: "ok" if LEVELS[task] in levels_that_pass else "incorrect"


def drive(curriculum: Curriculum, steps: range, policy, drawn: dict | None = None) -> dict[int, list[str]]:
    """Run `steps` as the trainer's loader does: step s + 1's rows are drawn before step s's results
    are recorded. Returns the tasks of each step's rows."""
    drawn = {} if drawn is None else drawn

    def draw(step: int) -> None:
        if step not in drawn:
            rows = range((step - 1) * PER_STEP, step * PER_STEP)
            drawn[step] = [curriculum.task_for(r) for r in rows]

    for step in steps:
        draw(step)
        draw(step + 1)  # fetched ahead, before this step's rewards
        rows = list(range((step - 1) * PER_STEP, step * PER_STEP))
        curriculum.record(step, rows, [policy(t) for t in drawn[step]])
    return drawn


def test_a_tasks_level_is_its_kernelbench_level_else_how_often_its_earlier_samples_passed():
    tasks = [
        Task("kb/l2", "cuda", "l2", "", level=2),
        Task("own/easy", "cpp", "easy", ""),
        Task("own/some", "cpp", "some", ""),
        Task("own/never", "cpp", "never", ""),
        Task("own/unseen", "cpp", "unseen", ""),
    ]
    earlier = [("own/easy", "ok"), ("own/easy", "incorrect"), ("own/some", "ok")] + [("own/some", "incorrect")] * 3
    earlier += [("own/never", "compile_error"), ("kb/l2", "incorrect")]
    rollouts = [rollout(task, status) for task, status in earlier]
    assert task_levels(tasks, rollouts) == {
        "kb/l2": 2,
        "own/easy": 1,
        "own/some": 2,
        "own/never": LEVEL_OF_UNSEEN,
        "own/unseen": LEVEL_OF_UNSEEN,
    }


def test_it_starts_at_the_easiest_level_and_admits_the_next_once_the_recent_share_correct_passes():
    config = CurriculumConfig(enabled=True, pass_share=0.9, window=3)
    curriculum = Curriculum(LEVELS, config, seed=0, per_step=PER_STEP)
    drawn = drive(curriculum, range(1, 12), passes({1}))
    # steps 1-3 are all correct; step 5 is the first drawn after all three were recorded (LAG 2)
    assert [curriculum.phase(s).levels for s in range(1, 6)] == [(1,)] * 4 + [(1, 2)]
    assert {t for s in range(1, 5) for t in drawn[s]} == {"l1/a", "l1/b"}
    # at levels 1-2 only level 1 passes: at most 4 of any three steps' 6 samples, so level 3 never comes
    assert all(curriculum.phase(s).levels == (1, 2) for s in range(5, 13))
    assert {LEVELS[t] for s in range(5, 12) for t in drawn[s]} == {1, 2}
    assert [curriculum.records[s].levels for s in (4, 5)] == [(1,), (1, 2)]
    figures = curriculum.figures(3)
    assert figures["curriculum_levels"] == [1] and figures["curriculum_admitted"] == [2]  # at step 3 + LAG
    assert figures["curriculum_pass_share"] == 1.0 and figures["curriculum_top_level"] == 1
    later = curriculum.figures(8)
    assert (
        later["curriculum_levels"] == [1, 2] and later["curriculum_since"] == 5 and later["curriculum_admitted"] == []
    )
    assert later["curriculum_pass_share"] == pytest.approx(
        sum(curriculum.records[s].correct for s in (6, 7, 8)) / (3 * PER_STEP)
    )


def test_every_level_comes_in_turn_while_the_policy_keeps_up():
    config = CurriculumConfig(enabled=True, pass_share=0.5, window=1)
    curriculum = Curriculum(LEVELS, config, seed=3, per_step=PER_STEP)
    drive(curriculum, range(1, 9), passes({1, 2, 3}))
    assert [curriculum.phase(s).levels for s in range(1, 8)] == [
        (1,),
        (1,),
        (1, 2),  # step 1's results, at step 1 + LAG
        (1, 2),
        (1, 2, 3),  # step 3, the first at levels 1-2, at step 3 + LAG
        (1, 2, 3),
        (1, 2, 3),
    ]


def test_steps_per_level_admits_the_next_level_whatever_the_results():
    config = CurriculumConfig(enabled=True, start_levels=2, pass_share=1.0, window=3, steps_per_level=3)
    curriculum = Curriculum(LEVELS, config, seed=0, per_step=PER_STEP)
    drive(curriculum, range(1, 6), passes(set()))
    assert [curriculum.phase(s).levels for s in range(1, 6)] == [(1, 2)] * 3 + [(1, 2, 3)] * 2


def test_the_admitted_tasks_are_drawn_equally_often_an_epoch_at_a_time():
    config = CurriculumConfig(enabled=True, start_levels=3)  # every level from the start: no results needed
    curriculum = Curriculum(LEVELS, config, seed=7, per_step=PER_STEP)
    tasks = [curriculum.task_for(row) for row in range(24)]
    epochs = [tasks[i : i + 6] for i in range(0, 24, 6)]
    assert all(sorted(epoch) == sorted(LEVELS) for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) > 1  # each epoch its own seeded order
    assert tasks == [Curriculum(LEVELS, config, seed=7, per_step=PER_STEP).task_for(row) for row in range(24)]
    assert tasks != [Curriculum(LEVELS, config, seed=8, per_step=PER_STEP).task_for(row) for row in range(24)]


def test_a_row_drawn_before_the_results_it_needs_is_an_error_not_a_guess():
    config = CurriculumConfig(enabled=True, pass_share=0.5, window=1)
    curriculum = Curriculum(LEVELS, config, seed=0, per_step=PER_STEP)
    curriculum.record(1, [0, 1], ["ok", "ok"])
    assert curriculum.phase(LAG + 1).levels == (1, 2)  # admitted at step 3: step 4 needs no more results
    assert curriculum.phase(4).levels == (1, 2)
    with pytest.raises(CurriculumError, match="rows of step 5 were drawn before the results of step 3"):
        curriculum.task_for(4 * PER_STEP)  # a row of step 5
    with pytest.raises(CurriculumError, match="step 2 scored rows \\[0\\] of other steps"):
        curriculum.record(2, [0, 2], ["ok", "ok"])
    with pytest.raises(CurriculumError, match="step 1 is recorded twice"):
        curriculum.record(1, [0, 1], ["ok", "incorrect"])


def test_a_resume_from_the_persisted_state_decides_every_later_step_as_the_uninterrupted_run():
    config = CurriculumConfig(enabled=True, pass_share=0.5, window=2)
    policy = passes({1, 2})
    straight = Curriculum(LEVELS, config, seed=5, per_step=PER_STEP)
    straight_drawn = drive(straight, range(1, 13), policy)

    # an attempt stopped during step 6, its checkpoint at step 4: the state holds steps 1-5
    stopped = Curriculum(LEVELS, config, seed=5, per_step=PER_STEP)
    stopped_drawn = drive(stopped, range(1, 6), policy)
    saved = stopped.to_dict()
    assert [r["step"] for r in saved["records"]] == [1, 2, 3, 4, 5]
    again = Curriculum.from_dict(saved, config, seed=5, per_step=PER_STEP).truncated(4)
    assert sorted(again.records) == [1, 2, 3, 4]
    resumed_drawn = drive(again, range(5, 13), policy, {s: stopped_drawn[s] for s in range(1, 5)})
    assert resumed_drawn == straight_drawn
    assert again.to_dict() == straight.to_dict()
    assert straight.phase(12).levels == (1, 2, 3)  # the run got past an admission after the resume


def test_a_resume_under_other_settings_is_refused():
    config = CurriculumConfig(enabled=True, pass_share=0.5, window=1)
    curriculum = Curriculum(LEVELS, config, seed=0, per_step=PER_STEP)
    drive(curriculum, range(1, 5), passes({1}))
    other = CurriculumConfig(enabled=True, pass_share=0.5, window=3)
    with pytest.raises(CurriculumError, match="step 3 drew from levels \\[1, 2\\].*would have drawn it from \\[1\\]"):
        Curriculum.from_dict(curriculum.to_dict(), other, seed=0, per_step=PER_STEP)


def test_the_stage_freezes_the_levels_records_every_workers_samples_and_resumes_from_its_state(tmp_path):
    from speedforge.store import open_store

    store = open_store(str(tmp_path / "store"))
    config = loads_config(
        "train:\n  run: r\n  seed: 1\n  grpo: {prompts_per_step: 1, curriculum: {enabled: true, window: 1}}\n"
    ).train
    RolloutsTable.append(store, [rollout("own/easy", "ok", run="r", stage="self")])
    RolloutsTable.append(store, [rollout("own/easy", "incorrect", run="other", stage="self")])  # another run's
    tasks = [Task("own/easy", "cpp", "easy", ""), Task("own/hard", "cpp", "hard", ""), Task("kb", "cuda", "k", "", 2)]
    state = RunState(store, "r", "grpo")
    frozen = freeze_levels(state, tasks, config)
    assert frozen.task_level == {"own/easy": 1, "own/hard": LEVEL_OF_UNSEEN, "kb": 2}

    live = resumed(state, config, 0)
    assert live.task_for(0) == live.task_for(1) == "own/easy"

    def two_workers(mine):
        return [mine, ([1], ["ok"])]  # rank 1's samples: a row of step 2, correct

    figures = record_step(live, 1, [0], ["ok"], lambda mine: [mine, ([0], ["incorrect"])], state)
    assert live.records[1].samples == 2 and live.records[1].correct == 1
    assert figures["curriculum_levels"] == [1] and figures["curriculum_admitted"] == [2]  # half correct: 0.2 passed
    record_step(live, 2, [1], ["ok"], two_workers, state)
    assert [r["step"] for r in state.get_json("curriculum.json")["records"]] == [1, 2]
    assert sorted(resumed(state, config, 1).records) == [1]  # a checkpoint at step 1: step 2 is run again

    store.delete("runs/r/grpo/curriculum.json")
    with pytest.raises(CurriculumError, match="started without it"):
        resumed(state, config, 1)


@pytest.mark.parametrize(
    "text, message",
    [
        ("pass_share: 0", "train.grpo.curriculum.pass_share: expected a number > 0 and <= 1, got 0"),
        ("window: 0", "train.grpo.curriculum.window: expected a number >= 1, got 0"),
        ("start_levels: 0", "train.grpo.curriculum.start_levels: expected a number >= 1, got 0"),
        ("steps_per_level: -1", "train.grpo.curriculum.steps_per_level: expected a number >= 0, got -1"),
        ("enabled: maybe", "train.grpo.curriculum.enabled: expected bool, got 'maybe'"),
        ("level: 2", "train.grpo.curriculum: unknown key(s) 'level'"),
    ],
)
def test_a_curriculum_setting_out_of_range_is_one_line_naming_it(text, message):
    with pytest.raises(ConfigError) as caught:
        loads_config(f"train:\n  grpo:\n    curriculum: {{{text}}}\n", "c.yaml")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert TrainConfig().grpo.curriculum.enabled is False  # off unless asked for


def rollout(task: str, status: str, run: str = "r", stage: str = "self"):
    counter[task] += 1
    candidate = Candidate.make(task, f"# {counter[task]}", origin="test")
    result = EvalResult(candidate.candidate_id, task, "cpu", status, correct=status == "ok", speedup=1.0)
    return make_rollout(run, stage, 1, counter[task], "g", task, "p", "c", candidate, (), result, 0.0, {})


counter: collections.Counter = collections.Counter()
