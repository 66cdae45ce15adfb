"""Rewards streamed while generation runs (speedforge.train.streaming), without Ray: what was
submitted is served once and gives the serial path's rewards, a failure or an infra_error of a
submitted batch is retried as the Scorer retries, the step's timeline says how much evaluation
hid behind generation, and TRL's GRPOTrainer on the tiny model generates in parts whose decoded
texts are the completions it scores."""

from __future__ import annotations

import threading
import time

import pytest

from speedforge.config import LoraSettings
from speedforge.policy.parser import candidate_from
from speedforge.train.scoring import RewardsUnavailable
from speedforge.train.streaming import (
    EvaluationTimeline,
    RecentPrompts,
    StreamedEvaluation,
    chunked_generate,
    completion_texts,
)
from test_train_scoring import TASK, FlakyService, completions, measured, scorer
from train_samples import FAST, answer

LORA = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj"))
TEXTS = (
    answer(FAST),
    "no code at all",
    answer(FAST + "\n# the same, written again\n"),
    answer(FAST),
)  # the last one twice


def candidates_of(score, texts, step: int = 1):
    return [candidate_from(TASK, text, score.origin(step))[0] for text in texts]


def test_submitted_results_give_the_rewards_and_rollouts_of_the_serial_path(tmp_path):
    serial = scorer(tmp_path / "serial", FlakyService())
    expected = serial.score(1, completions(*TEXTS))
    service = FlakyService()
    streamed = StreamedEvaluation(service)
    score = scorer(tmp_path / "streamed", streamed)
    streamed.submit(candidates_of(score, TEXTS[:2]))  # the first part of the step's generation
    streamed.submit(candidates_of(score, TEXTS[2:]))  # the second: its repeated answer is not sent again
    got = score.score(1, completions(*TEXTS))
    assert got.rewards == expected.rewards
    assert [r.rollout_id for r in got.rollouts] == [r.rollout_id for r in expected.rollouts]
    assert [r.reward for r in got.rollouts] == [r.reward for r in expected.rollouts]
    assert sorted(sum(service.batches, [])) == sorted({c.candidate_id for c in candidates_of(score, TEXTS)})
    assert len(service.batches) == 2  # each part once; the Scorer's own call was served from them
    timeline = streamed.timeline(0.0, float("inf"))
    assert timeline.streamed == 3 and len(timeline.calls) == 2 and len(timeline.latencies_s) == 3
    streamed.close()


def test_an_answer_the_stream_did_not_see_is_evaluated_when_the_rewards_are_asked_for(tmp_path):
    service = FlakyService()
    streamed = StreamedEvaluation(service)
    score = scorer(tmp_path, streamed)
    streamed.submit(candidates_of(score, TEXTS[:1]))
    got = score.score(1, completions(*TEXTS[:2]))
    assert len(got.rewards) == 2
    assert [len(b) for b in service.batches] == [1, 1]  # the submitted one, then the one it missed
    streamed.close()


@pytest.mark.parametrize("failure", [ConnectionError("gone"), "infra_error"])
def test_a_submitted_batch_that_failed_is_evaluated_again_by_the_scorers_retry(tmp_path, failure):
    service = FlakyService(failure)
    streamed = StreamedEvaluation(service)
    score = scorer(tmp_path, streamed)
    streamed.submit(candidates_of(score, TEXTS[:2]))
    got = score.score(1, completions(*TEXTS[:2]))
    assert [len(b) for b in service.batches] == [2, 2]  # the failed background batch, then the retry
    assert got.attempts == 2 and len(got.rewards) == 2
    streamed.close()


def test_a_submitted_batch_that_keeps_failing_stops_the_step_as_without_streaming(tmp_path):
    streamed = StreamedEvaluation(FlakyService(*[ConnectionError("gone")] * 5))
    score = scorer(tmp_path, streamed, eval_retries=1)
    streamed.submit(candidates_of(score, TEXTS[:2]))
    with pytest.raises(RewardsUnavailable, match="gone"):
        score.score(1, completions(*TEXTS[:2]))
    streamed.close()


def test_the_background_evaluation_runs_while_the_caller_goes_on():
    release = threading.Event()
    started = threading.Event()

    def evaluate(candidates):
        started.set()
        assert release.wait(10)
        return [measured(c) for c in candidates]

    streamed = StreamedEvaluation(evaluate)
    (candidate,) = [candidate_from(TASK, TEXTS[0], "o")[0]]
    streamed.submit([candidate])  # returns at once: the evaluation has not finished
    assert started.wait(10) and not release.is_set()
    release.set()
    assert [r.candidate_id for r in streamed([candidate])] == [candidate.candidate_id]
    streamed.close()


def test_two_batches_in_flight_are_served_and_timed_apart(tmp_path):
    """One step's batch scored while the next one's is still under evaluation (one step stale): its
    timeline neither waits for the next batch's call nor counts it, and an answer both batches
    sent is served to each from its own call."""
    release = threading.Event()
    calls = []

    def evaluate(candidates):
        calls.append([c.candidate_id for c in candidates])
        if len(calls) == 2:  # the second batch's evaluation: still running while the first is scored
            assert release.wait(10)
        return [measured(c) for c in candidates]

    streamed = StreamedEvaluation(evaluate)
    score = scorer(tmp_path, streamed)
    streamed.submit(candidates_of(score, TEXTS[:2], step=1), batch=1)
    streamed.submit(candidates_of(score, TEXTS[1:3], step=2), batch=2)  # TEXTS[1] in both batches
    first = score.score(1, completions(*TEXTS[:2]))
    timeline = streamed.timeline(0.0, 1.0, batch=1)
    assert len(first.rewards) == 2 and len(timeline.calls) == 1 and timeline.streamed == 2
    assert not release.is_set()  # the first batch's timeline did not wait for the second's call
    release.set()
    second = score.score(2, completions(*TEXTS[1:3]))
    assert len(second.rewards) == 2 and len(calls) == 2  # the shared answer: served from the second's call too
    assert len(streamed.timeline(0.0, 1.0, batch=2).calls) == 1
    streamed.close()


def test_the_scorers_own_call_waits_behind_what_was_submitted_before_it(tmp_path):
    """Two evaluation calls never run at once: an answer the stream did not send is evaluated on
    the background thread too, after the next batch's call submitted before it."""
    running, most = [], []

    def evaluate(candidates):
        running.append(1)
        most.append(len(running))
        time.sleep(0.05)  # a call long enough for another to start, were two allowed at once
        running.pop()
        return [measured(c) for c in candidates]

    streamed = StreamedEvaluation(evaluate)
    score = scorer(tmp_path, streamed)
    streamed.submit(candidates_of(score, TEXTS[:1], step=2), batch=2)  # the next batch, generated ahead
    assert len(score.score(1, completions(*TEXTS[1:3])).rewards) == 2  # nothing of batch 1 was streamed
    assert max(most) == 1
    streamed.close()


def test_the_timeline_counts_evaluation_within_generation_as_overlap():
    timeline = EvaluationTimeline(
        began=10.0,
        generation_end=20.0,
        calls=((12.0, 15.0), (14.0, 18.0), (19.0, 23.0)),
        latencies_s=(1, 2, 3, 9),
        streamed=4,
    )
    assert timeline.evaluation_s == pytest.approx(6.0 + 4.0)  # 12-18 merged, 19-23
    assert timeline.overlap_s == pytest.approx(6.0 + 1.0)
    figures = timeline.as_dict()
    assert figures["evaluation_started_s"] == pytest.approx(2.0)
    assert figures["reward_latency_p50_s"] == pytest.approx(2.5) and figures["reward_latency_max_s"] == 9
    assert figures["stale_samples"] == 0 and "next_generation_overlap_s" not in figures


def test_a_batch_generated_a_step_ahead_counts_what_ran_before_its_rewards_were_asked_for():
    """Batch k generated in 10-20, its rewards asked for at 30, after batch k+1 generated in 24-29:
    hidden is all before 30, of which 24-29 ran during the next generation."""
    timeline = EvaluationTimeline(
        began=10.0,
        generation_end=20.0,
        calls=((21.0, 27.0), (31.0, 32.0)),
        latencies_s=(7.0, 12.0),
        streamed=2,
        asked=30.0,
        ahead=(24.0, 29.0),
        stale=2,
    )
    assert timeline.evaluation_s == pytest.approx(7.0) and timeline.overlap_s == pytest.approx(6.0)
    figures = timeline.as_dict()
    assert figures["next_generation_overlap_s"] == pytest.approx(3.0)
    assert figures["next_generation_began_s"] == pytest.approx(14.0) and figures["next_generation_end_s"] == 19.0
    assert figures["evaluation_started_s"] == pytest.approx(11.0) and figures["stale_samples"] == 2


def test_recent_prompts_find_the_task_of_a_rendered_prompt_and_forget_the_oldest():
    recent = RecentPrompts(keep=2)
    transform = recent.recording(
        lambda batch: {
            "prompt": [[{"role": "user", "content": f"write {t}"}] for t in batch["task_id"]],
            "task_id": batch["task_id"],
            "parents": [["v1"] for _ in batch["task_id"]],
        }
    )
    transform({"task_id": ["a", "b", "c"]})
    assert recent.find("<|im_start|>user\nwrite b<|im_end|>") == ("b", ("v1",))
    assert recent.find("write a") is None  # forgotten
    assert recent.find("something else") is None


class ScriptedModel:
    """A stand-in for a causal LM's generate: appends `new` tokens per row (the row's index, then
    pad 0 for rows past `short`), records each call's rows."""

    def __init__(self, new: int):
        import types

        self.new, self.calls = new, []
        self.generation_config = types.SimpleNamespace(pad_token_id=0, eos_token_id=7)

    def generate(self, input_ids=None, attention_mask=None, **kwargs):
        import torch

        self.calls.append(input_ids.shape[0])
        new = self.new if len(self.calls) == 1 else self.new - 1  # a later part ends a token earlier
        tokens = input_ids[:, :1].repeat(1, new) + 100
        return torch.cat([input_ids, tokens], dim=1)


def test_chunked_generation_returns_what_one_call_would_with_the_parts_handed_out_in_order():
    import torch

    model = ScriptedModel(new=3)
    parts = []
    chunked_generate(model, 2, lambda prompt, completion: parts.append((prompt.tolist(), completion.tolist())))
    ids = torch.tensor([[1, 2], [3, 4], [5, 6]])
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert model.calls == [2, 1]
    assert out.tolist() == [[1, 2, 101, 101, 101], [3, 4, 103, 103, 103], [5, 6, 105, 105, 0]]
    assert [p for p, _ in parts] == [[[1, 2], [3, 4]], [[5, 6]]]
    assert [c for _, c in parts] == [[[101] * 3, [103] * 3], [[105] * 2]]


def test_completion_texts_end_at_the_first_end_token():
    import types

    import torch

    tokenizer = types.SimpleNamespace(decode=lambda ids, skip_special_tokens: ",".join(map(str, ids)))
    assert completion_texts(tokenizer, torch.tensor([[5, 7, 9], [5, 6, 9]]), [7]) == ["5,7", "5,6,9"]


@pytest.mark.parametrize("adapter", [False, True], ids=["whole", "lora"])
def test_grpo_trainer_generates_in_parts_whose_texts_are_the_completions_it_scores(tiny_model, tmp_path, adapter):
    """TRL's GRPOTrainer on the tiny model, its generate call in two parts (through a LoRA adapter
    too): each part is handed out before the next is generated, and its decoded completions are
    the ones the reward function receives, so what was streamed is what gets scored."""
    pytest.importorskip("trl")
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    from speedforge.train.lora import lora_config
    from speedforge.train.streaming import eos_token_ids, prompt_texts

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    events, streamed, scored = [], [], []

    def on_chunk(prompt_ids, completion_ids):
        events.append("part")
        prompts = prompt_texts(tokenizer, prompt_ids, tokenizer.pad_token_id)
        texts = completion_texts(tokenizer, completion_ids, eos_token_ids(model, tokenizer))
        streamed.extend(zip(prompts, texts))

    def reward(prompts, completions, **_):
        events.append("reward")
        scored.extend(zip(prompts, (c[-1]["content"] for c in completions)))
        return [float(i) for i in range(len(completions))]

    chunked_generate(model, 2, on_chunk)
    args = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        shuffle_dataset=False,
    )
    rows = [{"prompt": [{"role": "user", "content": f"write kernel {n}"}]} for n in range(2)]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora_config(LORA) if adapter else None,
    )
    trainer.train()
    assert events == ["part", "part", "reward"]
    assert [text for _, text in streamed] == [text for _, text in scored]
    for (prompt, _), (messages, _) in zip(streamed, scored):
        assert messages[-1]["content"] in prompt  # the row's prompt, as RecentPrompts recognises it
