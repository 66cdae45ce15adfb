"""Reward functions on crafted evaluation results: every status has a defined reward, a failed
candidate scores below every correct one and a cheating one lower still, an infra_error is never
scored, and an unstable result is discounted (or measured again first, by the scorer). The graded
reward orders the stages a sample reached, so a group where nothing is correct still has signal."""

from __future__ import annotations

import math

import pytest

from speedforge.config import ConfigError, GradedRewardConfig, RewardConfig, loads_config
from speedforge.records import STATUSES, EvalResult
from speedforge.train.rewards import (
    GRADES,
    MissingReward,
    Sample,
    cheated,
    grade,
    known_rewards,
    reward_fn,
    rewards_by_name,
    total_rewards,
)

CONFIG = RewardConfig()
FAILURES = ("compile_error", "runtime_error", "incorrect", "timeout", "crashed")
REASONS = {  # what the evaluator says for each, as it says it
    "screen_rejected": "line 3: threading.Thread(...) starts a thread: threads (work can finish after the timer stops) [threads]",
    "hack_detected": "a new thread appeared during the timed calls",
    "compile_error": "error: expected ';' before '}' token",
    "runtime_error": "RuntimeError: shape mismatch",
    "incorrect": "output 0 differs: max |diff| 0.5 > tolerance",
    "timeout": "run exceeded 300 s",
    "crashed": "killed by signal 11 (SIGSEGV)",
    "infra_error": "bench worker died",
}


def result(
    status: str, speedup: float | None = None, unstable: bool = False, reason: str | None = None, candidate: str = "c"
) -> EvalResult:
    ok = status == "ok"
    return EvalResult(
        candidate_id=candidate,
        task_id="cpp/t",
        pool="cpu",
        status=status,
        correct=ok,
        speedup=speedup if ok else None,
        unstable=unstable,
        reason=REASONS.get(status, "") if reason is None else reason,
    )


SCORED_STATUSES = [s for s in STATUSES if s != "infra_error"]
PER_RESULT = ("speedup", "log_speedup", "auc", "graded")


def test_every_registered_reward_is_known_and_the_default_weights_use_registered_ones():
    assert {"speedup", "log_speedup", "cudal1", "auc", "format", "graded"} <= set(known_rewards())
    assert set(CONFIG.weights) <= set(known_rewards())


@pytest.mark.parametrize("name", PER_RESULT)
@pytest.mark.parametrize("status", SCORED_STATUSES)
def test_every_status_has_a_finite_reward(name, status):
    samples = [Sample(result(status, speedup=1.7))]
    [value] = reward_fn(name)(samples, CONFIG)
    assert math.isfinite(value)


@pytest.mark.parametrize("name", PER_RESULT)
def test_a_failed_candidate_scores_below_every_correct_one_and_a_cheat_lower_still(name):
    fn = reward_fn(name)
    slowest_ok = fn([Sample(result("ok", speedup=1e-3))], CONFIG)[0]
    fastest_ok = fn([Sample(result("ok", speedup=1e3))], CONFIG)[0]
    failed = [fn([Sample(result(s))], CONFIG)[0] for s in FAILURES]
    cheats = [fn([Sample(result(s))], CONFIG)[0] for s in ("screen_rejected", "hack_detected")]
    assert fastest_ok > slowest_ok
    assert max(failed) < slowest_ok
    assert max(cheats) < min(failed)


@pytest.mark.parametrize("rule", ["not-python", "no-model-new"])
def test_an_answer_without_a_program_is_a_failure_not_a_cheat(rule):
    no_program = result("screen_rejected", reason=f"line 1: invalid syntax: not valid Python [{rule}]")
    assert not cheated(no_program)
    assert cheated(result("screen_rejected")) and cheated(result("hack_detected"))
    fn = reward_fn("speedup")
    assert fn([Sample(no_program)], CONFIG) == fn([Sample(result("incorrect"))], CONFIG)


def test_speedups_are_clipped_and_log_speedup_is_symmetric():
    config = RewardConfig(max_speedup=4.0)
    assert reward_fn("speedup")([Sample(result("ok", 100.0))], config) == [4.0]
    up, down = reward_fn("log_speedup")([Sample(result("ok", 2.0)), Sample(result("ok", 0.5))], config)
    assert up == pytest.approx(math.log(2.0)) and down == pytest.approx(-math.log(2.0))
    assert reward_fn("auc")([Sample(result("ok", 1.25))], config) == [pytest.approx(0.25)]


@pytest.mark.parametrize("name", [*PER_RESULT, "cudal1", "format"])
def test_an_infra_error_is_never_scored(name):
    samples = [Sample(result("ok", 1.5), "g"), Sample(result("infra_error"), "g")]
    with pytest.raises(MissingReward, match="infra_error"):
        reward_fn(name)(samples, CONFIG)


def test_an_ok_result_without_a_speedup_is_never_scored():
    broken = EvalResult(candidate_id="c", task_id="cpp/t", pool="cpu", status="ok", correct=True, speedup=None)
    with pytest.raises(MissingReward):
        reward_fn("speedup")([Sample(broken)], CONFIG)


def test_cudal1_is_the_gated_speedup_and_no_reward_normalises_within_a_group():
    """Rewards are normalised once, by TRL's GRPOTrainer (scale_rewards: group): every reward
    function here gives a sample the same value alone as among any group."""
    samples = [
        Sample(result("ok", 2.0, candidate="a"), "g1"),
        Sample(result("incorrect", candidate="b"), "g1"),
        Sample(result("ok", 1.5, candidate="c"), "g2"),
        Sample(result("ok", 1.5, candidate="d"), "g2"),
        Sample(result("ok", 40.0, candidate="e"), "g2"),
    ]
    assert reward_fn("cudal1")(samples, CONFIG) == [2.0, 0.0, 1.5, 1.5, CONFIG.max_speedup]
    for name in known_rewards():
        together = reward_fn(name)(samples, CONFIG)
        alone = [reward_fn(name)([s], CONFIG)[0] for s in samples]
        assert together == alone, name


def test_cudal1_puts_a_cheat_below_a_failure_in_its_group():
    samples = [Sample(result("ok", 1.2), "g"), Sample(result("incorrect"), "g"), Sample(result("hack_detected"), "g")]
    ok, failed, cheat = reward_fn("cudal1")(samples, CONFIG)
    assert ok > failed > cheat


def test_format_counts_the_three_sections_and_the_code():
    samples = [
        Sample(result("ok", 1.1)),
        Sample(result("ok", 1.1), missing=("Algorithm Design",)),
        Sample(
            result("incorrect"), missing=("Performance Analysis", "Algorithm Design", "Code Implementation", "code")
        ),
    ]
    assert reward_fn("format")(samples, CONFIG) == [1.0, 0.75, 0.0]


def test_an_unstable_speedup_is_discounted_towards_one():
    config = RewardConfig(unstable_discount=0.5)
    stable, unstable = reward_fn("speedup")(
        [Sample(result("ok", 3.0)), Sample(result("ok", 3.0, unstable=True))], config
    )
    assert stable == 3.0 and unstable == 2.0  # 1 + (3 - 1) * 0.5
    slower = reward_fn("speedup")([Sample(result("ok", 0.5, unstable=True))], config)[0]
    assert slower == 0.75  # a slowdown is discounted towards 1 too
    assert reward_fn("speedup")([Sample(result("ok", 3.0, unstable=True))], RewardConfig(unstable_discount=1.0)) == [
        3.0
    ]


def test_the_total_is_the_weighted_sum():
    config = RewardConfig(weights={"speedup": 2.0, "format": 0.5})
    samples = [Sample(result("ok", 1.5), missing=("code",)), Sample(result("incorrect"))]
    parts = rewards_by_name(samples, config)
    assert total_rewards(samples, config) == [2.0 * parts["speedup"][i] + 0.5 * parts["format"][i] for i in range(2)]
    assert total_rewards(samples, config)[0] == pytest.approx(2 * 1.5 + 0.5 * 0.75)


def test_an_unknown_reward_name_stops_the_stage_before_any_work_naming_the_known_ones(tmp_path):
    """The config only reads the weights; the names are checked where a stage is planned."""
    from speedforge.config import Config, TrainConfig
    from speedforge.errors import UserError
    from speedforge.train.run import plan_stage

    config = Config(train=TrainConfig(store=str(tmp_path / "store"), rewards=RewardConfig(weights={"speed": 1.0})))
    with pytest.raises(UserError, match=r"train\.rewards\.weights: unknown reward 'speed'; known: .*cudal1"):
        plan_stage(config, "grpo")
    assert not (tmp_path / "store").exists()


NO_PROGRAM = "line 1: invalid syntax: not valid Python [not-python]"


def test_graded_puts_correctness_before_speed_and_each_stage_above_the_one_before():
    fn = reward_fn("graded")
    score = lambda *args, **kwargs: fn([Sample(result(*args, **kwargs))], CONFIG)[0]  # noqa: E731
    ladder = [
        score("hack_detected"),
        score("screen_rejected"),  # an exploit rule: a cheat too
        score("screen_rejected", reason=NO_PROGRAM),
        score("compile_error"),
        score("runtime_error"),
        score("incorrect"),
        score("ok", speedup=1e-3),
        score("ok", speedup=1.0),
        score("ok", speedup=2.0),
    ]
    assert ladder[0] == ladder[1] == -CONFIG.rejected_penalty  # a cheat stays the lowest
    assert ladder[1:] == sorted(ladder[1:]) and len(set(ladder[1:])) == len(ladder) - 1
    assert score("timeout") == score("crashed") == score("runtime_error") == CONFIG.graded.compiled
    assert ladder[2] == 0.0 and ladder[-1] == CONFIG.graded.correct + 2.0 * CONFIG.graded.speed
    assert score("ok", speedup=1e3) == CONFIG.graded.correct + CONFIG.max_speedup * CONFIG.graded.speed


def test_graded_gives_an_all_failing_group_signal_where_the_gated_speedup_gives_none():
    """GRPO's advantage is (r - mean) / std within a group: with cudal1 every failure is 0, a group
    where nothing is correct has std 0 and teaches nothing; graded ranks how far each sample got."""
    group = [
        Sample(result("screen_rejected", reason=NO_PROGRAM, candidate="a"), "g"),
        Sample(result("compile_error", candidate="b"), "g"),
        Sample(result("runtime_error", candidate="c"), "g"),
        Sample(result("incorrect", candidate="d"), "g"),
        Sample(result("compile_error", candidate="e"), "g"),
    ]
    assert len(set(reward_fn("cudal1")(group, CONFIG))) == 1
    graded = reward_fn("graded")(group, CONFIG)
    mean = sum(graded) / len(graded)
    std = (sum((r - mean) ** 2 for r in graded) / len(graded)) ** 0.5
    advantages = [(r - mean) / std for r in graded]
    assert std > 0 and advantages[3] > advantages[2] > advantages[1] == advantages[4] > advantages[0]
    assert advantages[1] < 0 < advantages[2]  # a compile error is below this group's mean, a build above it


def test_every_scored_status_has_one_grade_from_the_verdict_alone():
    graded = [status for statuses in GRADES.values() for status in statuses]
    assert sorted(graded) == sorted(s for s in SCORED_STATUSES if s != "hack_detected")
    assert grade(result("hack_detected")) is None and grade(result("screen_rejected")) is None
    assert grade(result("screen_rejected", reason=NO_PROGRAM)) == "no_program"
    assert [grade(result(s, speedup=1.0)) for s in ("compile_error", "crashed", "incorrect", "ok")] == [
        "screened",
        "compiled",
        "ran",
        "correct",
    ]
    with pytest.raises(MissingReward):
        grade(result("infra_error"))


def test_graded_credits_come_from_the_config():
    config = RewardConfig(graded=GradedRewardConfig(screened=0.0, compiled=0.5, ran=0.5, correct=2.0, speed=0.0))
    samples = [Sample(result(s, speedup=3.0)) for s in ("compile_error", "runtime_error", "incorrect", "ok")]
    assert reward_fn("graded")(samples, config) == [0.0, 0.5, 0.5, 2.0]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "{compiled: 0.5, ran: 0.4}",
            "train.rewards.graded.ran: expected a number at least compiled (0.5): a sample that got further never "
            "scores less, got 0.4",
        ),
        ("{ran: 1.0, correct: 1.0}", "train.rewards.graded.correct: expected a number above ran (1.0)"),
        ("{screened: -0.1}", "train.rewards.graded.screened: expected a number >= 0, got -0.1"),
        ("{speed: .nan}", "train.rewards.graded.speed: expected a number >= 0, got nan"),
        ("{faster: 2}", "train.rewards.graded: unknown key(s) 'faster'"),
    ],
)
def test_graded_credits_out_of_order_are_one_line_naming_the_key(text, message):
    with pytest.raises(ConfigError) as caught:
        loads_config(f"train:\n  rewards:\n    graded: {text}\n", "c.yaml")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="GradedRewardConfig.correct: expected a number above ran"):
        GradedRewardConfig(ran=2.0)
