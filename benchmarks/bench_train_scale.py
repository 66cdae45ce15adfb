"""GRPO on a 7B-class shape: LoRA on one GPU, FSDP full fine-tuning over 1, 2 and 4 GPUs.

THROUGHPUT BENCHMARK, RANDOM WEIGHTS, NOT TRAINING: the model is built from a public architecture's
configuration shipped in benchmarks/shapes/ (qwen2.5-7b.json: Qwen2.5-7B-Instruct's config.json;
tiny.json: the same architecture at a size the CPU runs in seconds) with random weights, and
SmolLM2's tokenizer (the default model's; ids past its vocabulary decode to nothing). Each
configuration is a real GRPO stage (`speedforge.train.run.run_training`: Ray Train workers,
the memory plan, TRL's GRPOTrainer, train.strategy) whose completions go through the real reward
path (parser, evaluator, rewards) of the family's built-in tasks, cuda on a GPU, cpp on the CPU;
random weights write no program, so every sample scores as a format failure, and the figures are
the machinery's speed, never learning.

    python benchmarks/bench_train_scale.py --strategy lora                       # one GPU
    python benchmarks/bench_train_scale.py --strategy fsdp --gpus 1,2,4          # 1 -> 2 -> 4 GPUs
    python benchmarks/bench_train_scale.py --strategy fsdp --gpus 1,2 --layers 14  # half the layers: 1 GPU fits
    python benchmarks/bench_train_scale.py --shape tiny --strategy lora --steps 2  # CPU smoke

Per configuration: the memory plan (from the stage's state), peak GPU memory of its workers, step
time (median and min-max over the steps after the first, which loads and warms up), sequences a
second (prompts x generations / step time) and generated tokens a second (each step's tokens of
every worker over its slowest worker's generation time). --strategy lora also times plain batched
`generate` of the same model (base + the adapter the stage wrote, bf16 on a GPU) on the same batch
of the same prompt in this process, and prints plain / GRPO generation tokens/s (target <= 1.5x).
--strategy fsdp prints the throughput ratio of each GPU count to the one before (target 1 -> 2 >=
1.7x). A configuration whose memory plan does not fit is reported with the plan's one line.
--json PATH writes every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = Path(__file__).resolve().parent / "shapes"
LABEL = "throughput benchmark, random weights, not training"


def shape_config(name: str, layers: int = 0):
    """The transformers config of benchmarks/shapes/<name>.json (`layers` > 0: that many layers)."""
    import transformers

    values = {k: v for k, v in json.loads((SHAPES / f"{name}.json").read_text()).items() if not k.startswith("_")}
    if layers:
        values["num_hidden_layers"] = layers
        values.pop("max_window_layers", None)
    return transformers.AutoConfig.for_model(**values)


def build_model(config, folder: Path, on_gpu: bool) -> Path:
    """Random weights of `config` (seeded), saved with SmolLM2's tokenizer; bf16 on a GPU (built
    there), float32 on the CPU. A folder that holds them already is reused."""
    import torch
    import transformers

    from speedforge.policy.backends import resolve_model
    from speedforge.train.weights import training_tokenizer

    marker = folder / "bench-shape.json"
    if marker.is_file() and json.loads(marker.read_text()) == config.to_dict():
        return folder
    torch.manual_seed(0)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    with torch.device("cuda" if on_gpu else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder)
    training_tokenizer(*resolve_model("")[:2]).save_pretrained(folder)
    del model
    if on_gpu:
        torch.cuda.empty_cache()
    marker.write_text(json.dumps(config.to_dict()))
    return folder


def stage_config(args, model: Path, strategy: str, workers: int, on_gpu: bool):
    """The root config of one configuration's GRPO stage."""
    from speedforge.config import Config, EvaluatorConfig, GRPOStageConfig, LoraSettings, PolicyConfig
    from speedforge.config import RayTrainConfig, TrainConfig

    family = "cuda" if on_gpu else "cpp"
    tasks = (f"{family}/add_relu_scale", f"{family}/rmsnorm", f"{family}/logsumexp")  # the last held out
    scratch = Path(args.scratch)
    return Config(
        evaluator=EvaluatorConfig(cache_dir=str(scratch / "evaluator")),
        policy=PolicyConfig(model=str(model), device="cuda" if on_gpu else "cpu"),
        train=TrainConfig(
            run=f"{strategy}-{workers}-{int(time.time())}",
            store=str(scratch / "store"),
            work_dir=str(scratch / "work"),
            family=family,
            tasks=tasks,
            heldout=(tasks[-1],),
            strategy=strategy,
            lora=LoraSettings(rank=args.rank),
            gradient_checkpointing=True,
            ray=RayTrainConfig(workers=workers, use_gpu=on_gpu, cpus_per_worker=args.cpus_per_worker),
            grpo=GRPOStageConfig(
                steps=args.steps,
                prompts_per_step=args.prompts,
                generations=args.generations,
                max_new_tokens=args.new_tokens,
                max_prompt_tokens=args.prompt_tokens,
                learning_rate=1e-6,
                beta=0.0,
                save_every=args.steps,  # one checkpoint, at the end: the steps time training, not uploads
            ),
        ),
    )


def summary(lines: list[dict], sequences: int) -> dict:
    """Medians and spread of a stage's step lines, the first (warm-up) left out where there are more."""
    timed = lines[1:] if len(lines) > 1 else lines
    step_s = [m["step_s"] for m in timed]
    rates = []
    for m in timed:
        ranks = m.get("ranks") or [m]
        slowest = max(r.get("generation_s", 0.0) for r in ranks)
        if slowest > 0:
            rates.append(sum(r.get("generated_tokens", 0) for r in ranks) / slowest)
    peaks = [r["peak_memory_mb"] for m in lines for r in m.get("ranks", []) if "peak_memory_mb" in r]
    return {
        "steps": len(lines),
        "timed_steps": len(timed),
        "step_s_median": statistics.median(step_s),
        "step_s_min": min(step_s),
        "step_s_max": max(step_s),
        "sequences_per_s": sequences / statistics.median(step_s),
        "generated_tokens_per_s": statistics.median(rates) if rates else 0.0,
        "generated_tokens_per_s_min": min(rates) if rates else 0.0,
        "generated_tokens_per_s_max": max(rates) if rates else 0.0,
        "peak_memory_gib": max(peaks) / 1024 if peaks else None,
    }


def run_stage(args, model: Path, strategy: str, workers: int, on_gpu: bool) -> dict:
    """One configuration's GRPO stage; its figures, or why it did not run."""
    from speedforge.errors import UserError
    from speedforge.train.run import run_training
    from speedforge.store import open_store
    from speedforge.train.metrics import read_metrics
    from speedforge.train.state import RunState

    config = stage_config(args, model, strategy, workers, on_gpu)
    began = time.perf_counter()
    try:
        outcome = run_training(config, "grpo")
    except UserError as exc:
        return {"strategy": strategy, "workers": workers, "error": str(exc)}
    state = RunState(open_store(config.train.store), config.train.run, "grpo").read() or {}
    lines = [m for m in read_metrics(open(outcome.metrics_path)) if m.get("kind", "step") == "step"]
    figures = summary(lines, args.prompts * args.generations)
    return {
        "strategy": strategy,
        "workers": workers,
        "memory_plan": state.get("memory_plan"),
        "final": outcome.final_checkpoint,
        "wall_s": time.perf_counter() - began,
        **figures,
    }


def plain_generate(args, adapter: str, on_gpu: bool) -> dict:
    """Batched `generate` of base + adapter (the hf backend's load: bf16 on a GPU) on the GRPO
    step's batch of the same prompt, every sequence --new-tokens long; after one warm-up call."""
    import torch

    from speedforge.config import PolicyConfig
    from speedforge.policy.backends import HFBackend
    from speedforge.policy.prompts import render_prompt
    from speedforge.tasks import find_task

    backend = HFBackend(PolicyConfig(model=adapter, device="cuda" if on_gpu else "cpu"))
    family = "cuda" if on_gpu else "cpp"
    text = backend.tokenizer.apply_chat_template(
        render_prompt(find_task(f"{family}/add_relu_scale")).messages(), tokenize=False, add_generation_prompt=True
    )
    batch = backend.tokenizer([text] * (args.prompts * args.generations), return_tensors="pt").to(backend.device)
    seconds = []
    for _ in range(1 + args.plain_runs):
        if on_gpu:
            torch.cuda.synchronize()
        began = time.perf_counter()
        with torch.inference_mode():
            out = backend.model.generate(
                **batch,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                do_sample=True,
                temperature=0.8,
                top_p=0.95,
                pad_token_id=backend.tokenizer.pad_token_id,
            )
        if on_gpu:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - began)
    tokens = (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]
    rates = [tokens / s for s in seconds[1:]]
    return {
        "prompt_tokens": int(batch["input_ids"].shape[1]),
        "tokens_per_s": statistics.median(rates),
        "tokens_per_s_min": min(rates),
        "tokens_per_s_max": max(rates),
    }


def show(row: dict) -> str:
    if "error" in row:
        return f"{row['strategy']} x{row['workers']}: did not run: {row['error']}"
    peak = row["peak_memory_gib"]
    return (
        f"{row['strategy']} x{row['workers']}: step {row['step_s_median']:.2f} s (min {row['step_s_min']:.2f}, "
        f"max {row['step_s_max']:.2f}, n={row['timed_steps']}); {row['sequences_per_s']:.2f} sequences/s; "
        f"generation {row['generated_tokens_per_s']:.0f} tokens/s (min {row['generated_tokens_per_s_min']:.0f}, "
        f"max {row['generated_tokens_per_s_max']:.0f}); peak memory "
        + (f"{peak:.1f} GiB" if peak is not None else "- (CPU)")
    )


def main(argv: list[str] | None = None) -> dict:
    import torch

    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--shape", default="qwen2.5-7b", help="a config in benchmarks/shapes/ (tiny: a CPU smoke)")
    parser.add_argument("--layers", type=int, default=0, help="that many decoder layers (0: the shape's)")
    parser.add_argument("--strategy", choices=("lora", "fsdp"), required=True)
    parser.add_argument("--gpus", default="1", help="fsdp: comma-separated worker counts, e.g. 1,2,4")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per configuration (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=1536, help="train.grpo.max_prompt_tokens")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank")
    parser.add_argument("--plain-runs", type=int, default=3, help="lora: timed plain generate calls")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0)
    parser.add_argument("--scratch", default="/tmp/bench_train_scale", help="the model, the runs' store and work")
    parser.add_argument("--json", default="", help="write the figures here")
    args = parser.parse_args(argv)

    on_gpu = torch.cuda.is_available()
    config = shape_config(args.shape, args.layers)
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    print(f"{LABEL}: {args.shape}" + (f" ({args.layers} layers)" if args.layers else ""), flush=True)
    model = build_model(config, scratch / f"model-{args.shape}-{args.layers or 'all'}", on_gpu)
    print(
        f"device {device}, torch {torch.__version__}; {args.prompts} prompts x {args.generations} generations a step, "
        f"{args.new_tokens} new tokens, {args.steps} steps per configuration",
        flush=True,
    )
    counts = [1] if args.strategy == "lora" else [int(n) for n in args.gpus.split(",")]
    rows = []
    for workers in counts:
        row = run_stage(args, model, args.strategy, workers, on_gpu)
        rows.append(row)
        print(show(row), flush=True)
    result = {"label": LABEL, "shape": args.shape, "layers": config.num_hidden_layers, "device": device, "runs": rows}
    ran = [r for r in rows if "error" not in r]
    if args.strategy == "lora" and ran:
        plain = plain_generate(args, ran[0]["final"], on_gpu)
        ratio = plain["tokens_per_s"] / max(ran[0]["generated_tokens_per_s"], 1e-9)
        result["plain_generate"] = {**plain, "ratio_plain_to_grpo": ratio}
        print(
            f"plain generate {plain['tokens_per_s']:.0f} tokens/s (min {plain['tokens_per_s_min']:.0f}, max "
            f"{plain['tokens_per_s_max']:.0f}); plain / GRPO generation {ratio:.2f}x (target <= 1.5x)",
            flush=True,
        )
    for before, after in zip(ran, ran[1:]):
        ratio = after["sequences_per_s"] / before["sequences_per_s"]
        result.setdefault("scaling", []).append({"from": before["workers"], "to": after["workers"], "ratio": ratio})
        print(f"throughput {before['workers']} -> {after['workers']} workers: {ratio:.2f}x", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
