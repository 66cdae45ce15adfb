"""What the stages train on: the task split, SFT pairs from the variants table, and GRPO's
prompts, rendered when the trainer fetches them from the live variants table.

    split = split_tasks(tasks, config.train)                 # training and held-out tasks
    data = sft_pairs(split.train, variants, pool, exemplars=1, seed=0, trusted=source_candidates)
    prompts = LivePrompts(tasks, variants, config.policy, pool, seed=0)

The split is a seeded hash order of the task ids, so it does not depend on the order tasks were
listed in, and no stage ever trains on a held-out task; the run records it (`split.json`).

An SFT pair's answer is validated one of two ways, recorded on the pair (`validated`):
`measured` (a variant of the table that measured ok here) or `source:<origin>` (with
`train.sft.trust_source`, a published kernel whose source's own harness validated it, e.g.
CUDA-L1's released kernels with their published speedup). A pair longer than the model's
context (`fits`) first shows fewer exemplars, then is dropped; `SFTData` counts both.

An answer teaches what a sample is scored on, so it is held to what a sample must pass: one the
policy could not write within its generation budget (`writable`: the held-out check would cut
it, and cut code is broken code) is dropped, and so is one whose code our own parser would not
extract as written, or that breaks a contract of the evaluator that can be read from its code
(speedforge.train.answer_checks); `SFTData` counts each.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence

from speedforge import families
from speedforge.config import PolicyConfig, TrainConfig
from speedforge.errors import UserError
from speedforge.policy.exemplars import sample_exemplars
from speedforge.policy.prompts import Prompt, exemplars_from_variants, render_prompt
from speedforge.records import Candidate, Task, Variant, content_id
from speedforge.variants import VariantsTable
from speedforge.tasks.loader import module_docstring
from speedforge.train.answer_checks import unusable_answer

Fits = Callable[[Prompt, str], bool]  # whether a prompt and an answer ("" for none yet) fit the model
Writable = Callable[[str], bool]  # whether the policy can write an answer within its generation budget


@dataclasses.dataclass(frozen=True)
class TaskSplit:
    train: tuple[Task, ...]
    heldout: tuple[Task, ...]

    def to_dict(self) -> dict:
        """What the run records: the task ids of each side."""
        return {"train": [t.task_id for t in self.train], "heldout": [t.task_id for t in self.heldout]}


def split_tasks(tasks: Sequence[Task], config: TrainConfig) -> TaskSplit:
    """The training and held-out tasks of `config.family` among `tasks` (see the module docstring)."""
    of_family = {t.task_id: t for t in tasks if t.family == config.family}
    if not of_family:
        raise UserError(f"no {config.family} tasks in {config.tasks_uri}")
    for what, ids in (("train.tasks", config.tasks), ("train.heldout", config.heldout)):
        unknown = [i for i in ids if i not in of_family]
        if unknown:
            raise UserError(
                f"{what}: no {config.family} task(s) {', '.join(unknown)} in {config.tasks_uri}; known: "
                f"{', '.join(sorted(of_family)[:12])}{' ...' if len(of_family) > 12 else ''}"
            )
    chosen = [of_family[i] for i in config.tasks] if config.tasks else list(of_family.values())
    order = sorted(chosen, key=lambda t: content_id(str(config.seed), t.task_id))
    if config.heldout:
        heldout = [of_family[i] for i in config.heldout]
    else:
        heldout = order[: config.heldout_count]
    rest = [t for t in order if t.task_id not in {h.task_id for h in heldout}]
    train = rest[: config.train_count] if config.train_count else rest
    if not train:
        raise UserError(
            f"no training tasks left: {len(chosen)} task(s), {len(heldout)} held out "
            "(train.heldout / train.heldout_count)"
        )
    return TaskSplit(tuple(train), tuple(heldout))


@dataclasses.dataclass(frozen=True)
class SFTPair:
    """A (prompt, answer) pair: the answer has the three sections and code that measured ok."""

    task_id: str
    variant_id: str
    score: float  # the variant's measured speedup
    system: str
    prompt: str  # the user message
    answer: str
    validated: str = "measured"  # measured (here, the variants table) | source:<origin> (train.sft.trust_source)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def example(self) -> dict:
        """The pair in TRL's conversational prompt-completion format."""
        return {
            "prompt": [{"role": "system", "content": self.system}, {"role": "user", "content": self.prompt}],
            "completion": [{"role": "assistant", "content": self.answer}],
        }


def answer_text(task: Task, variant: Variant) -> str:
    """An answer in the three sections for a variant that measured ok: the analysis the model
    wrote when it has one, else what the task's notes say about it; the design from the
    variant's own docstring; its code."""
    return _answer(
        task,
        variant.source,
        variant.analysis,
        f"This variant measured {variant.score:.2f}x the reference's speed on {variant.pool}.",
    )


def _answer(task: Task, source: str, analysis: str, measured: str) -> str:
    notes = _first_paragraph(task.notes)
    analysis = analysis.strip() or (f"{notes} " if notes else "") + measured
    design = _first_paragraph(module_docstring(source)) or (
        "Compute the same function as the reference with the implementation below instead of the reference's "
        "operations one after another."
    )
    family = families.find(task.family)
    fence = family.language if family is not None else "python"  # the block the family's prompt asks for
    return (
        f"### Performance Analysis\n{analysis}\n\n### Algorithm Design\n{design}\n\n"
        f"### Code Implementation\n```{fence}\n{source.rstrip()}\n```\n"
    )


def _first_paragraph(text: str) -> str:
    """The first paragraph of a docstring, minus `category:` lines, as one line."""
    lines = []
    for line in (text or "").strip().splitlines():
        if not line.strip():
            if lines:
                break
            continue
        if not line.lower().startswith("category:"):
            lines.append(line.strip())
    return " ".join(lines)


@dataclasses.dataclass(frozen=True)
class SFTData:
    """Stage 1's pairs and what became of the rest (every count is of candidate answers)."""

    pairs: tuple[SFTPair, ...]
    fewer_exemplars: int = 0  # pairs kept with fewer exemplars than asked, to fit
    dropped_too_long: int = 0  # answers left out: prompt + answer longer than the model's context
    heldout_skipped: int = 0  # source candidates of held-out (or unknown) tasks, never used
    dropped_unwritable: int = 0  # answers left out: longer than the policy's generation budget (`writable`)
    unusable: tuple[str, ...] = ()  # answers left out, "<task_id>: <why>" each (`unusable_answer`)

    def counts(self) -> dict[str, int]:
        by = {}
        for pair in self.pairs:
            by[pair.validated] = by.get(pair.validated, 0) + 1
        return {
            "pairs": len(self.pairs),
            "tasks": len({p.task_id for p in self.pairs}),
            "fewer_exemplars": self.fewer_exemplars,
            "dropped_too_long": self.dropped_too_long,
            "dropped_unwritable": self.dropped_unwritable,
            "dropped_unusable": len(self.unusable),
            "heldout_skipped": self.heldout_skipped,
            **{f"validated_{k}": v for k, v in sorted(by.items())},
        }

    def to_dict(self) -> dict:
        return {"pairs": [p.to_dict() for p in self.pairs], "counts": self.counts(), "unusable": list(self.unusable)}

    @classmethod
    def from_dict(cls, value: dict) -> "SFTData":
        counts = value.get("counts", {})
        return cls(
            tuple(SFTPair(**p) for p in value["pairs"]),
            int(counts.get("fewer_exemplars", 0)),
            int(counts.get("dropped_too_long", 0)),
            int(counts.get("heldout_skipped", 0)),
            int(counts.get("dropped_unwritable", 0)),
            tuple(value.get("unusable", ())),
        )


def sft_pairs(
    tasks: Sequence[Task],
    variants: VariantsTable,
    pool: str,
    exemplars: int,
    seed: int,
    fits: Fits | None = None,
    trusted: Sequence[Candidate] = (),
    writable: Writable | None = None,
    allow_precision_downgrade: bool = False,
) -> SFTData:
    """One pair per successful variant of each task on `pool`, and one per `trusted` candidate
    (validated by its source) of these tasks that the table does not already hold as measured:
    its prompt shows up to `exemplars` lower-scoring variants of the task (fewer when the prompt
    does not fit), its answer is answer_text. Left out and counted: an unusable answer
    (`unusable_answer`, with the evaluator's `allow_precision_downgrade`; a measured one passed
    the run-time checks already), one the policy could not write (`writable`), a pair that does
    not fit even without exemplars. Trusted candidates of other tasks (the held-out ones) are
    never used."""
    pairs: list[SFTPair] = []
    unusable: list[str] = []
    fewer = dropped = unwritable = 0
    wanted = {t.task_id for t in tasks}
    by_task: dict[str, list[Candidate]] = {}
    for candidate in trusted:
        by_task.setdefault(candidate.task_id, []).append(candidate)
    for task in tasks:
        ok = variants.successful(task.task_id, pool)
        answers = [
            (v.variant_id, v.score, answer_text(task, v), "measured", v.source)
            for v in sorted(ok, key=lambda v: (v.score, v.variant_id))
        ]
        measured = {v.variant_id for v in ok}
        for candidate in by_task.get(task.task_id, ()):
            if candidate.candidate_id not in measured:
                score = published_speedup(candidate)
                where = candidate.origin.removeprefix("import:")
                answers.append(
                    (
                        candidate.candidate_id,
                        score,
                        _answer(
                            task,
                            candidate.source,
                            "",
                            f"Its source ({where}) measured it at {score:.2f}x the reference's speed.",
                        ),
                        f"source:{where}",
                        candidate.source,
                    )
                )
        for answer_id, score, answer, validated, source in answers:
            why = unusable_answer(task, answer, source, allow_precision_downgrade, measured=validated == "measured")
            if why:
                unusable.append(f"{task.task_id}: {why}")
                continue
            if writable is not None and not writable(answer):
                unwritable += 1
                continue
            lower = [v for v in ok if v.score < score and v.variant_id != answer_id]
            rng = random.Random(content_id(str(seed), answer_id))
            chosen = sorted(rng.sample(lower, min(exemplars, len(lower))), key=lambda v: (v.score, v.variant_id))
            prompt = fitting_prompt(task, chosen, fits, answer)
            if prompt is None:
                dropped += 1
                continue
            fewer += len(prompt.exemplar_ids) < len(chosen)
            pairs.append(SFTPair(task.task_id, answer_id, score, prompt.system, prompt.user, answer, validated))
    skipped = sum(len(v) for k, v in by_task.items() if k not in wanted)
    return SFTData(tuple(pairs), fewer, dropped, skipped, unwritable, tuple(unusable))


def published_speedup(candidate: Candidate) -> float:
    """The speedup a candidate's source published for it (CUDA-L1's `score_default`), else 1.0."""
    import json

    try:
        published = json.loads(candidate.meta_json or "{}").get("published") or {}
    except (ValueError, AttributeError):
        return 1.0
    value = published.get("score_default")
    return float(value) if isinstance(value, (int, float)) and value > 0 else 1.0


def fitting_prompt(task: Task, chosen: Sequence[Variant], fits: Fits | None, answer: str = "") -> Prompt | None:
    """The prompt with the exemplars `chosen`, dropping the first ones until it fits with
    `answer`; None when it does not fit even without exemplars."""
    chosen = list(chosen)
    while True:
        prompt = render_prompt(task, exemplars_from_variants(chosen))
        if fits is None or fits(prompt, answer):
            return prompt
        if not chosen:
            return None
        chosen.pop(0)


def fitting_tasks(tasks: Sequence[Task], fits: Fits | None) -> tuple[Task, ...]:
    """The tasks whose prompt fits without exemplars: GRPO trains on these and leaves the others
    out (one task's long reference once stopped a whole run at its first step)."""
    return tuple(t for t in tasks if fitting_prompt(t, (), fits) is not None)


class LivePrompts:
    """GRPO's prompts, rendered when the trainer fetches a row (a `datasets` transform), with
    exemplars drawn from the variants table as it is at that step: variants found at step n are
    shown from step n + 1. The draw is seeded by the row and the task's successful variants, so
    a resumed run renders what the uninterrupted one did."""

    def __init__(
        self,
        tasks: Mapping[str, Task],
        variants: VariantsTable,
        policy: PolicyConfig,
        pool: str,
        seed: int,
        contrastive: bool = True,
        fits: Fits | None = None,
    ) -> None:
        self.tasks, self.variants, self.policy, self.pool = tasks, variants, policy, pool
        self.seed, self.contrastive, self.fits = seed, contrastive, fits

    def render(self, task_id: str, row: int) -> Prompt:
        task = self.tasks[task_id]
        chosen: list[Variant] = []
        if self.contrastive:
            parents = self.variants.successful(task_id, self.pool)
            state = ",".join(sorted(v.variant_id for v in parents))
            rng = random.Random(content_id(str(self.seed), task_id, str(row), state))
            chosen = sample_exemplars(parents, self.policy.exemplars, self.policy.tau, self.policy.buckets, rng)
            chosen.sort(key=lambda v: (v.score, v.variant_id))
        prompt = fitting_prompt(task, chosen, self.fits)
        if prompt is None:
            raise UserError(
                f"the prompt of {task_id} does not fit the model even without exemplars "
                "(raise train.grpo.max_prompt_tokens, or use a model with a longer context)"
            )
        return prompt

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        prompts = [self.render(task_id, row) for task_id, row in zip(batch["task_id"], batch["row"])]
        return {
            "prompt": [p.messages() for p in prompts],
            "task_id": list(batch["task_id"]),
            "row": list(batch["row"]),
            "parents": [list(p.exemplar_ids) for p in prompts],
        }
