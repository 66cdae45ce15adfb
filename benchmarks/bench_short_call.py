"""Where a launch-bound kernel's time goes: one CUDA-L1 pair timed the ways two harnesses time it
(level2/14 once read 2.25x in speedforge against 3.0-3.2x in CUDA-L1's harness).

In one plain process on the GPU (no sandbox), the reference and the candidate of one corpus entry
are timed, pair after pair in alternating order, under each of these regimes (each changes one
thing from the one above it, so a difference between neighbouring rows is that one thing's share):

    cuda-l1        start event, the call, end event, synchronize (CUDA-L1's eval_cuda.py)
    sync-before    a synchronize before the start event too
    end-after-sync the end event after a device-wide synchronize (speedforge's timed region)
    l2-flush       256 MB zeroed before each call, outside the region (speedforge's flush)
    host-gap       ~N us of Python work between calls (speedforge's checks between calls)
    warm-call      an untimed call of the same side before each timed call (host_warm_below_us)
    gap-off        the synchronize's own round trip (an idle call's, median) taken off, never below
                   the current stream's end event (speedforge since 2026-11-26: gpu_call_seconds)
    loop           the reference of throughput: 200 calls back to back between two events, / 200
    l1-trial       CUDA-L1's trial as a whole (opt-in, --regimes): new inputs from get_inputs() on the
                   host and .cuda() before each pair, its scan of dir(model) for streams, events
                   around the call, a synchronize after it; --train times both models in train
                   mode, as CUDA-L1's performance step builds them (it calls .eval() only in its
                   correctness step)
    ref-pristine   gap-off, with each side timed under its own process-wide state (opt-in): the
                   reference under the state captured before the candidate was imported, the
                   candidate under the state it left (speedforge's snapshot and restore; a
                   candidate that sets torch.backends.cudnn.benchmark keeps it for itself only,
                   while in CUDA-L1's harness and in every other regime here the reference runs
                   under it too)

It prints each regime's median reference and candidate times (us), the speedup (ratio of
medians), and the spread of the speedup over the repeats. No timing is asserted; the figures
explain, they do not judge.

    python benchmarks/bench_short_call.py --kernel level2/14 --jsonl ../shared/data/cuda-l1/a100.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

REGIMES = ["cuda-l1", "sync-before", "end-after-sync", "l2-flush", "host-gap", "warm-call", "gap-off", "loop"]
EXTRA = ["l1-trial", "ref-pristine"]


def scan_streams(torch, model) -> list:
    """CUDA-L1's find_model_streams: every attribute of the model, looking for CUDA streams."""
    found = []
    for name in dir(model):
        try:
            value = getattr(model, name)
        except (AttributeError, RuntimeError):
            continue
        if isinstance(value, torch.cuda.Stream):
            found.append(value)
    return found


def load_pair(jsonl: Path, kernel: str) -> tuple[str, str]:
    level, task = kernel.removeprefix("level").split("/")
    for line in jsonl.read_text().splitlines():
        row = json.loads(line)
        if row.get("level_id") == int(level) and row.get("task_id") == int(task):
            return row["ref_code"], row["custom_code"]
    sys.exit(f"{kernel} is not in {jsonl}")


def build(torch, ref_code: str, cand_code: str, seed: int, train: bool = False):
    """Both models and one set of inputs on the device, and the process-wide state each side
    runs under in speedforge: `states["ref"]` captured before the candidate's code ran,
    `states["cand"]` what the candidate left (speedforge.evaluator.process_state)."""
    from speedforge.evaluator import process_state

    import os

    # published kernels pass load_inline a build_directory of their own (~/.cache/torch_extensions),
    # which torch does not create: without it the extension fails and a fallback path is timed
    os.makedirs(os.path.expanduser(os.path.join("~", ".cache", "torch_extensions")), exist_ok=True)
    ref, cand = types.ModuleType("probe_ref"), types.ModuleType("probe_cand")
    exec(compile(ref_code, "<reference>", "exec"), ref.__dict__)
    torch.manual_seed(seed)
    init = ref.get_init_inputs()
    torch.manual_seed(seed)
    model_ref = ref.Model(*init).cuda().train(train)
    states = {"ref": process_state.capture()}
    exec(compile(cand_code, "<candidate>", "exec"), cand.__dict__)
    torch.manual_seed(seed)
    model_cand = cand.ModelNew(*init).cuda().train(train)
    states["cand"] = process_state.capture()
    torch.manual_seed(seed + 1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
    return model_ref, model_cand, inputs, ref.get_inputs, states


def host_work(us: float) -> None:
    """Python work of about `us` microseconds touching fresh objects, as a harness's checks do."""
    end = time.perf_counter() + us / 1e6
    junk = []
    while time.perf_counter() < end:
        junk.append({str(i): i for i in range(64)})


def sync_gap_us(torch, samples: int = 33) -> float:
    """The median round trip a device-wide synchronize adds after an idle stream's event."""
    gaps = []
    for _ in range(samples):
        torch.cuda.synchronize()
        done, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        done.record()
        torch.cuda.synchronize()
        end.record()
        end.synchronize()
        gaps.append(done.elapsed_time(end) * 1e3)
    return statistics.median(gaps)


def time_call(torch, regime: str, model, inputs, flush, gap_us: float, sync_gap: float = 0.0) -> float:
    """One timed call of `model` under `regime`, in microseconds."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    done = torch.cuda.Event(enable_timing=True)
    if regime == "loop":
        torch.cuda.synchronize()
        start.record()
        for _ in range(200):
            model(*inputs)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / 200
    if regime in ("host-gap", "warm-call", "gap-off", "ref-pristine"):
        host_work(gap_us)
    if regime in ("warm-call", "gap-off", "ref-pristine"):
        model(*inputs)
    if regime in ("l2-flush", "host-gap", "warm-call", "gap-off", "ref-pristine"):
        flush.zero_()
    if regime not in ("cuda-l1", "l1-trial"):
        torch.cuda.synchronize()
    start.record()
    model(*inputs)
    if regime in ("cuda-l1", "sync-before", "l1-trial"):
        end.record()
        torch.cuda.synchronize()
    else:
        done.record()
        torch.cuda.synchronize()
        end.record()
        end.synchronize()
        if regime in ("gap-off", "ref-pristine"):
            return max(start.elapsed_time(done) * 1e3, start.elapsed_time(end) * 1e3 - sync_gap)
    return start.elapsed_time(end) * 1e3


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--jsonl",
        type=Path,
        default=here.parent.parent / "shared/data/cuda-l1/a100.jsonl",
        help="CUDA-L1's corpus (default ../shared/data/cuda-l1/a100.jsonl)",
    )
    p.add_argument("--kernel", action="append", help="levelL/T, repeatable (default level2/14)")
    p.add_argument("--pairs", type=int, default=100, help="timed pairs per regime and repeat (100)")
    p.add_argument("--repeats", type=int, default=5, help="repeats of every regime, interleaved (5)")
    p.add_argument("--gap-us", type=float, default=300.0, help="host work between calls in host-gap (300 us)")
    p.add_argument("--flush-mb", type=int, default=256, help="L2 flush size (256, speedforge's default)")
    p.add_argument(
        "--regimes",
        default=",".join(REGIMES),
        help=f"comma-separated, from {', '.join(REGIMES + EXTRA)} (default all but {', '.join(EXTRA)})",
    )
    p.add_argument("--train", action="store_true", help="both models in train mode (CUDA-L1's performance step)")
    args = p.parse_args(argv)
    regimes = [r for r in args.regimes.split(",") if r]
    unknown = sorted(set(regimes) - set(REGIMES + EXTRA))
    if unknown:
        p.error(f"unknown regimes {unknown}; choose from {REGIMES + EXTRA}")
    import torch

    from speedforge.evaluator import process_state

    if not torch.cuda.is_available():
        print("bench_short_call: no GPU here; this probe times CUDA calls only")
        return 2
    if not args.jsonl.is_file():
        print(f"bench_short_call: {args.jsonl} is absent (CUDA-L1's corpus; see ../shared/data/README)")
        return 2
    flush = torch.empty(args.flush_mb << 20, dtype=torch.uint8, device="cuda")
    print(
        f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.pairs} pairs x {args.repeats} repeats"
    )
    start = process_state.capture()
    for kernel in args.kernel or ["level2/14"]:
        # each kernel from the process's own state: an earlier candidate's knobs (cudnn.benchmark)
        # would otherwise be the next reference's "pristine" state
        process_state.apply(start, process_state.capture())
        ref_code, cand_code = load_pair(args.jsonl, kernel)
        model_ref, model_cand, inputs, get_inputs, states = build(torch, ref_code, cand_code, 42, args.train)
        changed = process_state.differences(states["ref"], states["cand"])
        print(f"{kernel}: process-wide state the candidate changed: {', '.join(changed) or 'none'}")
        with torch.no_grad():
            for _ in range(20):
                model_ref(*inputs), model_cand(*inputs)
            torch.cuda.synchronize()
            gap = sync_gap_us(torch)
            print(f"{kernel}: the synchronize's round trip after an idle stream, median {gap:.1f} us")
            got = {r: {"ref": [], "cand": [], "speedup": []} for r in regimes}
            for rep in range(args.repeats):
                for regime in regimes:
                    times = {"ref": [], "cand": []}
                    pairs = args.pairs if regime != "loop" else max(3, args.pairs // 20)
                    for i in range(pairs):
                        order = ("ref", "cand") if (i + rep) % 2 == 0 else ("cand", "ref")
                        if regime == "l1-trial":  # CUDA-L1: new host inputs, copied, the stream scan
                            inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in get_inputs()]
                            scan_streams(torch, model_ref), scan_streams(torch, model_cand)
                        for side in order:
                            model = model_ref if side == "ref" else model_cand
                            if regime == "ref-pristine":
                                process_state.apply(states[side], process_state.capture())
                            times[side].append(time_call(torch, regime, model, inputs, flush, args.gap_us, gap))
                    if regime == "ref-pristine":  # the other regimes share the candidate's state
                        process_state.apply(states["cand"], process_state.capture())
                    r, c = statistics.median(times["ref"]), statistics.median(times["cand"])
                    got[regime]["ref"].append(r)
                    got[regime]["cand"].append(c)
                    got[regime]["speedup"].append(r / c)
        mode = "train" if args.train else "eval"
        print(f"\n{kernel} ({mode} mode): median over {args.repeats} repeats (each the median of its calls)")
        print(f"  {'regime':15s} {'ref us':>9s} {'cand us':>9s} {'speedup':>8s}  {'min-max':>13s}")
        for regime in regimes:
            g = got[regime]
            s = g["speedup"]
            print(
                f"  {regime:15s} {statistics.median(g['ref']):9.1f} {statistics.median(g['cand']):9.1f} "
                f"{statistics.median(s):8.3f}  {min(s):6.3f}-{max(s):6.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
