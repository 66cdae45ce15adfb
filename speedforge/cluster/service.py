"""The evaluation service: candidates in, exactly one EvalResult per (candidate, pool) out.

    with ray_session(address, config.service), EvaluationService(config) as service:
        results = service.submit(candidates, ["H100", "L40"], tasks, store=store)

Each candidate is screened and built once by a CPU build worker (the build cache is shared, so
one build serves every pool), then run by one bench worker of every pool it is owed to. The
service:

- deduplicates by (candidate_id, pool), within one submit and against the results table;
- applies back-pressure: it takes at most `max_in_flight` candidates from the input before
  earlier ones finish, so a generator of 10,000 candidates is never held in memory at once;
- retries only `infra_error` (a worker that died, a harness exception), at most `retries` times;
- appends results to the results table as they arrive, so a restarted sweep skips what is done
  (every recorded result counts as done, infra_error included: one result per pair);
- writes to a results table only while it holds the table's lease (one sweep per table), and
  keeps what the store cannot take in a local spill that the next run writes first (ResultsTable);
- checks a list of candidates before it starts: every task given, every pool able to run their
  families (sweep.check_inputs).

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
    absent_pools,
    build_slowdown,
    fit_count,
    for_address,
    plan_bench_workers,
    plan_build_workers,
    resolve_pools,
    sweep_evaluator_config,
    worker_need,
)
from speedforge.cluster.session import joined_address
from speedforge.cluster.sweep import Key, Sweep, SweepProgress, WorkerSet, check_inputs
from speedforge.config import Config, ServiceConfig
from speedforge.errors import UserError, first_line
from speedforge.extras import require
from speedforge.records import TABLES, Candidate, EvalResult, Task


WAIT_NOTE_S = 60.0  # while waiting for an autoscaled pool, a line this often


def say(message: str) -> None:
    """A line for the person running this (stderr, so stdout stays the command's output)."""
    print(f"speedforge: {message}", file=sys.stderr, flush=True)


class ResultsTable:
    """The results table of a store, appended to in small parts as results arrive, by one run.

        with ResultsTable.open(store, config) as table:   # the lease first: a second run refuses
            service.submit(candidates, pools, tasks, store=table)

    open() takes the table's lease (speedforge.store.lease: LeaseHeldError while another run
    holds it) and writes the parts an earlier run spilled; recorded() counts what is still
    spilled as done too. A part the store does not take within its retry_s is spilled
    (speedforge.store.spill), and so is every later part of this run, without waiting on the
    store again: an outage costs one retry_s, and no result is lost. close() tries once more to
    write the spill, then releases the lease.
    """

    name = "results"  # the store table, and the class of its rows (speedforge.records.TABLES)
    record = TABLES[name]

    def __init__(
        self,
        store: Any,
        table: str = name,
        flush_every: int = 32,
        flush_s: float = 5.0,
        spill: Any = None,
        lease: Any = None,
    ) -> None:
        self.store = store
        self.table = table
        self.flush_every = flush_every
        self.flush_s = flush_s
        self.spill = spill  # a speedforge.store.spill.Spill, or None: a failed write raises
        self.lease = lease  # a held speedforge.store.lease.Lease, or None
        self.down: str | None = None  # why the store stopped taking parts in this run
        self.buffer: list[EvalResult] = []
        self.last_flush = time.monotonic()
        self.kept_parts = 0  # parts left in the spill when the table was closed

    @classmethod
    def open(cls, store: Any, config: Config, force: bool = False, table: str = name) -> "ResultsTable":
        """Take the lease on `table` of `store` (force: an expired one too), then write its spill."""
        from speedforge.store.lease import Lease
        from speedforge.store.spill import Spill

        lease = Lease.acquire(store, table, config.service.lease_s, force=force).start_heartbeat()
        try:
            spill = Spill.beside(store, config.store.spill_dir)
            written = spill.deliver(table)
        except BaseException:
            lease.release()
            raise
        if written:
            print(
                f"speedforge: wrote {written} part(s) of results that an earlier run kept in {spill.folder} to "
                f"{store.uri}",
                file=sys.stderr,
                flush=True,
            )
        return cls(store, table, config.service.flush_every, config.service.flush_s, spill, lease)

    def recorded(self) -> dict[Key, EvalResult]:
        """Results already in the table or waiting in its spill, by (candidate_id, pool)."""
        spilled = self.spill.read_records(self.table, self.record) if self.spill else []
        stored = self.store.read_records(self.table, self.record)
        return {(r.candidate_id, r.pool): r for r in [*stored, *spilled]}

    def add(self, result: EvalResult) -> None:
        self.buffer.append(result)
        if len(self.buffer) >= self.flush_every:
            self.flush()

    def tick(self) -> None:
        if self.lease is not None and self.lease.lost:
            raise UserError(f"lost the lease on {self.store.uri}: {self.lease.lost}; this run stops writing there")
        if self.buffer and time.monotonic() - self.last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            from speedforge.store import StoreError

            key, data = self.store.encode_part(self.table, self.buffer)
            lost = self.lease is not None and self.lease.lost
            if self.down is None and not lost:
                try:
                    self.store.put_bytes(key, data)
                except StoreError as exc:
                    if self.spill is None:
                        raise
                    self.down = first_line(exc)
                    print(
                        f"speedforge: cannot write results to {self.store.uri} ({self.down}); this run keeps "
                        f"them in {self.spill.folder} and the next run on it writes them first",
                        file=sys.stderr,
                        flush=True,
                    )
            if self.down is not None or lost:
                self.spill.keep(key, data)
            self.buffer = []
        self.last_flush = time.monotonic()

    def close(self) -> None:
        """Flush; if the store went down, try once more to write the spill; release the lease."""
        from speedforge.store import StoreError

        try:
            self.flush()
            if self.down is not None and not (self.lease and self.lease.lost):
                try:
                    self.spill.deliver(self.table, retry_s=0)
                    self.down = None
                except StoreError:
                    pass
            kept = self.spill.parts(self.table) if self.spill else []
            self.kept_parts = len(kept)
            if kept:
                print(
                    f"speedforge: {len(kept)} part(s) of results are kept in {self.spill.folder}, not yet in "
                    f"{self.store.uri}; run the same command again once the store is back: it writes them first "
                    "and skips their pairs",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            if self.lease is not None:
                self.lease.release()

    def __enter__(self) -> "ResultsTable":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EvaluationService:
    """Build workers and bench workers on Ray, kept between submits, and the sweep that feeds them."""

    def __init__(
        self, config: Config | None = None, build_fn: BuildFn | None = None, run_fn: RunFn | None = None
    ) -> None:
        self.config = config or Config()
        if build_fn is None or run_fn is None:
            from speedforge.evaluator.evaluate import build_candidate, run_candidate

            build_fn = build_fn or build_candidate
            run_fn = run_fn or run_candidate
        self.build_fn = build_fn
        self.run_fn = run_fn
        self._build: WorkerSet | None = None
        self._bench: dict[str, WorkerSet] = {}
        self.waiting_for: tuple[str, ...] = ()  # stages waited for now: no node had room (autoscaling)

    @property
    def service(self) -> ServiceConfig:
        return self.config.service

    # -- workers ------------------------------------------------------------------------------

    def start(self, pools: Sequence[str]) -> dict[str, int]:
        """Start build workers and the bench workers of `pools`; returns bench workers per pool.

        An unknown pool, or one the cluster has no resources for, fails at once with a
        UserError; a pool none of whose workers start within `worker_start_timeout_s` too. With
        `service.autoscaling`, a pool with no node yet is waited for up to `pool_wait_s` instead
        (its pending workers are the autoscaler's demand); one whose node never comes is left
        with no workers and `unavailable` set, so a sweep fails its results (the others go on).
        """
        require("cluster", "ray", purpose="the Ray evaluation service")
        import ray

        if not ray.is_initialized():
            raise UserError("Ray is not running: open speedforge.cluster.ray_session() first")
        configs = resolve_pools(pools, self.service)
        nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
        # unset: on for a cluster joined by address (its groups scale from zero), off for a Ray started here
        autoscaling = bool(for_address(self.service, joined_address()).autoscaling)
        plan = plan_bench_workers(configs, nodes, autoscaling=autoscaling)
        waiting = set(absent_pools(configs, nodes)) if autoscaling else set()
        starting: dict[str, list[Any]] = {}
        if self._build is None:
            bench_cpus = sum(worker_need(configs[p]).get("CPU", 0.0) * n for p, n in plan.items() if p not in waiting)
            actor = ray.remote(BuildWorker).options(
                **actor_options({"CPU": self.service.build_num_cpus}), max_restarts=0
            )
            count = plan_build_workers(self.service, nodes, bench_cpus)
            spawned = itertools.count()  # a replacement takes the next slot's niceness

            def spawn() -> Any:
                nice = build_nice(self.service, next(spawned), count)
                return actor.remote(self.build_fn, nice, build_slowdown(self.service, nice))

            self._build = WorkerSet("build", spawn, self.service.worker_restarts)
            starting["build"] = self._build.grow_to(count)
            if autoscaling and fit_count(nodes, {"CPU": self.service.build_num_cpus}) == 0:
                waiting.add("build")
        for name, count in plan.items():
            if name not in self._bench:
                pool = configs[name]
                # overlap_runs calls at once, each in a thread of the actor: one prepares while another times
                actor = ray.remote(BenchWorker).options(
                    **actor_options(worker_need(pool)),
                    max_restarts=0,
                    max_concurrency=self.config.evaluator.overlap_runs,
                )
                spawn = lambda a=actor, n=name, d=pool.device: a.remote(self.run_fn, n, d, self.build_fn)  # noqa: E731
                self._bench[name] = WorkerSet(name, spawn, self.service.worker_restarts)
            self._bench[name].unavailable = ""
            starting[name] = self._bench[name].grow_to(count)
        self._wait_ready(starting, waiting)
        return {name: len(self._bench[name].workers) for name in plan}

    def _wait_ready(self, starting: dict[str, list[Any]], waiting: set[str] = frozenset()) -> None:
        """Wait until every worker being started is up, at most `worker_start_timeout_s`, or
        `pool_wait_s` for the stages in `waiting` (no node yet: the autoscaler is adding one).

        A stage none of whose new workers started is a UserError, except a waiting pool: it is
        left with no workers and `unavailable` says why (its results fail in the sweep). Workers
        still pending at the deadline (the cluster has no room for them: resources taken by other
        actors) are killed and dropped with a warning, so no work is ever sent to a worker that
        cannot run.
        """
        refs = {handle.ready.remote(): (name, handle) for name, handles in starting.items() for handle in handles}
        up = {name: 0 for name, handles in starting.items() if handles}
        began = time.monotonic()
        limit = {
            name: self.service.pool_wait_s if name in waiting else self.service.worker_start_timeout_s for name in up
        }
        waited = sorted(name for name in waiting if name in up)
        if waited:
            say(
                f"{', '.join(waited)}: no node of the Ray cluster has room for a worker yet; waiting up to "
                f"{self.service.pool_wait_s:g} s for the autoscaler to add one (service.pool_wait_s)"
            )
        pending = list(refs)
        failure: dict[str, str] = {}
        next_note = began + WAIT_NOTE_S
        self.waiting_for = tuple(waited)
        try:
            self._wait_loop(refs, pending, up, began, limit, waiting, failure, next_note)
        finally:
            self.waiting_for = ()
        down = sorted(name for name, count in up.items() if count == 0)
        never = [name for name in down if name in waiting and name != "build" and name not in failure]
        for name in never:
            self._bench[name].unavailable = (
                f"pool {name}: no node with room for its workers came within "
                f"{self.service.pool_wait_s:g} s of asking the autoscaler "
                "(service.pool_wait_s; see `ray status` and the RayCluster's events)"
            )
            say(self._bench[name].unavailable + "; its results fail as infra_error, the other pools go on")
        down = [name for name in down if name not in never]
        if down:
            raise UserError(
                "; ".join(
                    f"{name} workers failed to start: {failure[name]}"
                    if name in failure
                    else f"no worker of {name} started within {limit[name]:g} s: "
                    + (
                        "no node with room for it came (autoscaling: see `ray status`)"
                        if name in waiting
                        else "the cluster has the resources, but they are taken (see `ray status`)"
                    )
                    for name in down
                )
            )
        dropped = {name: len(starting[name]) - count for name, count in up.items() if 0 < count < len(starting[name])}
        if dropped:
            say(
                ", ".join(f"{n} of {len(starting[name])} {name} workers" for name, n in dropped.items())
                + f" did not start within {self.service.worker_start_timeout_s:g} s (resources taken?) and were "
                "dropped; the sweep runs on the others"
            )

    def _wait_loop(
        self,
        refs: dict[Any, tuple[str, Any]],
        pending: list[Any],
        up: dict[str, int],
        began: float,
        limit: dict[str, float],
        waiting: set[str],
        failure: dict[str, str],
        next_note: float,
    ) -> None:
        """_wait_ready's loop: count workers up in `up`, failures in `failure`, drop the late."""
        import ray

        while pending:
            now = time.monotonic()
            if now >= next_note:
                still = sorted({refs[ref][0] for ref in pending if refs[ref][0] in waiting and up[refs[ref][0]] == 0})
                if still:
                    say(
                        f"still waiting for a node for {', '.join(still)} ({now - began:.0f} of "
                        f"{self.service.pool_wait_s:g} s)"
                    )
                next_note = now + WAIT_NOTE_S
            soonest = min(limit[refs[ref][0]] for ref in pending) + began
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, min(soonest, next_note) - now))
            if not ready:  # nothing came in time: drop what is past its stage's limit
                now = time.monotonic()
                expired = [ref for ref in pending if now - began >= limit[refs[ref][0]]]
                pending = [ref for ref in pending if ref not in expired]
                for ref in expired:  # never placed: drop, or a sweep would wait on them
                    self._drop(*refs[ref])
                continue
            name, handle = refs[ready[0]]
            try:
                ray.get(ready[0])
                if name in waiting and up[name] == 0:
                    say(f"{name}: a worker is up after {time.monotonic() - began:.0f} s")
                up[name] += 1
            except ray.exceptions.RayError as exc:
                failure[name] = first_line(exc)
                self._drop(name, handle)

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
        if self._build is None and not self._bench:  # nothing started (Ray may not even be installed)
            return
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
        force: bool = False,
    ) -> list[EvalResult]:
        """One EvalResult per distinct (candidate, pool), in input order.

        `store`: a Store, whose results table this call opens (and holds the lease of; force
        takes over an expired lease), or a ResultsTable the caller opened and closes. Pairs
        already in the table are not evaluated again; their recorded results are returned. New
        results are appended to the table as they arrive. A list of candidates is checked first
        (sweep.check_inputs): a missing task or a pool that cannot run a family is a UserError
        before anything starts.
        """
        pools = list(dict.fromkeys(pools))
        if not isinstance(tasks, Mapping):
            tasks = {t.task_id: t for t in tasks}
        configs = resolve_pools(pools, self.service)
        if isinstance(candidates, Sequence):
            check_inputs(candidates, tasks, configs)
        sink = (
            store if isinstance(store, ResultsTable) or store is None else ResultsTable.open(store, self.config, force)
        )
        try:
            self.start(pools)
            sweep = Sweep(
                self.service,
                sweep_evaluator_config(self.config.evaluator, configs),
                self._build,
                {p: self._bench[p] for p in pools},
                tasks,
                sink.recorded() if sink else {},
                sink,
                on_progress,
            )
            try:
                sweep.run(candidates)
            except BaseException:
                self._abandon(sweep)
                raise
        finally:
            if sink is not store:
                sink.close()
            elif sink is not None:
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
