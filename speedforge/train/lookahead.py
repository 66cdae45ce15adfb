"""One-step-stale GRPO (train.grpo.stale_steps: 1): the next step's batch is generated while this
step's rewards are still measured, and its importance ratio is taken against the log-probabilities
of the weights that generated it.

    trainer = lookahead_trainer(model=..., reward_funcs=..., args=..., ...)  # TRL's GRPOTrainer, a step ahead
    trainer.generating     # within a generate call: the step whose update trains on what it generates
    trainer.scoring        # within the reward function: the Generation whose rewards TRL asks for
    trainer.generated      # the Generations of this step's generate calls
    trainer.ahead          # the batch generated for the next step (None at the last step)

Step k as TRL runs it: the trainer takes batch k's rows from its dataloader and calls `generate`.
That call hands back batch k as it was generated during step k-1, by the weights before step
k-1's update (theta_k-1); then, still within the call, it generates batch k+1 from the
dataloader's next rows with the current weights (theta_k, before step k's update) and records
the log-probability of each of its tokens under them, computed as TRL's loss computes them. Only
then does TRL ask for batch k's rewards: their evaluation, submitted when batch k was generated
(speedforge.train.streaming), has run meanwhile, behind step k-1's update and batch k+1's
generation. Step k's loss takes its importance ratio pi_theta_k / pi_theta_k-1 against the
recorded log-probabilities (TRL's `old_per_token_logps`), never against theta_k's own.

Invariants:

- every batch is trained once, by the step after the one that generated it; a step with nothing
  generated ahead (the first step, the first after a resume) generates its own batch, on policy,
  and trains on it with TRL's own ratio (1 before the update);
- the log-probabilities of a batch generated ahead are those of the weights that generated it,
  recorded before the update that follows; when the rows TRL asks for are not those generated
  ahead, the batch is generated again on policy, never trained with another batch's figures;
- the last step generates nothing ahead (its dataloader has no next rows); a step that ends the
  stage early (train.max_stage_s) leaves a batch generated ahead that is never scored or counted;
- nothing generated ahead is checkpointed: a run resumed from step k's checkpoint generates
  batch k+1 again, on policy, with the checkpoint's weights; what an interrupted attempt generated
  ahead is dropped, as the rollouts of its steps past the checkpoint are.

The hooks are public ones: the model's `generate` (wrapped on the instance, as
speedforge.train.stages' other wrappers are), the trainer's `get_batch_samples` (the next step's
rows) and `compute_loss` (the recorded log-probabilities as TRL's `old_per_token_logps`), and
TRL's fused LM head (trl.trainer.utils.add_fused_lm_head: `model(..., labels=..., fused_lm_head=True)`),
through which TRL computes its own log-probabilities.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Generation:
    """One batch's generate call on this worker."""

    step: int  # the step whose update trains on it
    policy_steps: int  # optimizer steps the generating weights had taken (its rollouts' policy_version)
    began: float  # time.perf_counter()
    ended: float
    tokens: int  # completion tokens generated

    @property
    def seconds(self) -> float:
        return self.ended - self.began

    @property
    def stale(self) -> bool:
        """Generated before the previous step's update: one step off policy."""
        return self.policy_steps < self.step - 1


@dataclasses.dataclass(frozen=True)
class Ahead:
    """A batch generated for the next step: generate's output, and its tokens' log-probabilities
    under the weights that generated them."""

    input_ids: Any  # the left-padded prompts, as TRL tokenizes them
    attention_mask: Any
    output: Any  # what generate returned: the prompts and their completions
    logps: dict[tuple[tuple[int, ...], tuple[int, ...]], list[float]]  # (prompt, completion tokens) -> per token
    generation: Generation

    def serves(self, input_ids, attention_mask) -> bool:
        """Whether these are the prompts it was generated from."""
        return same_tensor(self.input_ids, input_ids) and same_tensor(self.attention_mask, attention_mask)


def same_tensor(a, b) -> bool:
    import torch

    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


def completion_length(tokens: Sequence[int], eos_ids: Sequence[int]) -> int:
    """A completion's tokens as TRL counts them: up to and including the first end token."""
    return next((i + 1 for i, token in enumerate(tokens) if token in eos_ids), len(tokens))


def row_key(prompt_tokens, completion_tokens, eos_ids: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A generated row: its prompt's tokens (no padding) and its completion's (to its first end token)."""
    completion = list(completion_tokens)
    return tuple(prompt_tokens), tuple(completion[: completion_length(completion, eos_ids)])


class Lookahead:
    """The part of the trainer that generates a step ahead; mixed into TRL's GRPOTrainer by
    `lookahead_trainer` (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        settings = (self.args.gradient_accumulation_steps, self.args.steps_per_generation, self.args.num_iterations)
        if settings != (1, 1, 1) or self.args.use_vllm:
            raise ValueError(
                "generating a step ahead needs one transformers generate call and one update per step: "
                "gradient_accumulation_steps, steps_per_generation and num_iterations 1, no vLLM "
                f"(got {settings}, use_vllm {self.args.use_vllm})"
            )
        self.generating: int | None = None
        self.scoring: Generation | None = None
        self.scoring_logps: dict | None = None  # the recorded log-probabilities of the batch being trained
        self.generated: list[Generation] = []
        self.ahead: Ahead | None = None
        self.following: tuple[Any, Any] | None = None  # (epoch iterator, the next step's rows from it)
        self._wrap_generate()

    # -- the next step's rows -------------------------------------------------------------------

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """This step's rows (the ones read ahead last step first), then the next step's, kept."""
        following, self.following = self.following, None
        rows = epoch_iterator
        if following is not None and following[0] is epoch_iterator:
            rows = itertools.chain([following[1]], epoch_iterator)
        batches = super().get_batch_samples(rows, num_batches, device)
        after = next(epoch_iterator, None)
        self.following = (epoch_iterator, after) if after is not None else None
        return batches

    # -- generation -----------------------------------------------------------------------------

    def _wrap_generate(self) -> None:
        model = self.model
        inner = model.generate

        @functools.wraps(inner)
        def generate(*args, **kwargs):
            if args or not self.model.training or "input_ids" not in kwargs:  # not the trainer's step call
                return inner(*args, **kwargs)
            return self._step_generate(inner, kwargs)

        model.generate = generate

    def _step_generate(self, inner, kwargs: dict):
        step = self.state.global_step + 1
        ahead, self.ahead, self.generated = self.ahead, None, []
        if ahead is not None and ahead.serves(kwargs["input_ids"], kwargs.get("attention_mask")):
            output, self.scoring, self.scoring_logps = ahead.output, ahead.generation, ahead.logps
        else:
            output, self.scoring = self._generate_batch(inner, step, kwargs)
            self.scoring_logps = None
        if self.following is not None:
            ids, mask = self._tokenized([row["prompt"] for row in self.following[1]], kwargs["input_ids"].device)
            following, generation = self._generate_batch(
                inner, step + 1, {**kwargs, "input_ids": ids, "attention_mask": mask}
            )
            self.ahead = Ahead(ids, mask, following, self._recorded_logps(ids, mask, following), generation)
        return output

    def _generate_batch(self, inner, step: int, kwargs: dict):
        """One generate call for the batch `step` trains on, by the current weights."""
        self.generating, began = step, time.perf_counter()
        try:
            output = inner(**kwargs)
        finally:
            self.generating = None
        width = kwargs["input_ids"].shape[1]
        tokens = sum(completion_length(row, self.eos_token_ids) for row in output[:, width:].tolist())
        generation = Generation(step, self.state.global_step, began, time.perf_counter(), tokens)
        self.generated.append(generation)
        return output, generation

    def _tokenized(self, prompts: list, device):
        """The prompts as TRL's generate call gets them: the chat template applied, padded on the left."""
        import torch
        from trl.trainer.utils import pad

        rows = self.processing_class.apply_chat_template(
            conversation=prompts,
            tools=self.tools or None,
            chat_template=self.chat_template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **self.chat_template_kwargs,
        )["input_ids"]
        tensors = [torch.tensor(row) for row in rows]
        ids = pad(tensors, self.processing_class.pad_token_id, "left", self.pad_to_multiple_of)
        mask = pad([torch.ones_like(t) for t in tensors], 0, "left", self.pad_to_multiple_of)
        return ids.to(device), mask.to(device)

    def _recorded_logps(self, ids, mask, output) -> dict:
        """Each completion token's log-probability under the current weights, as TRL's loss
        computes it (its fused LM head, under the accelerator's autocast), per row."""
        import torch

        width = output.shape[1] - ids.shape[1]
        completions = output[:, ids.shape[1] :]
        lengths = [completion_length(row, self.eos_token_ids) for row in completions.tolist()]
        positions = torch.arange(width, device=output.device).unsqueeze(0)
        kept = (positions < torch.tensor(lengths, device=output.device).unsqueeze(1)).to(mask.dtype)
        attention = torch.cat([mask, kept], dim=1)
        labels = output.masked_fill(attention == 0, -100)
        labels[:, : ids.shape[1]] = -100
        size = self.args.per_device_train_batch_size
        parts = []
        with torch.no_grad(), self.accelerator.autocast():
            for start in range(0, output.shape[0], size):
                rows = slice(start, start + size)
                got = self.model(
                    input_ids=output[rows], attention_mask=attention[rows], labels=labels[rows], fused_lm_head=True
                )
                parts.append(got.log_probs[:, -width:].float().cpu())
        logps = torch.cat(parts)
        prompts = [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu())]
        return {
            row_key(prompt, completion, self.eos_token_ids): logps[i, : lengths[i]].tolist()
            for i, (prompt, completion) in enumerate(zip(prompts, completions.tolist()))
        }

    # -- the loss -------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss; for a batch generated ahead, its ratio against the recorded log-probabilities."""
        if self.model.training and self.scoring_logps is not None:
            inputs = {**inputs, "old_per_token_logps": self.old_logps(inputs)}
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    def old_logps(self, inputs):
        """The recorded log-probabilities of these rows ([B x T], as `completion_ids`, 0 past each
        completion); a row that was not generated ahead is an error."""
        import torch

        completions = inputs["completion_ids"]
        old = torch.zeros(completions.shape, dtype=torch.float32, device=completions.device)
        for i, (prompt, mask, completion) in enumerate(
            zip(inputs["prompt_ids"].tolist(), inputs["prompt_mask"].tolist(), completions.tolist())
        ):
            key = row_key([t for t, m in zip(prompt, mask) if m], completion, self.eos_token_ids)
            values = self.scoring_logps.get(key)
            if values is None:
                raise RuntimeError(
                    f"step {self.state.global_step + 1} trains on a completion that was not generated ahead"
                )
            old[i, : len(values)] = torch.tensor(values[: completions.shape[1]])
        return old


def lookahead_trainer(**kwargs):
    """TRL's GRPOTrainer that generates a step ahead, built from GRPOTrainer's own arguments."""
    from trl import GRPOTrainer

    return type("LookaheadGRPOTrainer", (Lookahead, GRPOTrainer), {})(**kwargs)
