"""What the reference's fingerprint costs a timed pair: the time of
`speedforge.evaluator.fingerprint.take` on the reference models of CUDA-L1's corpus, built on the CPU.

During the timed calls the harness takes the reference's structure twice a pair (after its call, and
before its next one, `_Harness.switch`), so a deep model's fingerprint is host time between every
two timed calls: DenseNet201 (level3/16) has 526 submodules. Per model it prints the median of
--repeats fingerprints (structure alone, as between timed calls; and with the values' sums, as
after the correctness trials), then the sum over the models. Another revision, for a baseline in
the same run on the same machine:

    python benchmarks/bench_fingerprint.py                                     # this checkout
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_fingerprint.py  # another revision

Models that cannot be built here (a missing package) are skipped and counted. No timing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--jsonl",
        type=Path,
        default=here.parent / "shared/data/cuda-l1/a100.jsonl",
        help="CUDA-L1's corpus (default ../shared/data/cuda-l1/a100.jsonl)",
    )
    p.add_argument("--levels", default="3", help="levels whose references are measured (3)")
    p.add_argument("--repeats", type=int, default=7, help="fingerprints per model and kind (7)")
    p.add_argument("--show-over-ms", type=float, default=3.0, help="list the models slower than this (3 ms)")
    args = p.parse_args(argv)
    if not args.jsonl.is_file():
        print(f"bench_fingerprint: {args.jsonl} is absent (CUDA-L1's corpus; see ../shared/data/README)")
        return 2
    import torch

    from speedforge.evaluator import fingerprint

    torch.set_num_threads(1)
    levels = {int(x) for x in args.levels.split(",")}
    rows = [json.loads(line) for line in args.jsonl.read_text().splitlines() if line.strip()]
    rows = sorted((r for r in rows if r["level_id"] in levels), key=lambda r: (r["level_id"], r["task_id"]))
    print(f"fingerprint from {fingerprint.__file__}; torch {torch.__version__}; {args.repeats} repeats")
    totals = {False: [], True: []}
    skipped = 0
    for r in rows:
        namespace: dict = {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(compile(r["ref_code"], f"level{r['level_id']}/{r['task_id']}", "exec"), namespace)
                torch.manual_seed(0)
                model = namespace["Model"](*namespace["get_init_inputs"]())
        except Exception as exc:  # noqa: BLE001 -- a reference this machine cannot build is counted, not fatal
            skipped += 1
            print(f"  level{r['level_id']}/{r['task_id']}: skipped ({type(exc).__name__})")
            continue
        medians = {}
        for values in (False, True):
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fingerprint.take(torch, model, values)
                times.append(time.perf_counter() - t0)
            medians[values] = statistics.median(times)
            totals[values].append(medians[values])
        if medians[False] * 1e3 >= args.show_over_ms:
            modules = sum(1 for _ in model.named_modules(remove_duplicate=False))
            print(
                f"  level{r['level_id']}/{r['task_id']}: {modules} submodules, structure {medians[False] * 1e3:.1f} ms, "
                f"with values {medians[True] * 1e3:.1f} ms"
            )
    n = len(totals[False])
    print(
        f"{n} models ({skipped} skipped): structure {sum(totals[False]) * 1e3:.0f} ms in all "
        f"(median {statistics.median(totals[False]) * 1e3:.2f} ms, max {max(totals[False]) * 1e3:.1f} ms); "
        f"with values {sum(totals[True]) * 1e3:.0f} ms in all"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
