"""One-step-stale GRPO (train.grpo.stale_steps: 1, speedforge.train.lookahead) on TRL's GRPOTrainer
and the tiny model, without Ray: each step trains on the batch the previous step generated, with
the log-probabilities of the weights that generated it; a batch's evaluation runs while the next
batch generates; a run stopped within an overlapped step resumes with every batch trained once,
none with another policy's figures. The stage's own run is in test_train_stages."""

from __future__ import annotations

import time

import pytest

from speedforge.config import ConfigError, GRPOStageConfig, loads_config

pytest.importorskip("trl")


def test_stale_steps_is_off_by_default_and_only_zero_or_one():
    assert GRPOStageConfig().stale_steps == 0
    assert loads_config("train:\n  grpo: {stale_steps: 1}\n").train.grpo.stale_steps == 1
    with pytest.raises(ConfigError, match=r"train\.grpo\.stale_steps: expected 0 \(off\) or 1 .*got 2; more than"):
        loads_config("train:\n  grpo: {stale_steps: 2}\n")
    for wrong in ("true", "0.5", "'1'"):  # not a whole number at all
        with pytest.raises(ConfigError, match=r"train\.grpo\.stale_steps: expected"):
            loads_config(f"train:\n  grpo: {{stale_steps: {wrong}}}\n")
    with pytest.raises(ConfigError, match=r"stale_steps: expected 0 \(off\) or 1"):
        GRPOStageConfig(stale_steps=True)  # in code too: a bool is not a step count


def grpo(tiny_model, tmp_path, reward, steps: int, callbacks=(), on_chunk=None, **args):
    """The look-ahead trainer on the tiny model: two prompts of two generations a step, rows
    `write kernel <n>` in order, a learning rate that moves the weights visibly in a step;
    `on_chunk`: called with each generate call's rows, as the stage streams them."""
    import datasets
    import transformers
    from trl import GRPOConfig

    from speedforge.train.lookahead import lookahead_trainer

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    if on_chunk is not None:  # the stage's order: the model's own wrappers first, the trainer's outermost
        from speedforge.train.streaming import chunked_generate

        chunked_generate(model, 1, on_chunk)
    settings = dict(
        output_dir=str(tmp_path),
        max_steps=steps,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        temperature=1.0,
        learning_rate=1e-2,
        use_cpu=True,
        bf16=False,  # as the stage on a CPU: float32 throughout, so a plain forward reads what the trainer computes
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        shuffle_dataset=False,
    )
    rows = [{"prompt": [{"role": "user", "content": f"write kernel {n}"}], "row": n} for n in range(2 * steps)]
    return lookahead_trainer(
        model=model,
        reward_funcs=[reward],
        args=GRPOConfig(**settings | args),
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )


def token_logps(model, inputs):
    """Each completion token's log-probability under `model` (plain logits, log-softmax), 0 past
    each completion."""
    import torch

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    width = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1].float()
    logps = torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    return logps * inputs["completion_mask"]


class Recorder:
    """What the trainer did each step: the rows it was rewarded on, the batch it scored
    (speedforge.train.lookahead.Generation), the weights at the step's start, and the inputs of
    its loss with the log-probabilities the step's weights give them."""

    def __init__(self, monkeypatch):
        from transformers import TrainerCallback
        from trl import GRPOTrainer

        self.rows, self.scored, self.weights, self.losses, self.ahead_at_reward = {}, {}, {}, {}, {}
        self.trainer = None
        recorder = self
        original = GRPOTrainer.compute_loss

        def compute_loss(trainer, model, inputs, *args, **kwargs):
            recorder.losses[trainer.state.global_step + 1] = {
                **{k: inputs[k].clone() for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")},
                "old": inputs.get("old_per_token_logps"),
                "current": token_logps(trainer.model, inputs),
            }
            return original(trainer, model, inputs, *args, **kwargs)

        monkeypatch.setattr(GRPOTrainer, "compute_loss", compute_loss)

        class Weights(TrainerCallback):
            def on_step_begin(self, args, state, control, model=None, **kwargs):
                recorder.weights[state.global_step + 1] = {k: v.clone() for k, v in model.state_dict().items()}

        self.callback = Weights()

    def reward(self, prompts, completions, row, trainer_state, **_):
        step = trainer_state.global_step + 1
        self.rows[step] = sorted(set(row))
        self.scored[step] = self.trainer.scoring
        ahead = self.trainer.ahead
        self.ahead_at_reward[step] = ahead.generation.step if ahead is not None else None
        return [float(i % 2) for i in range(len(completions))]


def logps_under(tiny_model, weights, inputs):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model)
    model.load_state_dict(weights)
    return token_logps(model, inputs)


def test_each_step_trains_on_the_previous_steps_batch_with_the_log_probs_of_the_weights_that_generated_it(
    tiny_model, tmp_path, monkeypatch
):
    recorder = Recorder(monkeypatch)
    trainer = recorder.trainer = grpo(tiny_model, tmp_path, recorder.reward, 3, [recorder.callback])
    trainer.train()
    assert recorder.rows == {1: [0, 1], 2: [2, 3], 3: [4, 5]}  # every batch once, in the data's order
    # step k scores the batch step k-1 generated (policy_steps: the updates its weights had had)
    assert [(g.step, g.policy_steps, g.stale) for g in recorder.scored.values()] == [
        (1, 0, False),  # nothing was generated ahead of the first step: its own batch, on policy
        (2, 0, True),
        (3, 1, True),
    ]
    assert recorder.ahead_at_reward == {1: 2, 2: 3, 3: None}  # the next batch exists before the rewards are asked
    assert trainer.ahead is None  # the last step generated nothing it would not train on
    assert recorder.losses[1]["old"] is None  # on policy: TRL's own ratio
    for step in (2, 3):
        loss = recorder.losses[step]
        mask = loss["completion_mask"]
        generator = logps_under(tiny_model, recorder.weights[step - 1], loss)  # the weights that generated it
        assert loss["old"] is not None
        assert ((loss["old"] * mask - generator).abs().max()) < 1e-4  # the ratio's denominator: recorded then
        assert ((loss["old"] * mask - loss["current"]).abs().max()) > 1e-3  # not the step's own weights' figures


def test_a_batchs_evaluation_runs_while_the_next_batch_generates(tiny_model, tmp_path):
    """The evaluation of batch k is held until batch k+1 is being generated (the trainer says which
    step it generates for); the timestamps recorded by the streamed evaluation then place each
    batch's evaluation within the next batch's generation. Were the next batch generated only
    after the rewards, the held evaluation would never see it and the test would fail."""
    from speedforge.policy.parser import candidate_from
    from speedforge.train.streaming import StreamedEvaluation, completion_texts
    from test_train_scoring import TASK, measured

    steps, timelines, saw_next = 3, {}, {}

    def evaluate(candidates):  # batch k: until the trainer generates batch k+1 (the last one: at once)
        step = int(candidates[0].origin.rsplit("@", 1)[1])
        if step < steps and step not in saw_next:
            deadline = time.monotonic() + 120
            while trainer.generating != step + 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            saw_next[step] = trainer.generating == step + 1
        return [measured(c) for c in candidates]

    streamed = StreamedEvaluation(evaluate)

    def submit(prompt_ids, completion_ids):  # as the stage streams a generate call's completions
        texts = completion_texts(trainer.processing_class, completion_ids, trainer.eos_token_ids)
        step = trainer.generating
        streamed.submit([candidate_from(TASK, text, f"test@{step}")[0] for text in texts], batch=step)

    def reward(prompts, completions, trainer_state, **_):
        asked, step = time.perf_counter(), trainer_state.global_step + 1
        batch, ahead = trainer.scoring, trainer.ahead
        streamed([candidate_from(TASK, c[-1]["content"], f"test@{step}")[0] for c in completions])
        following = ahead and (ahead.generation.began, ahead.generation.ended)
        timelines[step] = streamed.timeline(batch.began, batch.ended, step, asked, following, 4 * batch.stale)
        return [0.0] * len(completions)

    trainer = grpo(tiny_model, tmp_path, reward, steps, on_chunk=submit)
    trainer.train()
    streamed.close()
    assert saw_next == {1: True, 2: True}
    figures = {step: timeline.as_dict() for step, timeline in timelines.items()}
    for step in (1, 2):
        assert figures[step]["evaluation_started_s"] < figures[step]["next_generation_end_s"]
        assert figures[step]["next_generation_overlap_s"] > 0  # some of it ran during the next generation
        assert figures[step]["streamed_samples"] == 4  # every completion went out as it was generated
    assert "next_generation_end_s" not in figures[3]  # the last batch has no next one
    assert [figures[s]["stale_samples"] for s in (1, 2, 3)] == [0, 4, 4]


def test_a_run_stopped_within_an_overlapped_step_resumes_with_each_batch_trained_once_on_its_own_figures(
    tiny_model, tmp_path, monkeypatch
):
    """Checkpoints every step; step 3's rewards fail after batch 4 was generated ahead. The resumed
    run starts at step 3 from step 2's checkpoint: batch 4 of the stopped run is dropped, batch 3
    generated again by the checkpoint's weights and trained on policy, batch 4 generated by them
    too and trained with their log-probabilities."""
    first = Recorder(monkeypatch)

    def failing(prompts, completions, row, trainer_state, **kwargs):
        rewards = first.reward(prompts, completions, row, trainer_state, **kwargs)
        if trainer_state.global_step + 1 == 3:
            raise ConnectionError("the evaluation service died")
        return rewards

    stopped = first.trainer = grpo(
        tiny_model, tmp_path, failing, 4, [first.callback], save_strategy="steps", save_steps=1
    )
    with pytest.raises(ConnectionError):
        stopped.train()
    assert first.ahead_at_reward[3] == 4  # killed with the next batch generated, before step 3's update
    assert sorted(first.losses) == [1, 2]
    assert (tmp_path / "checkpoint-2").is_dir() and not (tmp_path / "checkpoint-3").exists()
    trained = {step: first.rows[step] for step in first.losses}

    second = Recorder(monkeypatch)
    resumed = second.trainer = grpo(
        tiny_model, tmp_path, second.reward, 4, [second.callback], save_strategy="steps", save_steps=1
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    trained |= {step: second.rows[step] for step in second.losses}
    assert trained == {1: [0, 1], 2: [2, 3], 3: [4, 5], 4: [6, 7]}  # no batch lost, none twice
    assert [(g.step, g.policy_steps, g.stale) for g in second.scored.values()] == [(3, 2, False), (4, 2, True)]
    assert second.losses[3]["old"] is None  # generated again by the checkpoint's weights: on policy
    loss = second.losses[4]
    generator = logps_under(tiny_model, second.weights[3], loss)  # the checkpoint's weights, which generated it
    assert ((loss["old"] * loss["completion_mask"] - generator).abs().max()) < 1e-4
