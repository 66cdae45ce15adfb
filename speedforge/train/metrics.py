"""Per-step metrics of a stage: one JSON line each in `metrics.jsonl`, the numbers also to
TensorBoard, and both copied to the run's state in the store after every step (metrics.jsonl, and
the TensorBoard event files under tensorboard/, which `speedforge train tensorboard RUN` fetches).

    log = MetricsLog(run_dir / "metrics.jsonl", run_dir / "tensorboard", state)
    log.write({"stage": "grpo", "step": 3, **rollout_stats(rollouts), **times.as_dict()})

A GRPO or self-training step records the reward mean and max, the valid fraction (status ok),
the compiled fraction (built and ran: neither refused by the screen nor a compile error), the
speedup quantiles of its ok samples, its groups and how many of them had no signal (every sample
the same reward), the statuses with the most common reason of each failing
one (so a run whose samples all fail says why), and its time split into generation,
evaluation and update, with the evaluation hidden behind generation and the latency from a
sample generated to its reward known (speedforge.train.streaming.EvaluationTimeline); with
train.grpo.stale_steps 1, how many of its samples were generated a step ahead and how much of their
evaluation ran during the next batch's generation. A step written again after a resume replaces
the earlier line when read back (`read_metrics`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from speedforge.records import Rollout
from speedforge.stats import quantile

NOT_COMPILED = ("screen_rejected", "compile_error")
SAME_REWARD = 1e-9  # rewards of a group this close (relative) are the same: no signal
TENSORBOARD = "tensorboard"  # the event files' folder in a stage's state (runs/<run>/<stage>/tensorboard/)


@dataclasses.dataclass
class StepTimes:
    """Where a step's wall time went, in seconds; update = the rest (log-probs, loss, backward,
    optimizer, checkpoint bookkeeping). Evaluation that ran while the step still generated
    (`overlap_s`, rewards streamed: speedforge.train.streaming) is counted once, in generation."""

    generation_s: float = 0.0
    evaluation_s: float = 0.0  # wall time during which some evaluation call ran
    step_s: float = 0.0
    generated_tokens: int = 0  # completion tokens the step's generation produced (on this worker)
    overlap_s: float = 0.0  # of evaluation_s, the part within generation
    evaluation: dict[str, Any] = dataclasses.field(default_factory=dict)  # EvaluationTimeline.as_dict()

    @property
    def update_s(self) -> float:
        return max(0.0, self.step_s - self.generation_s - (self.evaluation_s - self.overlap_s))

    def as_dict(self) -> dict[str, Any]:
        out = {
            **self.evaluation,
            "generation_s": self.generation_s,
            "evaluation_s": self.evaluation_s,
            "overlap_s": self.overlap_s,
            "update_s": self.update_s,
            "step_s": self.step_s,
        }
        if self.generated_tokens and self.generation_s > 0:
            out |= {
                "generated_tokens": self.generated_tokens,
                "generation_tokens_per_s": self.generated_tokens / self.generation_s,
            }
        return out


def common_reasons(pairs: Iterable[tuple[str, str]], width: int = 160) -> dict[str, str]:
    """The most common reason of each failing status among (status, reason) pairs, cut to `width`
    characters; a status whose samples gave no reason is left out."""
    by_status: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for status, reason in pairs:
        if status != "ok" and reason.strip():
            by_status[status][reason.strip().splitlines()[0][:width]] += 1
    return {status: counts.most_common(1)[0][0] for status, counts in sorted(by_status.items())}


def rollout_stats(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """The reward and speedup figures of one step's samples."""
    rewards = [r.reward for r in rollouts if r.reward is not None]
    speedups = [r.speedup for r in rollouts if r.status == "ok" and r.speedup is not None]
    n = len(rollouts)
    return {
        "samples": n,
        "reward_mean": statistics.fmean(rewards) if rewards else None,
        "reward_max": max(rewards) if rewards else None,
        "valid_fraction": sum(r.status == "ok" for r in rollouts) / n if n else 0.0,
        "compiled_fraction": sum(r.status not in NOT_COMPILED for r in rollouts) / n if n else 0.0,
        "speedup_p50": quantile(speedups, 0.5),
        "speedup_p90": quantile(speedups, 0.9),
        "speedup_max": max(speedups) if speedups else None,
        "statuses": dict(collections.Counter(r.status for r in rollouts)),
        "groups": len({r.group_id for r in rollouts}),
        "groups_without_signal": groups_without_signal(rollouts),
        "reasons": common_reasons((r.status, json.loads(r.result_json).get("reason", "")) for r in rollouts),
    }


def groups_without_signal(rollouts: Sequence[Rollout]) -> int:
    """Groups whose samples all got the same reward: GRPO's advantage of each is 0, so they teach
    the policy nothing (TRL's frac_reward_zero_std is their share)."""
    by_group: dict[str, list[float]] = collections.defaultdict(list)
    for r in rollouts:
        if r.reward is not None:
            by_group[r.group_id].append(r.reward)
    return sum(
        max(rewards) - min(rewards) <= SAME_REWARD * max(1.0, abs(max(rewards))) for rewards in by_group.values()
    )


def tensorboard_writer_module() -> str | None:
    """The module whose SummaryWriter writes TensorBoard files here: tensorboardX, else torch's
    own (it needs the tensorboard package); None when neither can."""
    import importlib.util

    if importlib.util.find_spec("tensorboardX") is not None:
        return "tensorboardX"
    if importlib.util.find_spec("tensorboard") is not None:
        return "torch.utils.tensorboard"
    return None


def summary_writer(folder: Path):
    """A TensorBoard writer on `folder` whose flush() leaves every scalar added on disk (see
    tensorboard_writer_module): tensorboardX's event file written directly (ScalarEvents), or
    torch's SummaryWriter, whose flush() waits for its queue."""
    import importlib

    name = tensorboard_writer_module()
    if name is None:
        from speedforge.errors import UserError

        raise UserError("TensorBoard metrics need tensorboardX or tensorboard: pip install 'speedforge[train]'")
    if name == "tensorboardX":
        return ScalarEvents(folder)
    return importlib.import_module(name).SummaryWriter(str(folder))


class ScalarEvents:
    """Scalars in a TensorBoard event file, written as they are added. (tensorboardX's SummaryWriter
    hands its events to a thread, and its flush() does not wait for that thread: a file copied to
    the store right after flush() could lack the step just logged.)"""

    def __init__(self, folder: Path) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        Path(folder).mkdir(parents=True, exist_ok=True)
        self.events = EventsWriter(str(Path(folder) / "events"))  # events.out.tfevents.<time>.<host>

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        self.events.write_event(Event(wall_time=time.time(), step=int(step), summary=scalar(tag, float(value))))

    def flush(self) -> None:
        self.events.flush()

    def close(self) -> None:
        self.events.close()


class MetricsLog:
    """Appends metrics lines; numbers go to TensorBoard as `<stage>/<name>` at the step. With a
    `state`, both go to the run's store after every step (the event files to <stage>/tensorboard/:
    a pod's disk goes with the pod, the store stays)."""

    def __init__(self, path: Path, tensorboard_dir: Path | None = None, state=None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.state = state  # a speedforge.train.state.RunState, or None
        self.writer = None
        self.tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir is not None else None
        if self.tensorboard_dir is not None:
            self.writer = summary_writer(self.tensorboard_dir)

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": time.time(), **record}
        with self.path.open("a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
        if self.writer is not None:
            for name, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and name not in ("step", "time"):
                    self.writer.add_scalar(f"{record.get('stage', 'train')}/{name}", value, record.get("step", 0))
            self.writer.flush()
        if self.state is not None:
            self.state.put_text("metrics.jsonl", self.path.read_text())
            if self.tensorboard_dir is not None:  # this writer's event files (a resumed run's earlier ones stay there)
                self.state.upload(self.tensorboard_dir, TENSORBOARD)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            if self.state is not None and self.tensorboard_dir is not None:  # what close() wrote last
                try:
                    self.state.upload(self.tensorboard_dir, TENSORBOARD)
                except Exception as exc:  # close() runs in a `finally`: never hide the stage's own error
                    import sys

                    print(f"could not copy the TensorBoard files to {self.state.describe()}: {exc}", file=sys.stderr)


def read_metrics(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Metrics lines, the latest per (stage, kind, step), in stage order then step order."""
    latest: dict[tuple, dict] = {}
    order: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        stage = record.get("stage", "")
        if stage not in order:
            order.append(stage)
        latest[(stage, record.get("kind", "step"), record.get("step", 0))] = record
    return sorted(
        latest.values(), key=lambda r: (order.index(r.get("stage", "")), r.get("step", 0), r.get("kind", "step"))
    )


def plot_rewards(metrics: Sequence[dict[str, Any]], png: Path, title: str = "reward per step") -> Path:
    """The reward curve (mean and max per step, valid fraction on a second axis) as a PNG."""
    from speedforge.extras import require

    require("reports", "matplotlib", purpose="the reward-curve plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [m for m in metrics if m.get("reward_mean") is not None]
    figure, axis = plt.subplots(figsize=(7, 4), dpi=120)
    for stage in dict.fromkeys(m.get("stage", "") for m in rows):
        steps = [m["step"] for m in rows if m.get("stage", "") == stage]
        axis.plot(steps, [m["reward_mean"] for m in rows if m.get("stage", "") == stage], "o-", label=f"{stage} mean")
        axis.plot(steps, [m["reward_max"] for m in rows if m.get("stage", "") == stage], "^--", label=f"{stage} max")
    axis.set_xlabel("step")
    axis.set_ylabel("reward")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    valid = axis.twinx()
    valid.plot(
        [m["step"] for m in rows], [m["valid_fraction"] for m in rows], "s:", color="grey", label="valid fraction"
    )
    valid.set_ylabel("valid fraction")
    valid.set_ylim(0, 1)
    lines = axis.get_legend_handles_labels()
    extra = valid.get_legend_handles_labels()
    axis.legend(lines[0] + extra[0], lines[1] + extra[1], loc="best", fontsize="small")
    return _saved(figure, png, plt)


def _saved(figure, png, plt) -> Path:
    """`figure` laid out and written to `png` (its folder made), then closed."""
    figure.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png)
    plt.close(figure)
    return png


def plot_step_times(metrics: Sequence[dict[str, Any]], png: Path, title: str = "step time") -> Path:
    """Each step's time as stacked bars (generation, the evaluation not hidden behind it, update),
    the evaluation hidden behind generation (overlap) hatched within the generation bar, and below
    the p50/p90/max reward latency of its samples, as a PNG. A step that trained on a batch
    generated a step ahead (`stale_samples`, train.grpo.stale_steps) is marked * (its overlap also
    counts evaluation hidden behind the previous step's update)."""
    from speedforge.extras import require

    require("reports", "matplotlib", purpose="the step-time plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [m for m in metrics if m.get("kind", "step") == "step" and "step_s" in m]
    x = list(range(len(rows)))
    labels = [f"{m.get('stage', '')}{m.get('step')}{'*' if m.get('stale_samples') else ''}" for m in rows]
    generation = [m.get("generation_s", 0.0) for m in rows]
    overlap = [m.get("overlap_s", 0.0) for m in rows]
    exposed = [max(0.0, m.get("evaluation_s", 0.0) - m.get("overlap_s", 0.0)) for m in rows]
    update = [m.get("update_s", 0.0) for m in rows]
    figure, (times, latency) = plt.subplots(2, 1, figsize=(7, 6), dpi=120, sharex=True)
    times.bar(x, generation, label="generation")
    times.bar(x, overlap, fill=False, hatch="//", label="evaluation during generation")
    times.bar(x, exposed, bottom=generation, label="evaluation after generation")
    times.bar(x, update, bottom=[g + e for g, e in zip(generation, exposed)], label="update")
    times.set_ylabel("seconds")
    times.set_title(title + ("  (* one step stale)" if any(m.get("stale_samples") for m in rows) else ""))
    times.legend(loc="best", fontsize="small")
    for key, style in (("reward_latency_p50_s", "o-"), ("reward_latency_p90_s", "^--"), ("reward_latency_max_s", "s:")):
        latency.plot(x, [m.get(key) if m.get(key) is not None else float("nan") for m in rows], style, label=key[15:-2])
    latency.set_ylabel("reward latency (s)")
    latency.set_xticks(x, labels, rotation=90, fontsize="x-small")
    latency.legend(loc="best", fontsize="small")
    return _saved(figure, png, plt)
