"""Engine A/B: the installed ANN engine against another build of it (an earlier
`_annengine*.so`, copied aside before a change), measured the way the `ann` family measures a
candidate: the same graph from the same seed, searches of both in short paired chunks on the
thread's CPU clock, the AUC reward (new over old) from medians. Each case runs over several
seeds; a reward above 1 means the installed build is faster.

    cp speedforge/_annengine*.so /tmp/old/          # before the change, then rebuild
    python benchmarks/bench_ann_ab.py --old /tmp/old/_annengine.cpython-311-x86_64-linux-gnu.so \\
        --cases gist:uniform:10000,gist:clustered:10000,sift:uniform:20000 --seeds 3

Runs in this process, not in a sandbox: both builds are trusted engine code.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys

import yaml

from speedforge.ann import family, tasks
from speedforge.ann.engine import baseline


def load_engine(path: str):
    """Another build of the engine as a module of its own (its init symbol is PyInit__annengine)."""
    spec = importlib.util.spec_from_file_location("speedforge_ab_old._annengine", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a loadable extension")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="the other build's _annengine*.so")
    parser.add_argument(
        "--cases",
        default="sift:clustered:20000,glove:clustered:20000,gist:clustered:10000",
        help="comma list of shape:distribution:n",
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--quantization", default="sq8", choices=("sq8", "none"))
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="search threads (calls of 25 queries per thread; above 1, timed by the wall clock)",
    )
    args = parser.parse_args(argv)
    old, new = load_engine(args.old), baseline()
    for case in args.cases.split(","):
        shape, distribution, n = case.split(":")
        source = yaml.safe_dump(
            {
                "module": "search",
                "data": {"shape": shape, "distribution": distribution, "n": int(n), "queries": args.queries},
                "index": {"M": 16, "ef_construction": 100, "quantization": args.quantization},
                "sweep": {
                    "k": 10,
                    "ef": [10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128],
                    "repeats": 3,
                    "threads": args.threads,
                },
            }
        )
        spec = tasks.parse_spec(source, case)
        rewards = []
        for seed in range(args.seeds):
            result = family.measure(spec, old, new, 1000 + seed)
            if result["status"] != "ok":
                print(f"{case} seed {seed}: {result['status']} {result['reason']}", flush=True)
                continue
            rewards.append(result["speedup"])
        if rewards:
            print(
                f"{distribution}/{shape} n={n}: new/old reward per seed {[round(r, 3) for r in rewards]}, "
                f"median {statistics.median(rewards):.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
