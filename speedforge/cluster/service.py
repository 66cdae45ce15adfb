"""The evaluation service: candidates in, exactly one EvalResult per (candidate, pool) out.

    connect_ray(address, config.service)
    with EvaluationService(config) as service:
        results = service.submit(candidates, ["H100", "L40"], tasks, store=store)

Each candidate is screened and built once by a CPU build worker (the build cache is shared, so
one build serves every pool), then run by one bench worker of every pool it is owed to. The
service:

- deduplicates by (candidate_id, pool), within one submit and against the results table;
- applies back-pressure: it takes at most `max_in_flight` candidates from the input before
  earlier ones finish, so a generator of 10,000 candidates is never held in memory at once;
- retries only `infra_error` (a worker that died, a harness exception), at most `retries` times;
- appends results to the results table as they arrive, so a restarted sweep skips what is done
  (every recorded result counts as done, infra_error included: one result per pair).

The evaluation functions are plain callables (the evaluator's `build_candidate` and
`run_candidate` by default), so tests can inject cheap ones.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from speedforge.cluster.actors import BenchWorker, BuildFn, BuildWorker, RunFn
from speedforge.cluster.pools import (
    actor_options,
    build_nice,
    build_slowdown,
    local_ray_resources,
    plan_bench_workers,
    plan_build_workers,
    resolve_pools,
    sweep_evaluator_config,
    worker_need,
)
from speedforge.cluster.sweep import Key, Sweep, SweepProgress, WorkerSet
from speedforge.config import Config, ServiceConfig
from speedforge.errors import UserError, first_line
from speedforge.records import Candidate, EvalResult, Task


class ResultsTable:
    """The results table of a store, appended to in small parts as results arrive."""

    def __init__(self, store: Any, table: str = "results", flush_every: int = 32, flush_s: float = 5.0) -> None:
        self.store = store
        self.table = table
        self.flush_every = flush_every
        self.flush_s = flush_s
        self.buffer: list[EvalResult] = []
        self.last_flush = time.monotonic()

    def recorded(self) -> dict[Key, EvalResult]:
        """Results already in the table, by (candidate_id, pool)."""
        return {(r.candidate_id, r.pool): r for r in self.store.read_records(self.table, EvalResult)}

    def add(self, result: EvalResult) -> None:
        self.buffer.append(result)
        if len(self.buffer) >= self.flush_every:
            self.flush()

    def tick(self) -> None:
        if self.buffer and time.monotonic() - self.last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.store.append_records(self.table, self.buffer)
            self.buffer = []
        self.last_flush = time.monotonic()


def connect_ray(address: str | None, config: ServiceConfig) -> bool:
    """Join the Ray cluster at `address`, or start a local one with the CPU bench slots.

    True when this call started or joined Ray (the caller shuts it down), False when Ray was
    already initialized in this process.
    """
    import ray

    if ray.is_initialized():
        return False
    options = dict(logging_level="WARNING", log_to_driver=False)
    try:
        if address:
            ray.init(address=address, **options)
        else:
            # workers at niceness 0 (Ray's default is 15), so the build workers' steps below the
            # bench workers have room (see ServiceConfig.build_nice_first)
            ray.init(resources=local_ray_resources(config), include_dashboard=False,
                     _system_config={"worker_niceness": 0}, **options)  # fmt: skip
    except ConnectionError as exc:
        raise UserError(f"cannot join the Ray cluster at {address}: {exc} (a cluster with token authentication "
                        "needs its token in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)") from None  # fmt: skip
    return True


class EvaluationService:
    """Build workers and bench workers on Ray, kept between submits, and the sweep that feeds them."""

    def __init__(self, config: Config | None = None, build_fn: BuildFn | None = None,
                 run_fn: RunFn | None = None) -> None:  # fmt: skip
        self.config = config or Config()
        if build_fn is None or run_fn is None:
            from speedforge.evaluator.evaluate import build_candidate, run_candidate

            build_fn = build_fn or build_candidate
            run_fn = run_fn or run_candidate
        self.build_fn = build_fn
        self.run_fn = run_fn
        self._build: WorkerSet | None = None
        self._bench: dict[str, WorkerSet] = {}

    @property
    def service(self) -> ServiceConfig:
        return self.config.service

    # -- workers ------------------------------------------------------------------------------

    def start(self, pools: Sequence[str]) -> dict[str, int]:
        """Start build workers and the bench workers of `pools`; returns bench workers per pool.

        An unknown pool, or one the cluster has no resources for, fails at once with a
        UserError; a pool none of whose workers start within `worker_start_timeout_s` too.
        """
        import ray

        if not ray.is_initialized():
            raise UserError("Ray is not running: call speedforge.cluster.connect_ray() first")
        configs = resolve_pools(pools, self.service)
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        plan = plan_bench_workers(configs, nodes)
        starting: dict[str, list[Any]] = {}
        if self._build is None:
            bench_cpus = sum(worker_need(configs[p]).get("CPU", 0.0) * n for p, n in plan.items())
            actor = ray.remote(BuildWorker).options(**actor_options({"CPU": self.service.build_num_cpus}),
                                                    max_restarts=0)  # fmt: skip
            count = plan_build_workers(self.service, nodes, bench_cpus)
            spawned = itertools.count()  # a replacement takes the next slot's niceness

            def spawn() -> Any:
                nice = build_nice(self.service, next(spawned), count)
                return actor.remote(self.build_fn, nice, build_slowdown(self.service, nice))

            self._build = WorkerSet("build", spawn, self.service.worker_restarts)
            starting["build"] = self._build.grow_to(count)
        for name, count in plan.items():
            if name not in self._bench:
                pool = configs[name]
                actor = ray.remote(BenchWorker).options(**actor_options(worker_need(pool)), max_restarts=0)
                spawn = lambda a=actor, n=name, d=pool.device: a.remote(self.run_fn, n, d, self.build_fn)  # noqa: E731
                self._bench[name] = WorkerSet(name, spawn, self.service.worker_restarts)
            starting[name] = self._bench[name].grow_to(count)
        self._wait_ready(starting)
        return {name: len(self._bench[name].workers) for name in plan}

    def _wait_ready(self, starting: dict[str, list[Any]]) -> None:
        """Wait until every worker being started is up, at most `worker_start_timeout_s`.

        A stage none of whose new workers started is a UserError; workers still pending at the
        deadline (the cluster has no room for them: resources taken by other actors) are killed
        and dropped with a warning, so no work is ever sent to a worker that cannot run.
        """
        import ray

        refs = {handle.ready.remote(): (name, handle) for name, handles in starting.items() for handle in handles}
        up = {name: 0 for name, handles in starting.items() if handles}
        deadline = time.monotonic() + self.service.worker_start_timeout_s
        pending = list(refs)
        failure: dict[str, str] = {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            name, handle = refs[ready[0]]
            try:
                ray.get(ready[0])
                up[name] += 1
            except ray.exceptions.RayError as exc:
                failure[name] = first_line(exc)
                self._drop(name, handle)
        for ref in pending:  # never placed: drop, or a sweep would wait on them
            self._drop(*refs[ref])
        down = sorted(name for name, count in up.items() if count == 0)
        if down:
            timeout = self.service.worker_start_timeout_s
            raise UserError("; ".join(
                f"{name} workers failed to start: {failure[name]}" if name in failure else
                f"no worker of {name} started within {timeout:g} s: the cluster has the resources, but they are "
                "taken (see `ray status`)" for name in down))  # fmt: skip
        dropped = {name: len(starting[name]) - count for name, count in up.items() if count < len(starting[name])}
        if dropped:
            print("speedforge: " + ", ".join(f"{n} of {len(starting[name])} {name} workers" for name, n in dropped.items())
                  + f" did not start within {self.service.worker_start_timeout_s:g} s (resources taken?) and were "
                  "dropped; the sweep runs on the others", file=sys.stderr, flush=True)  # fmt: skip

    def _drop(self, name: str, handle: Any) -> None:
        """Kill a worker that did not start and forget it."""
        import ray

        ray.kill(handle)
        worker_set = self._build if name == "build" else self._bench[name]
        worker_set.workers = [w for w in worker_set.workers if w.handle is not handle]

    def worker_counts(self) -> dict[str, int]:
        """Live workers: "build", and one entry per started pool."""
        counts = {"build": len(self._build.workers) if self._build else 0}
        return counts | {pool: len(workers.workers) for pool, workers in self._bench.items()}

    def bench_workers(self, pool: str) -> list[tuple[Any, int]]:
        """The live bench workers of `pool`: (actor handle, candidates it has been sent and not answered)."""
        return [(w.handle, w.items) for w in self._bench[pool].workers] if pool in self._bench else []

    def close(self) -> None:
        """Kill every worker this service started."""
        import ray

        for worker_set in ([self._build] if self._build else []) + list(self._bench.values()):
            for worker in worker_set.workers:
                ray.kill(worker.handle)
        self._build = None
        self._bench = {}

    def __enter__(self) -> "EvaluationService":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the sweep ----------------------------------------------------------------------------

    def submit(
        self,
        candidates: Iterable[Candidate],
        pools: Sequence[str],
        tasks: Mapping[str, Task] | Iterable[Task],
        store: Any = None,
        on_progress: Callable[[SweepProgress], None] | None = None,
    ) -> list[EvalResult]:
        """One EvalResult per distinct (candidate, pool), in input order.

        Pairs already in `store`'s results table are not evaluated again; their recorded
        results are returned. New results are appended to the table as they arrive.
        """
        pools = list(dict.fromkeys(pools))
        self.start(pools)
        if not isinstance(tasks, Mapping):
            tasks = {t.task_id: t for t in tasks}
        sink = None
        if store is not None:
            sink = ResultsTable(store, flush_every=self.service.flush_every, flush_s=self.service.flush_s)
        evaluator = sweep_evaluator_config(self.config.evaluator, resolve_pools(pools, self.service))
        sweep = Sweep(self.service, evaluator, self._build, {p: self._bench[p] for p in pools}, tasks,
                      sink.recorded() if sink else {}, sink, on_progress)  # fmt: skip
        try:
            sweep.run(candidates)
        except BaseException:
            self._abandon(sweep)
            raise
        finally:
            if sink:
                sink.flush()
        return sweep.ordered_results()

    def _abandon(self, sweep: Sweep) -> None:
        """After an interrupted sweep, kill the workers still busy with it (replaced next start)."""
        import ray

        for call in sweep.calls.values():
            if call.worker.alive:
                ray.kill(call.worker.handle)
                call.worker.alive = False
            for worker_set in [self._build, *self._bench.values()]:
                if worker_set and call.worker in worker_set.workers:
                    worker_set.workers.remove(call.worker)
