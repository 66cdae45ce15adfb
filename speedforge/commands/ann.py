"""`speedforge ann tasks|reference|sweep`: the CRINN side of speedforge.

speedforge ann tasks
speedforge ann reference ann/sift-search
speedforge ann sweep --shape glove --n 20000
speedforge ann sweep --base sift_base.fvecs --queries sift_query.fvecs --metric l2
"""

from __future__ import annotations

import argparse

from speedforge.errors import UserError
from speedforge.reports.text import print_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ann",
        help="ANN tasks, engine modules and QPS-recall sweeps",
        description="The graph ANN engine and the `ann` task family.",
    )
    sub = parser.add_subparsers(dest="ann_command", metavar="ACTION", required=True)
    tasks = sub.add_parser("tasks", help="list the built-in ann tasks", description="List the built-in ann tasks.")
    tasks.set_defaults(func=_tasks)
    ref = sub.add_parser(
        "reference",
        help="print the baseline C++ module a task's candidates replace",
        description="Print the engine's baseline source of the module an ann task optimises.",
    )
    ref.add_argument("task_id", help="task id, e.g. ann/sift-search")
    ref.set_defaults(func=_reference)
    sw = sub.add_parser(
        "sweep",
        help="build the engine on a data set and sweep ef: recall@k, QPS, AUC",
        description="Build the engine on a synthetic set (--shape) or on files (--base/--queries), "
        "then sweep ef and print recall@k, QPS and the AUC over the recall band.",
    )
    sw.add_argument("--shape", default="sift", help="synthetic set: sift, glove or gist (default sift)")
    sw.add_argument(
        "--distribution",
        default="clustered",
        choices=("clustered", "uniform"),
        help="synthetic data: clustered (uneven clusters, low intrinsic dimension; default) or uniform",
    )
    sw.add_argument("--n", type=int, default=20000, help="synthetic base vectors (default 20000)")
    sw.add_argument("--nq", type=int, default=1000, help="synthetic queries (default 1000)")
    sw.add_argument("--seed", type=int, default=0)
    sw.add_argument("--base", help="base vectors: .fvecs, .bvecs, .npy or an ann-benchmarks .hdf5")
    sw.add_argument("--queries", help="query vectors (with --base, unless it is .hdf5)")
    sw.add_argument("--metric", default="l2", help="l2, ip or angular (files only; default l2)")
    sw.add_argument("--M", type=int, default=16)
    sw.add_argument("--ef-construction", type=int, default=200)
    sw.add_argument("--quantization", default="sq8", choices=("sq8", "none"))
    sw.add_argument("--k", type=int, default=10)
    sw.add_argument("--threads", type=int, default=1, help="search threads (default 1); the build uses all")
    sw.add_argument("--efs", help="comma list of ef values (default: a ladder from 10 to 512)")
    sw.set_defaults(func=_sweep)


def _tasks(args: argparse.Namespace) -> int:
    from speedforge.ann.tasks import builtin_tasks, parse_spec

    rows = []
    for task in builtin_tasks():
        spec = parse_spec(task.source, task.task_id)
        rows.append([task.task_id, spec.module, f"{spec.data.shape} x {spec.data.n}", spec.resolved_metric, task.notes])
    print_table(["task", "module", "data", "metric", "description"], rows)
    return 0


def _reference(args: argparse.Namespace) -> int:
    from speedforge.ann.tasks import builtin_tasks, reference_source

    matches = [t for t in builtin_tasks() if t.task_id == args.task_id]
    if not matches:
        known = ", ".join(t.task_id for t in builtin_tasks())
        raise UserError(f"unknown ann task {args.task_id!r}; built-in: {known}")
    print(reference_source(matches[0]))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from speedforge.ann.auc import BAND
    from speedforge.ann.datasets import load_dataset, synthetic
    from speedforge.ann.sweep import DEFAULT_EFS
    from speedforge.recipes.ann_curve import ann_curve

    if args.base:
        ds = load_dataset(args.base, args.queries, metric=args.metric)
    else:
        ds = synthetic(args.shape, args.n, args.nq, seed=args.seed, distribution=args.distribution)
    try:
        efs = [int(e) for e in args.efs.split(",")] if args.efs else list(DEFAULT_EFS)
    except ValueError:
        raise UserError(f"--efs must be a comma list of integers, got {args.efs!r}") from None
    with CurvePrinter(len(efs)) as view:
        curve = ann_curve(
            ds,
            efs,
            view,
            k=args.k,
            M=args.M,
            ef_construction=args.ef_construction,
            quantization=args.quantization,
            threads=args.threads,
        )
    print_table(["ef", f"recall@{args.k}", "QPS"], [[p.ef, round(p.recall, 4), round(p.qps)] for p in curve.points])
    print(
        f"AUC over recall {BAND[0]}-{BAND[1]}: {curve.auc:.1f}   QPS at recall 0.90: "
        f"{'not reached' if curve.qps_at_90 is None else round(curve.qps_at_90)}"
    )
    return 0


class CurvePrinter:
    """The build's two lines, then a progress bar over the ef values."""

    def __init__(self, efs: int) -> None:
        self.efs = efs
        self.bar = None

    def __enter__(self) -> "CurvePrinter":
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()

    def building(self, vectors: int, dim: int, metric: str, simd: str) -> None:
        print(f"building over {vectors} x {dim} ({metric}, SIMD {simd}) ...", flush=True)

    def built(self, seconds: float, memory_bytes: int) -> None:
        from tqdm import tqdm

        print(f"built in {seconds:.1f} s, {memory_bytes / 2**20:.0f} MiB", flush=True)
        self.bar = tqdm(total=self.efs, desc="ef sweep", unit="ef")

    def swept(self, point) -> None:
        self.bar.update(1)
