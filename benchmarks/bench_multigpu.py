"""GRPO on 1 Ray Train worker against 2, from the runs' metrics lines (benchmarks/multigpu_check.sh).

    python benchmarks/bench_multigpu.py --one w1/metrics.jsonl --two w2/metrics.jsonl \\
        [--resumed w2/metrics.jsonl --resumed-step 9] [--target 1.7]

Per run: steps/s (1 / the median step time, the first step left out where there are more: it
loads the model and warms the caches), with the spread of the step times, and generation
tokens/s (each step's completion tokens of every rank over its slowest rank's generation time,
median over the same steps); then the ratio 2 workers / 1 against the target. From the lines'
`ranks` (what each rank did in the step): which ranks contributed to every step of the 2-worker
run, and, with --resumed, the step that ran after the resume and its ranks. Exit 1 when a rank
is missing from a step or the resumed step is absent (a functional failure, never a speed one).

A further line, apart from the figures above, takes only the timed steps in which no rank spent
QUIET_EVALUATION_S or more evaluating its samples: a sample that really runs in a sandbox (10-15 s
on a GPU) stops its own rank, and at the step's gather every other rank too; which steps get one
is up to what the policy writes. That line says what the rest of a step scales by.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from speedforge.train.metrics import read_metrics  # noqa: E402


def steps_of(path: str) -> list[dict]:
    return [m for m in read_metrics(open(path)) if m.get("kind", "step") == "step" and m.get("stage") == "grpo"]


QUIET_EVALUATION_S = 0.5  # a step whose every rank evaluated for less ran no sample in a sandbox for long


def quiet(steps: list[dict]) -> list[dict]:
    """The timed steps in which no rank evaluated for QUIET_EVALUATION_S or more, by each rank's own
    `evaluation_s`; a line of one rank may give it for the line alone. A line of several ranks
    without it (written before the ranks gave it) says nothing of the other ranks, and is left out."""

    def evaluation(m: dict) -> float:
        ranks = m.get("ranks") or []
        if ranks and all("evaluation_s" in r for r in ranks):
            return max(r["evaluation_s"] for r in ranks)
        return m.get("evaluation_s", 0.0) if len(ranks) <= 1 else float("inf")

    return [m for m in timed(steps) if evaluation(m) < QUIET_EVALUATION_S]


def timed(steps: list[dict]) -> list[dict]:
    """The steps that time the run: all but the first where there are more."""
    return steps[1:] if len(steps) > 1 else steps


def figures(steps: list[dict]) -> dict:
    """steps/s and generation tokens/s of a run (medians over its timed steps) and their spread."""
    times = [m["step_s"] for m in timed(steps)]
    rates = []
    for m in timed(steps):
        ranks = m.get("ranks") or [
            {"generated_tokens": m.get("generated_tokens", 0), "generation_s": m["generation_s"]}
        ]
        slowest = max(r["generation_s"] for r in ranks)
        if slowest > 0:
            rates.append(sum(r["generated_tokens"] for r in ranks) / slowest)
    return {
        "steps": len(steps),
        "timed": len(times),
        "step_s_median": statistics.median(times),
        "step_s_min": min(times),
        "step_s_max": max(times),
        "steps_per_s": 1 / statistics.median(times),
        "tokens_per_s": statistics.median(rates) if rates else 0.0,
    }


def rank_lines(steps: list[dict]) -> list[str]:
    return [
        f"  step {m['step']}: "
        + "; ".join(
            f"rank {r['rank']} {r['samples']} samples, {r['generated_tokens']} tokens "
            f"in {r['generation_s']:.2f} s" + where(r)
            for r in m.get("ranks", [])
        )
        for m in steps
    ]


def where(rank: dict) -> str:
    """ " on cuda:N (GPU)" from a rank's `device` and `gpu` (speedforge.train.stages.model_device), if any,
    and the static KV cache's length where the run decoded with one (train.grpo.static_cache)."""
    if not rank.get("device"):
        return ""
    cache = f", static KV cache of {rank['static_cache_len']}" if rank.get("static_cache_len") else ""
    return f" on {rank['device']}" + (f" ({rank['gpu']})" if rank.get("gpu") else "") + cache


def shares_a_gpu(ranks: list[dict]) -> bool:
    """Whether two ranks of a step report the same GPU (`gpu`, as the training writes it; lines
    without it, or CPU workers, share nothing)."""
    gpus = [r["gpu"] for r in ranks if r.get("gpu")]
    return len(gpus) != len(set(gpus))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", required=True, help="metrics.jsonl of the 1-worker run")
    parser.add_argument("--two", required=True, help="metrics.jsonl of the 2-worker run")
    parser.add_argument("--resumed", help="metrics.jsonl after the 2-worker run's resume")
    parser.add_argument("--resumed-step", type=int, default=0, help="the step the resume ran")
    parser.add_argument("--workers", type=int, default=2, help="workers of the --two run")
    parser.add_argument("--target", type=float, default=1.7, help="the steps/s ratio asked for")
    args = parser.parse_args(argv)

    one, two = steps_of(args.one), steps_of(args.two)
    if not one or not two:
        print(f"no GRPO step lines in {args.one if not one else args.two}")
        return 1
    f1, f2 = figures(one), figures(two)
    for label, f in (("1 worker", f1), (f"{args.workers} workers", f2)):
        print(
            f"{label}: {f['steps']} steps ({f['timed']} timed), step {f['step_s_median']:.2f} s median "
            f"({f['step_s_min']:.2f}-{f['step_s_max']:.2f}), {f['steps_per_s']:.3f} steps/s, "
            f"generation {f['tokens_per_s']:.1f} tokens/s"
        )
    ratio = f2["steps_per_s"] / f1["steps_per_s"]
    tokens = f2["tokens_per_s"] / f1["tokens_per_s"] if f1["tokens_per_s"] else float("nan")
    print(
        f"ratio {args.workers} workers / 1: steps/s {ratio:.2f}x (target {args.target}x: "
        f"{'met' if ratio >= args.target else 'not met'}), generation tokens/s {tokens:.2f}x"
    )
    q1, q2 = quiet(one), quiet(two)
    if q1 and q2:
        m1, m2 = statistics.median(m["step_s"] for m in q1), statistics.median(m["step_s"] for m in q2)
        print(
            f"steps where no rank evaluated for {QUIET_EVALUATION_S} s or more: 1 worker {len(q1)} of "
            f"{len(timed(one))}, {m1:.2f} s median; {args.workers} workers {len(q2)} of {len(timed(two))}, "
            f"{m2:.2f} s median; ratio {m1 / m2:.2f}x (apart from the figures above)"
        )
    print(f"ranks per step of the {args.workers}-worker run (rank 0's metrics line, gathered from every rank):")
    print("\n".join(rank_lines(two)))
    ok = True
    missing = [
        m["step"]
        for m in two
        if sorted(r["rank"] for r in m.get("ranks", [])) != list(range(args.workers))
        or not all(r["samples"] > 0 for r in m.get("ranks", []))
    ]
    if missing:
        print(f"steps where a rank is missing or contributed no sample: {missing}")
        ok = False
    shared = [m["step"] for m in two if shares_a_gpu(m.get("ranks", []))]
    if shared:
        print(f"steps where two ranks ran on the same GPU: {shared}")
        ok = False
    if args.resumed:
        # a line the stopped run wrote before the stop (its steps can outrun the stop) is not the resume's
        after = [m for m in steps_of(args.resumed) if m["step"] == args.resumed_step and m not in two]
        if not after:
            early = (
                " (the step's line from before the stop does not count)"
                if any(m["step"] == args.resumed_step for m in two)
                else ""
            )
            print(f"resume: no metrics line for step {args.resumed_step} from the resumed run{early}")
            ok = False
        else:
            print(
                f"resume: step {args.resumed_step} ran after the checkpoint, on ranks "
                f"{sorted(r['rank'] for r in after[0].get('ranks', []))}"
            )
            print("\n".join(rank_lines(after)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
