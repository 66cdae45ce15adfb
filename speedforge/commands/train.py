"""`speedforge train`: one training stage of a run, its status, and a held-out check.

speedforge train --stage sft --config train.yaml          # then --stage self, --stage grpo
speedforge train --stage grpo --config train.yaml --resume
speedforge train status RUN [--png reward.png]
speedforge train heldout --model CHECKPOINT [--samples 4]
speedforge train tensorboard RUN [--out DIR] [--serve]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from speedforge.config import Config, load_config
from speedforge.train.run import STAGES


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train the policy: SFT, self-training, contrastive GRPO (Ray Train)",
        description="Run one stage of a training run on Ray Train: sft (fine-tuning on validated variants), self "
        "(sample, keep what passes the evaluator, fine-tune) or grpo (contrastive GRPO, rewards measured by the "
        "evaluator). The run's settings are the config's train: section (with policy:, evaluator:, store:); its "
        "checkpoints, rollouts and variants go to the object store, so --resume continues at the exact step. "
        "A stage starts from the final weights of the run's earlier stage. Ends by printing the final "
        "checkpoint, which serve-policy and optimize --backend hf load.",
    )
    parser.add_argument("--stage", choices=STAGES, help="the stage to run")
    parser.add_argument("--resume", action="store_true", help="continue the stage from its last checkpoint")
    parser.add_argument("--run", help="run name (default: train.run)")
    parser.add_argument("--config", default=argparse.SUPPRESS, help="YAML config file with a train: section")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    parser.set_defaults(func=_train)
    sub = parser.add_subparsers(dest="train_command", metavar="ACTION")
    status = sub.add_parser(
        "status",
        help="the stages and per-step metrics of a run",
        description="Read a run's state and metrics back from its store: each stage's status, "
        "step and checkpoint, then a row per step (reward, valid fraction, speedups, time split).",
    )
    status.add_argument("run", nargs="?", help="run name (default: train.run)")
    status.add_argument("--png", help="also write the reward curve to this PNG file")
    status.add_argument("--last", type=int, default=0, help="show only the last N steps (default: all)")
    status.set_defaults(func=_status)
    heldout = sub.add_parser(
        "heldout",
        help="sample a model on the held-out tasks and evaluate the samples",
        description="Sample a model on the run's held-out tasks (train.heldout) and evaluate "
        "every sample: the fractions that compile and that pass correctness, and the best "
        "speedup per task.",
    )
    heldout.add_argument("--model", help="a checkpoint folder or .gguf file (default: policy.model)")
    heldout.add_argument("--samples", type=int, default=4, help="samples per held-out task (default: 4)")
    heldout.add_argument(
        "--batch-tasks",
        type=int,
        default=16,
        help="held-out tasks whose prompts x samples go to one batched generate call (default: 16)",
    )
    heldout.add_argument("--json", action="store_true", help="print the report as JSON")
    heldout.add_argument(
        "--samples-out",
        metavar="PATH",
        help="also write every sample (its text, how it ended, its result) to this JSONL file",
    )
    heldout.add_argument(
        "--generate-only",
        action="store_true",
        help="write the samples (--samples-out) and evaluate none: a machine whose time is short "
        "generates, another evaluates them with --samples-in",
    )
    heldout.add_argument(
        "--samples-in",
        metavar="PATH",
        help="evaluate the samples in this JSONL file (written by --samples-out) instead of "
        "generating: no model is loaded, the model's name and --samples come from the file",
    )
    heldout.set_defaults(func=_heldout)
    board = sub.add_parser(
        "tensorboard",
        help="fetch a run's TensorBoard files from its store and view them",
        description="Download the TensorBoard event files every stage of a run copied to its "
        "store (runs/<run>/<stage>/tensorboard/) into a local folder, one subfolder per stage, "
        "and print the `tensorboard --logdir` command that shows them (--serve runs it). "
        "Fetching again during a run adds only what is new.",
    )
    board.add_argument("run", nargs="?", help="run name (default: train.run)")
    board.add_argument("--out", help="local folder (default: <cache>/tensorboard/<run>)")
    board.add_argument(
        "--serve",
        action="store_true",
        help="run tensorboard on the folder (needs the tensorboard package: pip install tensorboard)",
    )
    board.add_argument("--port", type=int, default=6006, help="tensorboard's port with --serve (default: 6006)")
    board.set_defaults(func=_tensorboard)


def with_run(config: Config, run: str | None) -> Config:
    return dataclasses.replace(config, train=dataclasses.replace(config.train, run=run)) if run else config


def _train(args: argparse.Namespace) -> int:
    from speedforge.errors import UserError
    from speedforge.train.run import run_training
    from speedforge.reports.training import TrainPrinter

    if not args.stage:
        raise UserError("name a stage: speedforge train --stage sft|self|grpo --config FILE (or `train status RUN`)")
    config = with_run(load_config(getattr(args, "config", None)), args.run)
    outcome = run_training(config, args.stage, resume=args.resume, view=TrainPrinter())
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=1))
    else:
        print(f"run {outcome.run}: {outcome.stage} done after {outcome.steps} step(s)")
        print(f"final checkpoint: {outcome.final_checkpoint} (and {outcome.final_checkpoint_uri})")
        print(f"metrics: {outcome.metrics_path}")
        print(f"serve it: speedforge serve-policy --model {outcome.final_checkpoint}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from speedforge.train.run import train_status
    from speedforge.reports.training import stages_table, steps_table
    from speedforge.train.metrics import plot_rewards

    config = with_run(load_config(getattr(args, "config", None)), args.run)  # RUN checked as train.run is
    status = train_status(config, config.train.run)
    print(f"run {status.run} in {status.store_uri}")
    print(stages_table(status.states))
    steps = status.metrics[-args.last :] if args.last > 0 else status.metrics
    if steps:
        print()
        print(steps_table(steps))
    if args.png:
        print(f"reward curve: {plot_rewards(status.metrics, args.png, title=f'run {status.run}')}")
    return 0


def _tensorboard(args: argparse.Namespace) -> int:
    import os
    import shutil
    from pathlib import Path

    from speedforge.errors import UserError
    from speedforge.recipes.tensorboard_logs import fetch_tensorboard

    config = with_run(load_config(getattr(args, "config", None)), args.run)  # RUN checked as train.run is
    run = config.train.run
    out = Path(args.out) if args.out else Path(config.evaluator.cache_dir).expanduser() / "tensorboard" / run
    logs = fetch_tensorboard(config, run, out)
    print(
        f"run {logs.run}: {logs.files} event file(s) of {', '.join(logs.stages)} from {logs.store_uri} in {logs.folder}"
    )
    command = f"{logs.command} --port {args.port}"
    if not args.serve:
        print(f"view them: {command}")
        return 0
    binary = shutil.which("tensorboard")
    if binary is None:
        raise UserError(f"tensorboard is not installed (pip install tensorboard); the files are in {logs.folder}")
    print(f"running: {command}", flush=True)
    os.execv(binary, [binary, "--logdir", logs.folder, "--port", str(args.port)])
    return 0  # not reached: tensorboard replaced this process


def _heldout(args: argparse.Namespace) -> int:
    from speedforge.errors import UserError
    from speedforge.train.run import evaluate_heldout
    from speedforge.reports.text import print_table

    if args.samples < 1:
        raise UserError(f"--samples must be at least 1, got {args.samples}")
    if args.generate_only and (not args.samples_out or args.samples_in):
        raise UserError("--generate-only writes the samples to --samples-out (and takes no --samples-in)")
    if args.samples_in and args.model:
        raise UserError("--samples-in evaluates samples already generated: leave out --model")
    report = evaluate_heldout(
        load_config(getattr(args, "config", None)),
        args.model,
        args.samples,
        args.batch_tasks,
        args.samples_out,
        args.samples_in,
        args.generate_only,
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
        return 0
    if args.generate_only:
        print(
            f"model {report.model}: {report.samples} sample(s) of {len(report.tasks)} held-out task(s), "
            f"{report.generated_tokens} tokens in {report.generation_s:.0f} s, {report.truncated_fraction:.0%} cut at "
            f"max_new_tokens; written to {args.samples_out} (evaluate them: train heldout --samples-in "
            f"{args.samples_out})"
        )
        return 0
    print(
        f"model {report.model} on {len(report.tasks)} held-out task(s), {report.samples // max(len(report.tasks), 1)} "
        f"sample(s) each, pool {report.pool}"
    )
    print_table(
        ["task", "samples", "compiled", "correct", "best speedup", "statuses"],
        [
            [
                t["task_id"],
                t["samples"],
                f"{t['compiled_fraction']:.0%}",
                f"{t['valid_fraction']:.0%}",
                t["best_speedup"],
                ", ".join(f"{k} {v}" for k, v in t["statuses"].items()),
            ]
            for t in report.tasks
        ],
    )
    for task in report.tasks:
        for status, reason in task.get("reasons", {}).items():
            print(f"  {task['task_id']} {status}, most often: {reason}")
    median = f"{report.median_speedup:.2f}x" if report.median_speedup is not None else "-"
    print(
        f"overall: compiled {report.compiled_fraction:.0%}, correct {report.valid_fraction:.0%}, faster "
        f"{report.faster_fraction:.0%}, median speedup of the correct {median}, best speedup "
        f"{report.best_speedup if report.best_speedup is not None else '-'}; {report.truncated_fraction:.0%} cut at "
        f"max_new_tokens"
    )
    if report.top_failure:
        print(f"most common failure: {report.top_failure}")
    return 0
