"""What stage 1 teaches, checked pair by pair on CUDA-L1's corpus, on the CPU (no GPU, no weights).

    python benchmarks/sft_data_check.py                                   # ../shared/data/cuda-l1/a100.jsonl
    python benchmarks/sft_data_check.py --corpus PATH --heldout 16 --max-length 4096 --new-tokens 3072

Every published kernel of the corpus is made into the answer SFT would train on (`answer_text`'s
format) for its task's plain prompt, and checked against what the held-out check and GRPO do
with a sample: the code our parser extracts (`candidate_from`), Python that parses, the screen,
`ModelNew`'s constructor against the reference's, float32 precision lowered (which the evaluator
refuses by default), a forward that returns a tensor the module keeps (the fresh-outputs
contract), the three sections, the prompt against the one the held-out check renders, the chat
template (the prompt's tokens a prefix of prompt + answer, the completion exactly the answer and
the end of the turn: where TRL's completion-only loss starts and ends) and the answer's tokens
against the generation budget. Then the SFT data of the run's split is built twice, as stage 1
built it before answers were held to a budget and to what a sample must pass, and as it builds
it now. The tokenizer is the default model's (SmolLM2's GGUF).
"""

from __future__ import annotations

import argparse
import ast
import collections
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from speedforge.config import TrainConfig  # noqa: E402
from speedforge.evaluator.screen import screen  # noqa: E402
from speedforge.policy.default_model import default_model_file  # noqa: E402
from speedforge.policy.parser import candidate_from  # noqa: E402
from speedforge.policy.prompts import render_prompt  # noqa: E402
from speedforge.tasks.importers import import_source  # noqa: E402
from speedforge.train.answer_checks import kept_output, lowered_precision, takes_reference_arguments  # noqa: E402
from speedforge.train.data import _answer, published_speedup, sft_pairs, split_tasks  # noqa: E402
from speedforge.train.stages import answer_budget, token_budget  # noqa: E402
from speedforge.train.weights import training_tokenizer  # noqa: E402
from speedforge.variants import VariantsTable  # noqa: E402

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "cuda-l1" / "a100.jsonl"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--heldout", type=int, default=16, help="held-out tasks (train.heldout_count)")
    parser.add_argument("--seed", type=int, default=0, help="train.seed")
    parser.add_argument("--max-length", type=int, default=4096, help="sft.max_length")
    parser.add_argument("--new-tokens", type=int, default=3072, help="the generation budget (policy.max_new_tokens)")
    args = parser.parse_args()

    imported = import_source(args.corpus, kind="cuda-l1-jsonl", family="cuda", skip_bad=True)
    tasks = {t.task_id: t for t in imported.tasks}
    model = default_model_file()
    tokenizer = training_tokenizer(str(model.parent), model.name)
    eos = tokenizer.eos_token
    print(
        f"{args.corpus}: {len(tasks)} tasks, {len(imported.candidates)} kernels "
        f"({len(imported.problems)} line(s) skipped by the importer)"
    )

    counts: collections.Counter[str] = collections.Counter()
    answer_tokens: list[int] = []
    for kernel in imported.candidates:
        task = tasks[kernel.task_id]
        prompt = render_prompt(task)
        answer = _answer(task, kernel.source, "", f"Its source measured it at {published_speedup(kernel):.2f}x.")
        candidate, parsed = candidate_from(task, answer, "check")
        counts["kernels"] += 1
        counts["parser extracts other code"] += candidate.source != kernel.source.strip()
        counts["sections missing or notes"] += bool(parsed.missing or parsed.notes)
        counts["not valid Python"] += 0
        try:
            ast.parse(candidate.source)
        except SyntaxError:
            counts["not valid Python"] += 1
        counts["screen rejects"] += not screen(candidate.source, task.family).passed
        counts["constructor differs from Model's"] += not takes_reference_arguments(task.source, candidate.source)
        counts["lowers float32 precision (TF32 ...)"] += bool(lowered_precision(candidate.source))
        counts["forward returns a kept tensor (self.X)"] += bool(kept_output(candidate.source))
        messages = prompt.messages()
        prompt_ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        full_ids = tokenizer.apply_chat_template(
            messages + [{"role": "assistant", "content": answer}], tokenize=True, return_dict=True
        )["input_ids"]
        counts["prompt tokens not a prefix (loss mask)"] += full_ids[: len(prompt_ids)] != prompt_ids
        completion = full_ids[len(prompt_ids) :]
        counts["completion is not answer + end of turn"] += tokenizer.decode(completion) != answer + eos + "\n"
        tokens = len(tokenizer(answer + eos, add_special_tokens=False)["input_ids"])
        answer_tokens.append(tokens)
        for budget in (1024, 2048, 3072):
            counts[f"answer over {budget} tokens"] += tokens > budget
        counts[f"prompt + answer over {args.max_length} tokens"] += len(full_ids) > args.max_length
    width = max(map(len, counts))
    for key, value in counts.items():
        print(f"  {key:<{width}}  {value}")
    print(f"  answer tokens: median {statistics.median(answer_tokens):.0f}, max {max(answer_tokens)}")

    config = TrainConfig(
        family="cuda", tasks_uri=f"cuda-l1:{args.corpus}", heldout_count=args.heldout, train_count=0, seed=args.seed
    )
    split = split_tasks(imported.tasks, config)
    wanted = {t.task_id for t in split.train}
    trusted = [c for c in imported.candidates if c.task_id in wanted]
    print(
        f"split (seed {args.seed}): {len(split.train)} training, {len(split.heldout)} held-out tasks; "
        f"{len(trusted)} kernels of training tasks"
    )
    fits = token_budget(tokenizer, args.max_length)
    now = sft_pairs(
        split.train, VariantsTable(), "a100", 0, args.seed, fits, trusted, answer_budget(tokenizer, args.new_tokens)
    )
    kept = sft_pairs(split.train, VariantsTable(), "a100", 0, args.seed, fits, trusted).pairs  # no budget
    refused = {u.split(": ", 1)[0] for u in now.unusable}
    refused_fitting = sum(
        fits(render_prompt(tasks[c.task_id]), _answer(tasks[c.task_id], c.source, "", "x"))
        for c in trusted
        if c.task_id in refused
    )
    long = sum(len(tokenizer(p.answer + eos, add_special_tokens=False)["input_ids"]) > args.new_tokens for p in kept)
    print(
        f"  before (answers unchecked): {len(kept) + refused_fitting} pairs within {args.max_length} tokens, "
        f"{refused_fitting} of them unusable (answer_checks), {long} with an answer over "
        f"{args.new_tokens} tokens"
    )
    print(f"  now: {now.counts()}")
    for reason in now.unusable:
        print(f"    unusable: {reason}")
    differ = sum(
        (p.system, p.prompt) != (render_prompt(tasks[p.task_id]).system, render_prompt(tasks[p.task_id]).user)
        for p in now.pairs
    )
    print(f"  pairs whose prompt is not the held-out check's prompt for the task: {differ} of {len(now.pairs)}")
    held = {t.task_id for t in split.heldout}

    def tokens_of(c):
        return len(
            tokenizer(
                _answer(tasks[c.task_id], c.source, "", "x") + eos,  # noqa: E731
                add_special_tokens=False,
            )["input_ids"]
        )

    over = [c.task_id for c in imported.candidates if c.task_id in held and tokens_of(c) > args.new_tokens]
    print(
        f"  held-out tasks whose published kernel, as an answer, is over {args.new_tokens} tokens: {len(over)} of "
        f"{len(held)} ({sum(c.task_id in held for c in imported.candidates)} have one){': ' if over else ''}"
        f"{', '.join(over)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
