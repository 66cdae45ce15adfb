"""Where a GRPO step's time goes, and the summary of a training check.

    python benchmarks/bench_train.py METRICS.jsonl                       # the step-time split
    python benchmarks/bench_train.py METRICS.jsonl --heldout before=h0.json --heldout sft=h1.json \\
        --heldout grpo=h2.json --out DIR                                  # + summary.{json,md}, reward_curve.png, step_times.png

METRICS is a stage's metrics file (`speedforge train` prints its path; `train status` reads the
same lines back). For each stage with steps it prints the median, the spread (min-max and the
interquartile range) and the share of generation, evaluation, overlap and update over its steps:
overlap is the evaluation that ran while the step generated (rewards streamed, train.grpo.reward_chunks),
and update the step's wall time less generation and the evaluation not hidden behind it (log-probs,
loss, backward, optimizer step, checkpoint).
The held-out files are `speedforge train heldout --json` outputs (fraction compiling, fraction
correct, best speedup), labelled by the point of the run they were taken at. Steps of a stage
that was cut short count as they are; a missing held-out file is reported as missing.
benchmarks/train_check.sh runs the whole check (held-out, SFT, held-out, GRPO, held-out) and
calls this at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

PARTS = ("generation_s", "evaluation_s", "overlap_s", "update_s", "step_s")


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def split(metrics: list[dict], stage: str) -> dict:
    """The time split of `stage`'s step lines: per part median, quartiles, min, max, share of the
    summed step time; and the step count."""
    steps = [m for m in metrics if m.get("stage") == stage and m.get("kind", "step") == "step" and "step_s" in m]
    out: dict = {"stage": stage, "steps": len(steps)}
    total = sum(m["step_s"] for m in steps) or 1.0
    for part in PARTS:
        values = [float(m.get(part, 0.0)) for m in steps]
        if not values:
            continue
        q1, median, q3 = quartiles(values)
        out[part] = {
            "median": median,
            "q1": q1,
            "q3": q3,
            "min": min(values),
            "max": max(values),
            "share": sum(values) / total,
        }
    return out


def split_table(row: dict) -> str:
    lines = [
        f"{row['stage']}: {row['steps']} step(s)",
        f"  {'part':<11} {'median s':>9} {'IQR s':>15} {'min-max s':>17} {'share':>6}",
    ]
    for part in PARTS:
        if part in row:
            p = row[part]
            lines.append(
                f"  {part[:-2]:<11} {p['median']:>9.2f} {p['q1']:>7.2f}-{p['q3']:<7.2f} "
                f"{p['min']:>8.2f}-{p['max']:<8.2f} {p['share']:>6.0%}"
            )
    return "\n".join(lines)


def rewards(metrics: list[dict], stage: str) -> dict:
    rows = [m for m in metrics if m.get("stage") == stage and m.get("reward_mean") is not None]
    if not rows:
        return {}
    speedups = [m["speedup_max"] for m in rows if m.get("speedup_max") is not None]
    rates = [m["generation_tokens_per_s"] for m in rows if m.get("generation_tokens_per_s")]
    return {
        "generation_tokens_per_s_median": statistics.median(rates) if rates else None,
        "first_reward_mean": rows[0]["reward_mean"],
        "last_reward_mean": rows[-1]["reward_mean"],
        "best_reward": max(m["reward_max"] for m in rows),
        "valid_fraction": statistics.fmean(m["valid_fraction"] for m in rows),
        "compiled_fraction": statistics.fmean(m.get("compiled_fraction", 0.0) for m in rows),
        "best_speedup": max(speedups, default=None),
        "samples": sum(m.get("samples", 0) for m in rows),
    }


def read_heldout(spec: str) -> tuple[str, dict | None]:
    label, _, path = spec.partition("=")
    if not path:
        raise SystemExit(f"--heldout wants LABEL=FILE, got {spec!r}")
    try:
        return label, json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return label, None


def markdown(summary: dict) -> str:
    lines = ["# Training check", ""]
    for key in ("device", "note"):
        if summary.get(key):
            lines.append(f"- {key}: {summary[key]}")
    lines += [
        "",
        "## Held-out tasks",
        "",
        "| when | model | tasks x samples | compiled | correct | faster | median speedup (correct) | best speedup "
        "| cut at max tokens | most common failure |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, report in summary["heldout"].items():
        if report is None:
            lines.append(f"| {label} | (missing: that step failed or ran out of time) | | | | | | | | |")
            continue
        samples = sum(t["samples"] for t in report["tasks"])
        best, median = report["best_speedup"], report.get("median_speedup")
        lines.append(
            f"| {label} | {report['model']} | {len(report['tasks'])} x {samples // max(1, len(report['tasks']))} "
            f"| {report['compiled_fraction']:.0%} | {report['valid_fraction']:.0%} | "
            f"{report.get('faster_fraction', 0):.0%} | {'-' if median is None else f'{median:.2f}x'} | "
            f"{'-' if best is None else f'{best:.2f}x'} | {report.get('truncated_fraction', 0):.0%} | "
            f"{report.get('top_failure', '')[:160].replace('|', '/')} |"
        )
    lines += ["", "## Step time", ""]
    for row in summary["split"]:
        lines += ["```", split_table(row), "```", ""]
    for stage, figures in summary["rewards"].items():
        if figures:
            lines.append(
                f"- {stage} rewards: "
                + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
            )
    if summary.get("reward_curve"):
        lines += ["", f"![reward curve]({Path(summary['reward_curve']).name})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl file(s) of the run's stages")
    parser.add_argument("--heldout", action="append", default=[], help="LABEL=FILE of `train heldout --json` output")
    parser.add_argument("--out", help="write summary.json, summary.md, reward_curve.png and step_times.png here")
    parser.add_argument("--device", default="", help="the machine, in words, for the summary")
    parser.add_argument("--note", default="", help="a line for the summary (e.g. the box was shared)")
    args = parser.parse_args(argv)

    from speedforge.train.metrics import read_metrics

    lines: list[str] = []
    for path in args.metrics:
        if Path(path).is_file():
            lines += Path(path).read_text().splitlines()
        else:
            print(f"(no metrics file {path}: that stage did not run)")
    metrics = read_metrics(lines)
    stages = list(dict.fromkeys(m.get("stage", "") for m in metrics))
    summary = {
        "device": args.device,
        "note": args.note,
        "metrics": args.metrics,
        "split": [split(metrics, s) for s in stages],
        "rewards": {s: rewards(metrics, s) for s in stages},
        "heldout": dict(read_heldout(h) for h in args.heldout),
        "reward_curve": None,
    }
    for row in summary["split"]:
        print(split_table(row))
    for label, report in summary["heldout"].items():
        if report is None:
            print(f"held-out {label}: missing")
        else:
            print(
                f"held-out {label}: compiled {report['compiled_fraction']:.0%}, correct {report['valid_fraction']:.0%}, "
                f"faster {report.get('faster_fraction', 0):.0%}, median speedup {report.get('median_speedup')}, "
                f"best speedup {report['best_speedup']}; most common failure: {report.get('top_failure', '')}"
            )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        if any(m.get("reward_mean") is not None for m in metrics):
            from speedforge.train.metrics import plot_rewards, plot_step_times

            summary["reward_curve"] = str(plot_rewards(metrics, out / "reward_curve.png", title="reward per step"))
            summary["step_times"] = str(plot_step_times(metrics, out / "step_times.png", title="time per step"))
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        (out / "summary.md").write_text(markdown(summary))
        print(f"summary: {out / 'summary.md'}")
    return 0 if metrics else 1


if __name__ == "__main__":
    sys.exit(main())
