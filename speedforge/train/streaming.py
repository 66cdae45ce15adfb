"""Rewards streamed while generation runs: a GRPO step's completions go to the evaluation as soon
as a part of them is generated, so that when the last completion exists only the tail of the
evaluation remains.

    streamed = StreamedEvaluation(evaluate)                 # the BatchEvaluate the Scorer calls
    chunked_generate(model, chunks, on_chunk)               # the step's generate call, in `chunks` calls
    streamed.submit(candidates)                             # from on_chunk: evaluated in the background
    scored = scorer.score(step, completions)                # served from what was submitted, the rest now
    timeline = streamed.timeline(began, generation_end)     # the step's evaluation against its generation

Invariants:

- submitting only warms a cache keyed by candidate id (task and source): the rewards are those of
  the serial path for the same completions whatever was submitted, and a completion the stream
  did not recognise is evaluated when the Scorer asks, as without streaming;
- each candidate is evaluated once per step: a submitted result is handed out once, and whatever
  the Scorer asks again (an infra_error retried, an unstable result measured again) is evaluated
  again, so `speedforge.train.scoring`'s retry semantics are unchanged; a submitted batch that
  raised raises in the Scorer's call, which then retries every candidate of that call afresh;
- background evaluation runs on one thread, one batch at a time, and the Scorer's own calls wait
  for every submitted batch they are served from: two evaluation calls never run at once.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from speedforge.evaluation import BatchEvaluate
from speedforge.records import Candidate, EvalResult
from speedforge.stats import quantile


@dataclasses.dataclass(frozen=True)
class EvaluationTimeline:
    """One step's evaluation against its generation, in time.perf_counter seconds."""

    began: float  # the step began
    generation_end: float  # the step's last completion was generated
    calls: tuple[tuple[float, float], ...]  # each evaluation call's start and end, in start order
    latencies_s: tuple[float, ...]  # per scored candidate: from its completion generated to its reward known
    streamed: int  # candidates submitted before generation ended

    @property
    def evaluation_s(self) -> float:
        """Wall time during which some evaluation call ran."""
        return sum(end - start for start, end in merged(self.calls))

    @property
    def overlap_s(self) -> float:
        """Evaluation wall time hidden behind generation: within [began, generation_end]."""
        return sum(
            max(0.0, min(end, self.generation_end) - max(start, self.began)) for start, end in merged(self.calls)
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "evaluation_s": self.evaluation_s,
            "overlap_s": self.overlap_s,
            # seconds from the step's start to its first evaluation call: below generation_s when streamed
            "evaluation_started_s": self.calls[0][0] - self.began if self.calls else None,
            "streamed_samples": self.streamed,
            "reward_latency_p50_s": quantile(self.latencies_s, 0.5),
            "reward_latency_p90_s": quantile(self.latencies_s, 0.9),
            "reward_latency_max_s": max(self.latencies_s) if self.latencies_s else None,
        }


def merged(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Time spans merged where they overlap."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class StreamedEvaluation:
    """A BatchEvaluate that serves results of candidates submitted earlier (see the module
    docstring), and records when each evaluation call ran and when each result was known."""

    def __init__(self, evaluate: BatchEvaluate, clock: Callable[[], float] = time.perf_counter) -> None:
        self.evaluate, self.clock = evaluate, clock
        self.background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speedforge-rewards")
        self.lock = threading.Lock()
        self.submitted: dict[str, Future] = {}  # candidate id -> its batch's {candidate id: result}, end time
        self.generated_at: dict[str, float] = {}  # candidate id -> when its completion was generated
        self.known_at: dict[str, float] = {}  # candidate id -> when its result was known
        self.calls: list[tuple[float, float]] = []
        self.streamed = 0

    def submit(self, candidates: Sequence[Candidate]) -> None:
        """Evaluate these candidates in the background (each once: those already submitted are left out)."""
        now = self.clock()
        fresh = list({c.candidate_id: c for c in candidates if c.candidate_id not in self.submitted}.values())
        if not fresh:
            return
        future = self.background.submit(self._timed, fresh)
        for candidate in fresh:
            self.submitted[candidate.candidate_id] = future
            self.generated_at[candidate.candidate_id] = now
        self.streamed += len(fresh)

    def __call__(self, candidates: list[Candidate]) -> list[EvalResult]:
        now = self.clock()
        served = {
            c.candidate_id: self.submitted.pop(c.candidate_id) for c in candidates if c.candidate_id in self.submitted
        }
        for candidate in candidates:
            self.generated_at.setdefault(candidate.candidate_id, now)
        results: dict[str, EvalResult] = {}
        failure: BaseException | None = None
        for candidate_id, future in served.items():
            try:
                batch, ended = future.result()
            except Exception as exc:  # raised in the Scorer's call, which retries these afresh
                failure = exc
                continue
            if candidate_id in batch:
                results[candidate_id] = batch[candidate_id]
                self.known_at[candidate_id] = ended
        if failure is not None:
            raise failure
        rest = [c for c in candidates if c.candidate_id not in served]
        if rest:
            batch, ended = self._timed(rest)
            for candidate_id, result in batch.items():
                results[candidate_id] = result
                self.known_at[candidate_id] = ended
        return [results[c.candidate_id] for c in candidates if c.candidate_id in results]

    def _timed(self, candidates: list[Candidate]) -> tuple[dict[str, EvalResult], float]:
        started = self.clock()
        try:
            got = list(self.evaluate(candidates))
        finally:
            ended = self.clock()
            with self.lock:
                self.calls.append((started, ended))
        return {r.candidate_id: r for r in got}, ended

    def timeline(self, began: float, generation_end: float) -> EvaluationTimeline:
        """The step's timeline since the last call; what was submitted and never asked for is
        dropped (its batch is waited for, so that no call of this step runs into the next)."""
        for future in set(self.submitted.values()):
            try:
                future.result()
            except Exception:  # nobody asked for these results: their failure concerns no reward
                pass
        with self.lock:
            calls, self.calls = tuple(sorted(self.calls)), []
        latencies = tuple(
            max(0.0, self.known_at[cid] - self.generated_at[cid]) for cid in self.known_at if cid in self.generated_at
        )
        timeline = EvaluationTimeline(began, generation_end, calls, latencies, self.streamed)
        self.submitted, self.generated_at, self.known_at, self.streamed = {}, {}, {}, 0
        return timeline

    def close(self) -> None:
        self.background.shutdown(wait=True, cancel_futures=True)


class RecentPrompts:
    """The prompts a data transform rendered lately, to tell which task a generated row answers:
    user message -> (task id, exemplar ids). Bounded: the oldest are forgotten."""

    def __init__(self, keep: int = 1024) -> None:
        self.keep = keep
        self.prompts: collections.OrderedDict[str, tuple[str, tuple[str, ...]]] = collections.OrderedDict()

    def recording(self, transform: Callable[[dict], dict]) -> Callable[[dict], dict]:
        """`transform` (GRPO's rows -> prompts), recording what it rendered."""

        @functools.wraps(transform)
        def record(batch: dict) -> dict:
            out = transform(batch)
            for messages, task_id, parents in zip(out["prompt"], out["task_id"], out["parents"]):
                self.add(messages[-1]["content"], task_id, tuple(parents))
            return out

        return record

    def add(self, user: str, task_id: str, parents: tuple[str, ...]) -> None:
        self.prompts[user] = (task_id, parents)
        self.prompts.move_to_end(user)
        while len(self.prompts) > self.keep:
            self.prompts.popitem(last=False)

    def find(self, text: str) -> tuple[str, tuple[str, ...]] | None:
        """The task and exemplars of the longest recorded user message within `text`, else None."""
        found = [user for user in self.prompts if user and user in text]
        return self.prompts[max(found, key=len)] if found else None


def chunked_generate(model, chunks: int, on_chunk: Callable[[Any, Any], None]):
    """`model` whose `generate` runs a batch as `chunks` calls on consecutive rows, calling
    `on_chunk(prompt_ids, completion_ids)` after each (the rows' left-padded prompts and their
    new tokens), and returns what one call returns: the rows' tokens, the shorter parts padded on
    the right with the pad token (as generate pads a row that ended before the others). The
    wrapper is an attribute of this instance, like speedforge.train.stages' other generate wrappers."""
    import torch

    inner = model.generate

    @functools.wraps(inner)
    def generate(input_ids=None, attention_mask=None, **kwargs):
        rows = input_ids.shape[0]
        size = -(-rows // chunks)
        config = kwargs.get("generation_config") or model.generation_config
        pad = config.pad_token_id if config.pad_token_id is not None else 0
        parts = []
        for start in range(0, rows, size):
            ids = input_ids[start : start + size]
            mask = attention_mask[start : start + size] if attention_mask is not None else None
            out = inner(input_ids=ids, attention_mask=mask, **kwargs)
            on_chunk(ids, out[:, input_ids.shape[1] :])
            parts.append(out)
        width = max(p.shape[1] for p in parts)
        padded = [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=int(pad)) for p in parts]
        return torch.cat(padded, dim=0)

    model.generate = generate
    return model


def completion_texts(tokenizer, completion_ids, eos_ids: Sequence[int]) -> list[str]:
    """The rows' completions as GRPOTrainer decodes them: up to and including the first end token,
    special tokens skipped."""
    texts = []
    for row in completion_ids.tolist():
        end = next((i for i, token in enumerate(row) if token in eos_ids), len(row) - 1)
        texts.append(tokenizer.decode(row[: end + 1], skip_special_tokens=True))
    return texts


def prompt_texts(tokenizer, prompt_ids, pad_id: int | None) -> list[str]:
    """The rows' prompts as text (the left padding dropped)."""
    texts = []
    for row in prompt_ids.tolist():
        start = 0
        while pad_id is not None and start < len(row) and row[start] == pad_id:
            start += 1
        texts.append(tokenizer.decode(row[start:], skip_special_tokens=True))
    return texts


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion, as GRPOTrainer counts them: the tokenizer's and the model's."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return ids if tokenizer.eos_token_id in ids else [tokenizer.eos_token_id, *ids]
