"""The held-out check's own path (speedforge.train.run.evaluate_heldout), with a stand-in
policy whose answers are known: a correct program is scored correct however the answer around
it is shaped (a usage example after the code block, its constructor's arguments named otherwise
than the reference's), a cut answer is counted as cut, and every sample is written out with its
text and result. On the CPU: the cpp family's add_relu_scale, a pure-torch candidate."""

from __future__ import annotations

import json

import pytest

from speedforge.config import Config, EvaluatorConfig, PolicyConfig, TrainConfig
from speedforge.policy.backends import Generation
from speedforge.train.run import evaluate_heldout
from train_samples import FAST, answer

TASK = "cpp/add_relu_scale"
USAGE = "\nUsage:\n```python\nmodel = ModelNew(*get_init_inputs())\nprint(model(*get_inputs()))\n```\n"
ANSWERS = [
    (answer(FAST) + USAGE, "stop"),  # the program, then an example that only uses ModelNew
    (
        answer(
            FAST.replace("def __init__(self, scale)", "def __init__(self, s)").replace(
                "self.scale = scale", "self.scale = s"
            )
        ),
        "stop",
    ),
    (
        answer(FAST)[: answer(FAST).index("return torch.relu_")] + "return torch.relu_(a + ",
        "length",
    ),  # cut by the budget
]


def heldout_config(tmp_path) -> Config:
    """The cpp family, TASK held out, few timed calls (the verdicts are what these tests read)."""
    evaluator = EvaluatorConfig(
        cache_dir=str(tmp_path / "cache"), cpu_timed_calls=5, max_timed_calls=10, min_timed_s=0.0, warmup_calls=1
    )
    return Config(
        evaluator=evaluator,
        policy=PolicyConfig(device="cpu"),
        train=TrainConfig(
            family="cpp",
            tasks=(TASK, "cpp/silu_scale"),
            heldout=(TASK,),
            store=str(tmp_path / "store"),
            work_dir=str(tmp_path / "work"),
        ),
    )


class Answers:
    """A backend whose samples are ANSWERS, in order, for every prompt."""

    model_name = "stand-in"

    def generate_batch(self, conversations, n=1, **_):
        assert n == len(ANSWERS)
        return [[Generation(text, 100, 10, finish) for text, finish in ANSWERS] for _ in conversations]


def test_a_correct_program_is_scored_correct_whatever_surrounds_it(tmp_path, monkeypatch):
    monkeypatch.setattr("speedforge.policy.backends.make_backend", lambda config: Answers())
    config = heldout_config(tmp_path)
    samples = tmp_path / "samples.jsonl"
    report = evaluate_heldout(config, None, len(ANSWERS), samples_out=str(samples))
    [row] = report.tasks
    statuses = [status for status, _ in row["results"]]
    assert statuses == ["ok", "ok", "screen_rejected"], row["reasons"]
    assert report.valid_fraction == pytest.approx(2 / 3) and report.truncated_fraction == pytest.approx(1 / 3)
    written = [json.loads(line) for line in samples.read_text().splitlines()]
    assert [(w["task_id"], w["sample"], w["status"], w["finish_reason"]) for w in written] == [
        (TASK, 0, "ok", "stop"),
        (TASK, 1, "ok", "stop"),
        (TASK, 2, "screen_rejected", "length"),
    ]
    assert [w["text"] for w in written] == [text for text, _ in ANSWERS]
    assert written[0]["speedup"] == row["results"][0][1] and written[2]["reason"]


def test_samples_generated_on_one_machine_are_evaluated_on_another(tmp_path, monkeypatch):
    """--generate-only writes the samples and evaluates none; --samples-in evaluates that file
    without loading a model, with the same verdicts as the check in one go."""
    monkeypatch.setattr("speedforge.policy.backends.make_backend", lambda config: Answers())
    config = heldout_config(tmp_path)
    generated = tmp_path / "generated.jsonl"
    report = evaluate_heldout(config, None, len(ANSWERS), samples_out=str(generated), generate_only=True)
    assert report.samples == len(ANSWERS) and report.statuses == {} and "not evaluated" in report.top_failure
    lines = [json.loads(line) for line in generated.read_text().splitlines()]
    assert [(w["model"], w["sample"], w["status"], w["text"]) for w in lines] == [
        ("stand-in", i, None, text) for i, (text, _) in enumerate(ANSWERS)
    ]

    def no_model(config):
        raise AssertionError("--samples-in must not load a model")

    monkeypatch.setattr("speedforge.policy.backends.make_backend", no_model)
    evaluated = tmp_path / "evaluated.jsonl"
    report = evaluate_heldout(config, None, 1, samples_out=str(evaluated), samples_in=str(generated))
    [row] = report.tasks
    assert report.model == "stand-in" and report.samples == len(ANSWERS)
    assert [status for status, _ in row["results"]] == ["ok", "ok", "screen_rejected"], row["reasons"]
    assert report.truncated_fraction == pytest.approx(1 / 3)
    assert [json.loads(line)["status"] for line in evaluated.read_text().splitlines()] == [
        "ok",
        "ok",
        "screen_rejected",
    ]


def test_samples_of_another_split_are_refused(tmp_path):
    from speedforge.errors import UserError

    config = heldout_config(tmp_path)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"task_id": "cpp/silu_scale", "sample": 0, "text": "x"}) + "\n")
    with pytest.raises(UserError, match="no samples of held-out task"):
        evaluate_heldout(config, None, 1, samples_in=str(other))
