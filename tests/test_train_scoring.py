"""Scoring a training step (completions -> one evaluation batch -> rewards, rollouts, variants)
and what the stages train on (the task split, SFT pairs, GRPO's live prompts); no Ray, no model."""

from __future__ import annotations

import dataclasses
import json

import pytest

from speedforge.config import Config, EvaluatorConfig, RewardConfig, TrainConfig
from speedforge.errors import UserError
from speedforge.records import Candidate, EvalResult, Variant
from speedforge.variants import VariantsTable
from speedforge.policy.prompts import render_prompt
from speedforge.store import open_store
from speedforge.tasks import builtin_tasks, find_task
from speedforge.train.data import LivePrompts, answer_text, fitting_tasks, sft_pairs, split_tasks
from speedforge.evaluation import open_evaluation
from speedforge.train.metrics import common_reasons, rollout_stats
from speedforge.train.rollouts import RolloutsTable
from speedforge.train.scoring import Completion, RewardsUnavailable, Scorer, evaluate_with_retries
from train_samples import FAST, answer

TASK = find_task("cpp/add_relu_scale")


def measured(candidate: Candidate, status: str = "ok", speedup: float = 1.5, unstable: bool = False) -> EvalResult:
    return EvalResult(
        candidate_id=candidate.candidate_id,
        task_id=candidate.task_id,
        pool="cpu",
        status=status,
        correct=status == "ok",
        speedup=speedup if status == "ok" else None,
        unstable=unstable,
        reason="" if status == "ok" else status,
    )


class FlakyService:
    """A stand-in evaluation service: a scripted failure per call (an exception to raise, a status
    to answer with), then ok results (incorrect for a source without ModelNew); records every
    batch it was sent."""

    def __init__(self, *script):
        self.script = list(script)
        self.batches: list[list[str]] = []

    def __call__(self, candidates):
        self.batches.append([c.candidate_id for c in candidates])
        step = self.script.pop(0) if self.script else "ok"
        if isinstance(step, Exception):
            raise step
        return [measured(c, step if "ModelNew" in c.source or step != "ok" else "incorrect") for c in candidates]


def config(tmp_path, **train) -> Config:
    evaluator = EvaluatorConfig(
        cache_dir=str(tmp_path / "cache"), cpu_timed_calls=5, max_timed_calls=10, min_timed_s=0.0, warmup_calls=1
    )
    settings = dict(run="r", store=str(tmp_path / "store"), eval_retries=2, eval_retry_wait_s=0.5) | train
    return Config(evaluator=evaluator, train=TrainConfig(**settings))


def scorer(tmp_path, evaluate, **train) -> Scorer:
    cfg = config(tmp_path, **train)
    store = open_store(cfg.train.store)
    return Scorer(cfg, {TASK.task_id: TASK}, evaluate, "cpu", "grpo", store, VariantsTable(), sleep=lambda s: None)


def completions(*texts: str, group: str = "g1") -> list[Completion]:
    return [Completion(TASK.task_id, "the prompt", text, group) for text in texts]


# -- retries: never a reward from a missing result ---------------------------------------------


def test_an_evaluation_that_fails_once_is_retried_and_then_scored():
    waits = []
    service = FlakyService(ConnectionError("bench worker lost"), "infra_error")
    candidates = [Candidate.make(TASK.task_id, FAST), Candidate.make(TASK.task_id, FAST + "\n# b\n")]
    results, attempts = evaluate_with_retries(candidates, service, retries=2, wait_s=1.0, sleep=waits.append)
    assert attempts == 3 and waits == [1.0, 2.0]  # waits double
    assert [r.status for r in results.values()] == ["ok", "ok"]
    assert len(service.batches) == 3 and all(len(b) == 2 for b in service.batches)  # the batch, whole, each time


def test_only_the_candidates_without_a_result_are_sent_again():
    candidates = [Candidate.make(TASK.task_id, FAST), Candidate.make(TASK.task_id, FAST + "\n# b\n")]

    def half(batch):  # the first call loses the second candidate's result
        half.calls.append([c.candidate_id for c in batch])
        return [measured(c) for c in (batch[:1] if len(half.calls) == 1 else batch)]

    half.calls = []
    results, attempts = evaluate_with_retries(candidates, half, retries=1, wait_s=0, sleep=lambda s: None)
    assert attempts == 2 and half.calls[1] == [candidates[1].candidate_id] and len(results) == 2


@pytest.mark.parametrize("failure", [ConnectionError("the evaluation service is gone"), "infra_error"])
def test_a_step_whose_evaluation_keeps_failing_stops_and_writes_nothing(tmp_path, failure):
    service = FlakyService(failure, failure, failure)
    score = scorer(tmp_path, service)
    with pytest.raises(RewardsUnavailable, match="after 3 attempt"):
        score.score(1, completions(answer(FAST), "no code at all"))
    assert RolloutsTable.load(score.store) == [] and VariantsTable.load(score.store).task_pools() == []
    assert len(score.variants) == 0


# -- a scored step -----------------------------------------------------------------------------


def test_a_step_is_one_batch_of_distinct_candidates_and_every_sample_gets_a_reward(tmp_path):
    service = FlakyService()
    score = scorer(tmp_path, service)
    scored = score.score(3, completions(answer(FAST), answer(FAST), "no code at all"))
    assert len(service.batches) == 1 and len(service.batches[0]) == 2  # the duplicate is evaluated once
    assert len(scored.rewards) == 3 and scored.rewards[0] == scored.rewards[1]
    rollouts = RolloutsTable.load(score.store, run="r", stage="grpo")
    assert [r.step for r in rollouts] == [3, 3, 3] and {r.group_id for r in rollouts} == {"g1"}
    assert rollouts[0].policy_version == "r/grpo@2" and rollouts[2].missing[-1] == "code"
    assert rollouts[0].reward == scored.rewards[0] and set(json.loads(rollouts[0].rewards_json)) == {"cudal1", "format"}
    assert rollouts[0].result.status == "ok"
    # the successful candidate is a variant now, here and in the store, with the model's analysis
    [variant] = VariantsTable.load(score.store).successful(TASK.task_id, "cpu")
    assert variant.analysis == "Three passes." and variant.origin == "model:r/grpo@3"
    assert score.variants.successful(TASK.task_id, "cpu") == [variant]


def test_an_unstable_result_is_measured_again_when_configured(tmp_path):
    calls = []

    def evaluate(batch):
        calls.append(len(calls))
        return [measured(c, speedup=3.0, unstable=len(calls) == 1) for c in batch]

    cfg = config(tmp_path, rewards=RewardConfig(unstable="remeasure", weights={"speedup": 1.0}))
    score = Scorer(cfg, {TASK.task_id: TASK}, evaluate, "cpu", "grpo", open_store(cfg.train.store), VariantsTable())
    scored = score.score(1, completions(answer(FAST)))
    assert len(calls) == 2 and scored.rewards == [3.0] and scored.attempts == 2
    discounted = scorer(
        tmp_path / "d",
        lambda b: [measured(c, speedup=3.0, unstable=True) for c in b],
        rewards=RewardConfig(weights={"speedup": 1.0}),
    )
    assert discounted.score(1, completions(answer(FAST))).rewards == [2.0]


def test_real_evaluation_of_a_step_with_a_good_answer_and_garbage(tmp_path):
    cfg = config(tmp_path)
    store = open_store(cfg.train.store)
    with open_evaluation("local", cfg, {TASK.task_id: TASK}, "cpu") as evaluate:
        score = Scorer(cfg, {TASK.task_id: TASK}, evaluate, "cpu", "grpo", store, VariantsTable())
        scored = score.score(1, completions(answer(FAST), "I would fuse the kernels."))
    good, garbage = scored.rollouts
    assert good.status == "ok" and good.speedup > 0 and garbage.status == "screen_rejected"
    assert scored.rewards[0] > scored.rewards[1]
    stats = rollout_stats(scored.rollouts)  # the step's metrics line says why the garbage failed
    assert stats["statuses"] == {"ok": 1, "screen_rejected": 1}
    assert list(stats["reasons"]) == ["screen_rejected"] and "not valid Python" in stats["reasons"]["screen_rejected"]


def test_a_steps_metrics_count_its_groups_and_those_whose_samples_all_got_one_reward():
    """A group whose rewards are all equal has GRPO advantage 0 everywhere: no signal."""
    from speedforge.train.rollouts import make_rollout

    def sample(group: str, index: int, reward: float):
        candidate = Candidate.make(TASK.task_id, f"# {group} {index}")
        result = measured(candidate, "incorrect")
        return make_rollout("r", "grpo", 1, index, group, TASK.task_id, "p", "c", candidate, (), result, reward, {})

    rollouts = [sample("flat", 0, 0.3), sample("flat", 1, 0.3), sample("mixed", 2, 0.1), sample("mixed", 3, 0.3)]
    rollouts += [sample("alone", 4, 2.0), sample("nearly", 5, 1.0), sample("nearly", 6, 1.0 + 1e-12)]
    stats = rollout_stats(rollouts)
    assert stats["groups"] == 4 and stats["groups_without_signal"] == 3  # flat, alone and nearly


def test_the_most_common_reason_of_each_failing_status_is_kept():
    pairs = [
        ("runtime_error", "NameError: x\ntraceback"),
        ("runtime_error", "NameError: x"),
        ("runtime_error", "CUDA error"),
        ("ok", ""),
        ("incorrect", ""),
        ("timeout", " \n "),
        ("compile_error", "e" * 500),
    ]
    assert common_reasons(pairs, width=20) == {"compile_error": "e" * 20, "runtime_error": "NameError: x"}


def test_a_step_written_again_after_a_resume_keeps_its_latest_rows(tmp_path):
    score = scorer(tmp_path, FlakyService())
    score.score(1, completions(answer(FAST)))
    score.score(2, completions("first try of step 2"))
    score.score(2, completions("second try of step 2", "and another"))
    rows = RolloutsTable.load(score.store, run="r")
    assert [(r.step, r.completion) for r in rows] == [
        (1, answer(FAST)),
        (2, "second try of step 2"),
        (2, "and another"),
    ]


# -- what the stages train on ------------------------------------------------------------------


def test_the_split_is_a_seeded_order_of_task_ids_whatever_order_they_come_in():
    tasks = builtin_tasks("cpp")
    settings = TrainConfig(heldout_count=2, train_count=3, seed=7)
    split = split_tasks(tasks, settings)
    assert split_tasks(list(reversed(tasks)), settings) == split
    assert len(split.heldout) == 2 and len(split.train) == 3
    assert not {t.task_id for t in split.train} & {t.task_id for t in split.heldout}
    assert split_tasks(tasks, dataclasses.replace(settings, seed=8)) != split
    named = split_tasks(
        tasks, TrainConfig(tasks=("cpp/rmsnorm", "cpp/logsumexp"), heldout=("cpp/rmsnorm",), train_count=0)
    )
    assert [t.task_id for t in named.train] == ["cpp/logsumexp"] and [t.task_id for t in named.heldout] == [
        "cpp/rmsnorm"
    ]
    with pytest.raises(UserError, match="train.heldout: no cpp task.*cpp/nope"):
        split_tasks(tasks, TrainConfig(heldout=("cpp/nope",)))


def variant(task_id: str, source: str, score: float) -> Variant:
    return Variant(
        variant_id=Candidate.make(task_id, source).candidate_id,
        task_id=task_id,
        pool="cpu",
        source=source,
        status="ok",
        score=score,
        created_at=score,
    )


def test_sft_pairs_come_from_validated_variants_of_training_tasks_only():
    heldout = find_task("cpp/rmsnorm")
    table = VariantsTable(
        [
            variant(TASK.task_id, FAST, 1.3),
            variant(TASK.task_id, FAST + "#2\n", 2.0),
            variant(heldout.task_id, "class ModelNew: pass\n", 3.0),
            dataclasses.replace(variant(TASK.task_id, "broken", 0.0), status="incorrect", score=None),
        ]
    )
    pairs = list(sft_pairs([TASK], table, "cpu", exemplars=1, seed=0).pairs)
    assert {p.validated for p in pairs} == {"measured"}
    assert [p.score for p in pairs] == [1.3, 2.0] and {p.task_id for p in pairs} == {TASK.task_id}
    slow, fast = pairs
    assert "1.30x speedup" in fast.prompt and "1.30x speedup" not in slow.prompt  # a lower-scoring exemplar only
    for section in ("### Performance Analysis", "### Algorithm Design", "### Code Implementation"):
        assert section in fast.answer
    assert (
        fast.answer.rstrip().endswith("```") and "one temporary instead of two" in fast.answer
    )  # the design is the docstring
    assert answer_text(TASK, table.get(fast.variant_id, "cpu")) == fast.answer
    # a budget that fits no exemplar drops it; one that fits nothing drops the pair
    fewer = sft_pairs([TASK], table, "cpu", 1, 0, fits=lambda p, a: "1.30x" not in p.user)
    assert "Earlier variants, with" not in fewer.pairs[1].prompt and fewer.fewer_exemplars == 1
    nothing = sft_pairs([TASK], table, "cpu", 1, 0, fits=lambda p, a: False)
    assert nothing.pairs == () and nothing.dropped_too_long == 2


def test_a_measured_variant_is_not_second_guessed_by_the_static_contract_checks():
    """A program that measured ok passed the run-time checks that answer_checks' guesses stand in
    for; the same program as an unmeasured source kernel is left out, with the reason."""
    kept = FAST.replace(
        "return torch.relu_(a + b).mul_(self.scale)",
        "if getattr(self, 'out', None) is None:\n            self.out = torch.empty_like(a)\n"
        "        torch.add(a, b, out=self.out).relu_().mul_(self.scale)\n        return self.out",
    )
    measured = sft_pairs([TASK], VariantsTable([variant(TASK.task_id, kept, 1.1)]), "cpu", 0, 0)
    assert len(measured.pairs) == 1 and measured.unusable == ()
    source = Candidate.make(TASK.task_id, kept, origin="import:elsewhere")
    trusted = sft_pairs([TASK], VariantsTable(), "cpu", 0, 0, trusted=[source])
    assert trusted.pairs == () and "returns a tensor the module keeps (return self.out)" in trusted.unusable[0]


def test_live_prompts_show_variants_found_since_the_last_fetch_and_render_the_same_for_the_same_table():
    table = VariantsTable([variant(TASK.task_id, FAST, 1.3)])
    live = LivePrompts({TASK.task_id: TASK}, table, Config().policy, "cpu", seed=0)
    first = live({"task_id": [TASK.task_id, TASK.task_id], "row": [0, 0]})
    assert first["prompt"][0] == first["prompt"][1] and "1.30x speedup" in first["prompt"][0][1]["content"]
    assert first["parents"][0] == [table.best(TASK.task_id, "cpu").variant_id]
    table.add(variant(TASK.task_id, FAST + "#2\n", 2.5))
    later = live({"task_id": [TASK.task_id], "row": [0]})
    assert "2.50x speedup" in later["prompt"][0][1]["content"]
    assert live({"task_id": [TASK.task_id], "row": [0]}) == later  # seeded by the row and the table
    plain = LivePrompts({TASK.task_id: TASK}, table, Config().policy, "cpu", seed=0, contrastive=False)
    assert plain({"task_id": [TASK.task_id], "row": [0]})["parents"] == [[]]


def test_grpo_trains_only_on_tasks_whose_bare_prompt_fits():
    """A task whose prompt is too long even without exemplars is left out of GRPO's data instead
    of stopping the stage at its first step (a level-3 task of CUDA-L1's corpus did, on the H100)."""
    short, other = sorted(builtin_tasks("cpp"), key=lambda t: len(render_prompt(t).user))[
        :: len(builtin_tasks("cpp")) - 1
    ]
    budget = len(render_prompt(short).user)  # the shortest bare prompt fits exactly; the longest does not
    assert len(render_prompt(other).user) > budget
    fits = lambda prompt, answer: len(prompt.user) <= budget  # noqa: E731
    assert fitting_tasks([other, short], fits) == (short,)
    assert fitting_tasks([other, short], None) == (other, short)
    with pytest.raises(UserError, match="does not fit the model even without exemplars"):
        LivePrompts({other.task_id: other}, VariantsTable(), Config().policy, "cpu", seed=0, fits=fits).render(
            other.task_id, 0
        )


@pytest.mark.slow  # a cold C++ build (~30 s on 2 shared cores) and two spawned build processes
def test_local_evaluation_with_build_workers_builds_in_processes_and_agrees_with_the_serial_one(tmp_path):
    from speedforge.tasks import builtin_candidates

    built = next(c for c in builtin_candidates("cpp") if c.task_id == TASK.task_id)  # inline C++: a real build
    batch = [
        built,
        Candidate.make(TASK.task_id, FAST, origin="test"),
        Candidate.make(TASK.task_id, "garbage", origin="test"),
    ]
    with open_evaluation("local", config(tmp_path), {TASK.task_id: TASK}, "cpu", build_workers=2) as evaluate:
        overlapped = evaluate(batch)
    assert [r.status for r in overlapped] == ["ok", "ok", "screen_rejected"]
    assert overlapped[0].build_s > 0 and not overlapped[0].build_cached  # built by a build process, run here
    with open_evaluation(config(tmp_path), {TASK.task_id: TASK}, "cpu") as evaluate:
        serial = evaluate(batch)
    assert [r.status for r in serial] == [r.status for r in overlapped]
    assert serial[0].build_cached  # the same cache: the build process's build is the one the serial run found
