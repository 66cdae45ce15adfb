"""GRPO step time with a step's rewards overlapped with its generation, against the serial step.

The GRPO stage (speedforge.train.stages, through `speedforge.train.run.run_training`) places a
step's reward evaluation in one of three ways, each measured here as a mode:

- serial:   train.grpo.reward_chunks 1, stale_steps 0: generate, then evaluate, then update;
- streamed: reward_chunks N (--chunks): completions go to the evaluation in N parts while the
            step still generates (speedforge.train.streaming);
- stale:    stale_steps 1: the next step's batch is generated while this step's rewards are
            measured, trained one step stale (speedforge.train.lookahead).

Each mode runs the same model, batch (prompts x generations), max_new_tokens, seed and steps, with
a run name and store of its own, one after the other in this process; --rounds repeats the three,
interleaved (every other round in reverse order), to expose drift. Figures are the steps after the
first (which has nothing to overlap) of the stage's metrics lines.

    python benchmarks/bench_train_overlap.py --evaluation service --pool cuda --prompts 8 --generations 8 \\
        --steps 6 --rounds 2 --out DIR                                     # GPU host, the real evaluation
    python benchmarks/bench_train_overlap.py --evaluation fixed --eval-s-per-sample 0.5 --prompts 8 \\
        --generations 8 --steps 6 --rounds 2 --out DIR                     # GPU host, a fixed evaluation cost
    python benchmarks/bench_train_overlap.py --device cpu --model TINY_MODEL_DIR --evaluation fixed \\
        --eval-s-per-sample 0.3 --steps 3 --max-new-tokens 16 --out DIR    # CPU smoke

--evaluation service: the Ray evaluation service on --pool (cpu: the cpp family's tasks; cuda: the
cuda family's, on this machine's GPU pool), as `speedforge train` uses it with its config (--config).
It needs the logical CPUs of Ray Train's trainer, the training workers and a bench and a build
worker at once: on a 2-core machine (CPU slots 2) the bench worker never started ("no worker of cpu
started within 120 s"), so use it on a GPU host.
--evaluation fixed: a STAND-IN evaluator, labelled so in every output: each call sleeps
--eval-s-per-sample seconds per candidate in the evaluation thread (the generating process waits
for it as it would for the real service), and every result is status runtime_error with a reason
saying it was not run; it sets the evaluation's weight in the step, so the overlap's effect is
measured where evaluation is at least a third of a serial step (the target's precondition).

Prints per mode the step time (median, min-max, IQR), the median generation, evaluation, overlap
and update, the evaluation share of the serial step (and whether it is at least 1/3), and the
ratios serial/streamed and serial/stale of the median step times (with --rounds > 1 also the
median and min-max of the per-round ratios). Target: >= 1.3x where evaluation is >= 1/3 of a
serial step. --out DIR writes overlap.json (every step line, the machine and versions) and overlap.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("serial", "streamed", "stale")
PARTS = ("generation_s", "evaluation_s", "overlap_s", "update_s")
SHARE_NEEDED = 1 / 3  # the target's precondition: evaluation at least this share of a serial step
TARGET = 1.3
STAND_IN_STATUS = "runtime_error"


def fixed_evaluation(seconds_per_sample: float, pool: str):
    """The stand-in BatchEvaluate of --evaluation fixed: sleeps `seconds_per_sample` per candidate
    of the call, then gives each a runtime_error result saying that nothing ran. A closure that
    refers only to the library, so that Ray ships it to the training workers by value."""

    def evaluate(candidates):
        import time as clock

        from speedforge.records import EvalResult

        clock.sleep(seconds_per_sample * len(candidates))
        return [
            EvalResult(
                candidate_id=c.candidate_id,
                task_id=c.task_id,
                pool=pool,
                status="runtime_error",
                reason=f"not run: the overlap benchmark's stand-in evaluator ({seconds_per_sample} s per sample)",
            )
            for c in candidates
        ]

    return evaluate


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def timed(lines: list[dict], mode: str, round_no: int | None = None) -> list[dict]:
    """The step lines of `mode` (of one round, or every round) after each run's first step."""
    return [
        m
        for m in lines
        if m["mode"] == mode and m["step"] > 1 and (round_no is None or m["round"] == round_no) and "step_s" in m
    ]


def mode_figures(lines: list[dict], mode: str) -> dict:
    """Step time median, quartiles and min-max, the parts' medians and the sample counts of `mode`'s
    timed steps over every round."""
    steps = timed(lines, mode)
    if not steps:
        return {"mode": mode, "timed_steps": 0}
    step_s = [float(m["step_s"]) for m in steps]
    q1, median, q3 = quartiles(step_s)
    out = {
        "mode": mode,
        "timed_steps": len(steps),
        "step_s_median": median,
        "step_s_q1": q1,
        "step_s_q3": q3,
        "step_s_min": min(step_s),
        "step_s_max": max(step_s),
    }
    for part in PARTS:
        out[f"{part}_median"] = statistics.median(float(m.get(part, 0.0)) for m in steps)
    out["evaluation_share_median"] = statistics.median(float(m.get("evaluation_s", 0.0)) / m["step_s"] for m in steps)
    out["stale_samples"] = sum(int(m.get("stale_samples", 0)) for m in steps)
    out["streamed_samples"] = sum(int(m.get("streamed_samples", 0)) for m in steps)
    return out


def ratio(lines: list[dict], mode: str, round_no: int | None = None) -> float | None:
    """Median serial step time over median `mode` step time (of one round, or every round)."""
    serial, other = timed(lines, "serial", round_no), timed(lines, mode, round_no)
    if not serial or not other:
        return None
    return statistics.median(m["step_s"] for m in serial) / statistics.median(m["step_s"] for m in other)


def summarize(lines: list[dict], rounds: int) -> dict:
    """Every figure the table shows, from the step lines (each labelled with its mode and round)."""
    modes = [m for m in MODES if any(line["mode"] == m for line in lines)]
    figures = {mode: mode_figures(lines, mode) for mode in modes}
    share = figures.get("serial", {}).get("evaluation_share_median")
    out: dict = {
        "modes": figures,
        "evaluation_share_of_serial_step": share,
        "share_needed": SHARE_NEEDED,
        "precondition_held": None if share is None else share >= SHARE_NEEDED,
        "target": TARGET,
        "ratios": {},
    }
    for mode in modes:
        if mode == "serial":
            continue
        entry = {"of_medians": ratio(lines, mode)}
        if rounds > 1:
            per_round = [r for r in (ratio(lines, mode, n) for n in range(1, rounds + 1)) if r is not None]
            if per_round:
                entry |= {
                    "per_round": per_round,
                    "per_round_median": statistics.median(per_round),
                    "per_round_min": min(per_round),
                    "per_round_max": max(per_round),
                }
        out["ratios"][f"serial/{mode}"] = entry
    return out


def table(summary: dict, chunks: int) -> str:
    """The per-mode table, the evaluation share and the ratios, as text."""
    names = {"serial": "serial", "streamed": f"streamed({chunks})", "stale": "stale(1)"}
    lines = [
        f"{'mode':<13} {'steps':>5} {'step s':>8} {'min-max s':>15} {'IQR s':>15} {'gen s':>7} {'eval s':>7} "
        f"{'overlap s':>9} {'update s':>8} {'streamed':>8} {'stale':>6}"
    ]
    for mode, f in summary["modes"].items():
        if not f["timed_steps"]:
            lines.append(f"{names[mode]:<13} {0:>5}  (no step after the first)")
            continue
        lines.append(
            f"{names[mode]:<13} {f['timed_steps']:>5} {f['step_s_median']:>8.2f} "
            f"{f['step_s_min']:>7.2f}-{f['step_s_max']:<7.2f} {f['step_s_q1']:>7.2f}-{f['step_s_q3']:<7.2f} "
            f"{f['generation_s_median']:>7.2f} {f['evaluation_s_median']:>7.2f} {f['overlap_s_median']:>9.2f} "
            f"{f['update_s_median']:>8.2f} {f['streamed_samples']:>8} {f['stale_samples']:>6}"
        )
    share = summary["evaluation_share_of_serial_step"]
    if share is None:
        lines.append("evaluation share of the serial step: unknown (no serial step after the first)")
    else:
        held = "held" if summary["precondition_held"] else "NOT held: the ratios do not test the target"
        lines.append(f"evaluation share of the serial step: {share:.0%} (precondition >= 1/3: {held})")
    for name, entry in summary["ratios"].items():
        value = entry["of_medians"]
        text = "-" if value is None else f"{value:.2f}x"
        if "per_round" in entry:
            text += (
                f" (per-round medians: {entry['per_round_median']:.2f}x, min {entry['per_round_min']:.2f}x, "
                f"max {entry['per_round_max']:.2f}x, n={len(entry['per_round'])})"
            )
        lines.append(f"{name}: {text}   (target >= {TARGET}x)")
    return "\n".join(lines)


def versions(device: str) -> dict:
    """The machine and the versions the figures were taken with."""
    import importlib.metadata

    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "trl", "ray", "speedforge"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    machine = {
        "host": platform.node(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "tree": commit.stdout.strip() or None,
    }
    return {"machine": machine, "versions": found}


def mode_config(base, args, mode: str, round_no: int, scratch: Path):
    """The root config of one mode's run: `base` with the benchmark's model, batch and placement."""
    grpo = dataclasses.replace(
        base.train.grpo,
        steps=args.steps,
        prompts_per_step=args.prompts,
        generations=args.generations,
        max_new_tokens=args.max_new_tokens,
        save_every=args.steps,  # one checkpoint, at the end: the steps time the overlap, not uploads
        reward_chunks=args.chunks if mode == "streamed" else 1,
        stale_steps=1 if mode == "stale" else 0,
    )
    ray = base.train.ray
    ray = dataclasses.replace(
        ray,
        use_gpu=args.device == "cuda",
        cpus_per_worker=args.cpus_per_worker or ray.cpus_per_worker,
    )
    train = dataclasses.replace(
        base.train,
        run=f"overlap-{mode}-r{round_no}",
        store=str(scratch / f"store-{mode}-r{round_no}"),
        work_dir=str(scratch / "work"),
        family="cuda" if args.pool == "cuda" else base.train.family,
        init=args.init or base.train.init,
        evaluation="service" if args.evaluation == "service" else "local",
        pool="cpu" if args.pool == "cpu" else base.train.pool,
        seed=args.seed,
        ray=ray,
        grpo=grpo,
    )
    policy = dataclasses.replace(base.policy, model=args.model or base.policy.model, device=args.device)
    models = dataclasses.replace(base.models, warm_start=False)  # every mode starts from the same named weights
    return dataclasses.replace(base, policy=policy, train=train, models=models)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_train_overlap.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="speedforge config YAML the runs start from (default: the embedded one)")
    parser.add_argument("--model", default="", help="policy.model: a folder or GGUF (default: the default model)")
    parser.add_argument("--init", default="", help="train.init: the starting weights (default: the model's)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if torch sees a GPU")
    parser.add_argument("--evaluation", choices=("service", "fixed"), required=True)
    parser.add_argument("--pool", choices=("cpu", "cuda"), default=None, help="default: the --device")
    parser.add_argument("--eval-s-per-sample", type=float, default=0.0, help="--evaluation fixed: seconds a sample")
    parser.add_argument("--chunks", type=int, default=4, help="train.grpo.reward_chunks of the streamed mode (> 1)")
    parser.add_argument("--prompts", type=int, default=2, help="train.grpo.prompts_per_step")
    parser.add_argument("--generations", type=int, default=4, help="train.grpo.generations (completions a prompt)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="train.grpo.max_new_tokens")
    parser.add_argument("--steps", type=int, default=4, help="steps a run (the first is left out of the figures)")
    parser.add_argument("--rounds", type=int, default=1, help="the three modes, this many times, interleaved")
    parser.add_argument("--seed", type=int, default=0, help="train.seed of every run")
    parser.add_argument("--cpus-per-worker", type=float, default=0.0, help="train.ray.cpus_per_worker (0: config's)")
    parser.add_argument("--scratch", help="stores and work folders (default: a temporary folder, removed)")
    parser.add_argument("--out", help="write overlap.json and overlap.md here")
    args = parser.parse_args(argv)
    problems = [
        (args.chunks < 2, f"--chunks must be at least 2 (1 is the serial mode), got {args.chunks}"),
        (args.steps < 2, f"--steps must be at least 2 (the first step is left out), got {args.steps}"),
        (args.rounds < 1, f"--rounds must be at least 1, got {args.rounds}"),
        (args.prompts < 1, f"--prompts must be at least 1, got {args.prompts}"),
        (args.generations < 2, f"--generations must be at least 2 (a GRPO group), got {args.generations}"),
        (args.max_new_tokens < 1, f"--max-new-tokens must be at least 1, got {args.max_new_tokens}"),
        (args.cpus_per_worker < 0, f"--cpus-per-worker must be positive (0: the config's), got {args.cpus_per_worker}"),
        (
            args.evaluation == "fixed" and not args.eval_s_per_sample > 0,
            f"--evaluation fixed needs --eval-s-per-sample above 0, got {args.eval_s_per_sample}",
        ),
        (
            args.evaluation == "service" and args.eval_s_per_sample,
            "--eval-s-per-sample is for --evaluation fixed (the service takes what it takes)",
        ),
    ]
    for wrong, message in problems:
        if wrong:
            parser.exit(2, f"{parser.prog}: error: {message}\n")
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.pool is None:
        args.pool = args.device
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.exit(2, f"{parser.prog}: error: --device cuda, and torch sees no GPU here\n")
    return args


def evaluation_label(args) -> str:
    if args.evaluation == "fixed":
        return (
            f"STAND-IN evaluator, not the real one: {args.eval_s_per_sample} s per sample slept in the evaluation "
            f"thread, every result {STAND_IN_STATUS} (not run)"
        )
    return f"the Ray evaluation service on the {args.pool} pool"


def run(args) -> dict:
    """Every mode of every round; the step lines labelled with their mode and round."""
    from speedforge.cluster.session import ray_session
    from speedforge.config import load_config
    from speedforge.train.metrics import read_metrics
    from speedforge.train.run import run_training

    from speedforge.policy.backends import resolve_model

    base = load_config(args.config)
    for model in {args.model or base.policy.model, args.init or base.train.init} - {""}:
        resolve_model(model)  # a path that is not a model fails here, before Ray starts
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="bench-train-overlap-"))
    lines: list[dict] = []
    runs: list[dict] = []
    try:
        with ray_session(base.train.ray.address or None, base.service):  # one Ray for every run
            for round_no in range(1, args.rounds + 1):
                order = MODES if round_no % 2 else tuple(reversed(MODES))
                for mode in order:
                    config = mode_config(base, args, mode, round_no, scratch)
                    pool = config.train.pool or args.pool
                    stand_in = fixed_evaluation(args.eval_s_per_sample, pool) if args.evaluation == "fixed" else None
                    print(f"round {round_no}: {mode} ({config.train.run})", flush=True)
                    began = time.perf_counter()
                    outcome = run_training(config, "grpo", evaluate=stand_in)
                    wall = time.perf_counter() - began
                    steps = [
                        m
                        for m in read_metrics(open(outcome.metrics_path))
                        if m.get("stage") == "grpo" and m.get("kind", "step") == "step"
                    ]
                    lines += [{"mode": mode, "round": round_no, **m} for m in steps]
                    runs.append({"mode": mode, "round": round_no, "run": outcome.run, "wall_s": wall})
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return {"runs": runs, "lines": lines}


def markdown(result: dict, text: str) -> str:
    s = result["settings"]
    head = [
        "# GRPO step time, rewards overlapped with generation",
        "",
        f"- evaluation: {result['evaluation']}",
        f"- model: {s['model'] or '(the default model)'}" + (f", init {s['init']}" if s["init"] else ""),
        f"- batch: {s['prompts']} prompts x {s['generations']} generations, {s['max_new_tokens']} new tokens, "
        f"{s['steps']} steps (the first left out), {s['rounds']} round(s), seed {s['seed']}",
        f"- machine: {result['machine']}",
        f"- versions: {result['versions']}",
        "",
        "```",
        text,
        "```",
        "",
    ]
    return "\n".join(head)


def main(argv: list[str] | None = None) -> int:
    from speedforge.errors import UserError, first_line

    args = parse(argv)
    label = evaluation_label(args)
    print(f"evaluation: {label}", flush=True)
    try:
        measured = run(args)
    except UserError as exc:
        print(f"bench_train_overlap.py: error: {first_line(exc, 400)}", file=sys.stderr)
        return 2
    summary = summarize(measured["lines"], args.rounds)
    text = table(summary, args.chunks)
    print(text)
    result = {
        "evaluation": label,
        "stand_in": args.evaluation == "fixed",
        "settings": {
            k: getattr(args, k)
            for k in (
                "model",
                "init",
                "config",
                "device",
                "evaluation",
                "pool",
                "eval_s_per_sample",
                "chunks",
                "prompts",
                "generations",
                "max_new_tokens",
                "steps",
                "rounds",
                "seed",
            )
        },
        **versions(args.device),
        "summary": summary,
        **measured,
    }
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "overlap.json").write_text(json.dumps(result, indent=1))
        (out / "overlap.md").write_text(markdown(result, f"evaluation: {label}\n{text}"))
        print(f"written: {out / 'overlap.json'}, {out / 'overlap.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
