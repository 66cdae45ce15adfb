"""One sweep of the evaluation service: pull candidates, dispatch batches, collect, record.

The loop keeps every candidate in one of four places: the build queue, a pool's bench queue,
a running actor call, or finished. Exactly one result is recorded per (candidate, pool): a
result is final unless it is an `infra_error` with retries left, and a call whose worker died
puts its items back in the queue (counting an attempt) instead of recording anything.

Nothing is recorded that a rerun could not trust: `check_inputs` fails a sweep whose candidates
name a task it was not given (or a pool that cannot run their family) before it starts, and a
candidate of an unknown task that only shows up in a streamed input gets its `runtime_error`
result returned but not recorded, so a rerun with the right tasks evaluates it.

What the loop asks of Ray (send a call, wait for calls, get one's outputs, kill a worker) goes
through a `Runtime`, Ray's by default; a test gives a deterministic one, which decides the order
in which calls finish and which workers die, so exactly-once and retries are tested without Ray.
The clock is injectable for the same reason (call deadlines).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from speedforge.cluster.actors import infra_error
from speedforge.cluster.pools import build_slowdown, unable_pools
from speedforge.config import EvaluatorConfig, PoolConfig, ServiceConfig
from speedforge.errors import UserError, first_line
from speedforge.records import RETRYABLE_STATUSES, Candidate, EvalResult, Task

Key = tuple[str, str]  # (candidate_id, pool)
WAIT_S = 0.5  # longest the loop blocks waiting for a call; progress is reported at least this often


class WorkerDied(Exception):
    """The worker a call ran on died before answering (Ray: RayActorError); the message says why."""


class Runtime(Protocol):
    """What the sweep needs from the system its workers run on."""

    def call(self, handle: Any, method: str, *args: Any) -> Any:
        """Send `method(*args)` to a worker; returns a reference to its outcome."""

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> list[Any]:
        """The references among `refs` that have finished (at most `num_returns`; none after `timeout`)."""

    def get(self, ref: Any) -> Any:
        """A finished call's outputs; WorkerDied when its worker died, any other error when the call failed."""

    def kill(self, handle: Any) -> None:
        """Kill a worker; its unfinished calls then end in WorkerDied."""


class RayRuntime:
    """The Runtime of a sweep on Ray actors."""

    def call(self, handle: Any, method: str, *args: Any) -> Any:
        return getattr(handle, method).remote(*args)

    def wait(self, refs: list[Any], num_returns: int, timeout: float) -> list[Any]:
        import ray

        return ray.wait(refs, num_returns=num_returns, timeout=timeout)[0]

    def get(self, ref: Any) -> Any:
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise WorkerDied(first_line(exc, 200)) from exc

    def kill(self, handle: Any) -> None:
        import ray

        ray.kill(handle)


@dataclasses.dataclass
class PoolProgress:
    """Counts of one pool's (candidate, pool) pairs in this sweep."""

    pool: str
    workers: int = 0  # bench workers alive
    submitted: int = 0  # pairs taken from the input that this sweep evaluates
    skipped: int = 0  # pairs already in the results table
    duplicates: int = 0  # pairs repeated in the input
    building: int = 0  # waiting for or in the build stage
    queued: int = 0  # built, waiting for a bench worker
    running: int = 0  # on a bench worker
    done: int = 0
    ok: int = 0
    retries: int = 0  # infra_error attempts that were retried

    @property
    def failed(self) -> int:
        return self.done - self.ok


@dataclasses.dataclass(frozen=True)
class SweepProgress:
    """A snapshot for progress displays, taken as results arrive."""

    pools: tuple[PoolProgress, ...]
    pulled: int  # candidates taken from the input
    in_flight: int  # candidates taken and not finished on every pool
    build_workers: int
    input_done: bool
    elapsed_s: float


@dataclasses.dataclass(eq=False)
class Worker:
    handle: Any  # a Ray actor handle
    outstanding: int = 0  # calls sent and not collected
    items: int = 0  # candidates in those calls
    alive: bool = True


class WorkerSet:
    """The live workers of one stage (build, or one pool's bench) and their replacements."""

    def __init__(self, name: str, spawn: Callable[[], Any], restarts: int) -> None:
        self.name = name
        self.spawn = spawn
        self.restarts_left = restarts
        self.workers: list[Worker] = []
        self.died = 0
        self.unavailable = ""  # why this stage has no worker at all (a pool whose node never came), if so

    def grow_to(self, count: int) -> list[Any]:
        """Start workers until there are `count`; the handles of the new ones."""
        new = [Worker(self.spawn()) for _ in range(count - len(self.workers))]
        self.workers.extend(new)
        return [w.handle for w in new]

    def free(self, calls_per_worker: int) -> Worker | None:
        idle = [w for w in self.workers if w.outstanding < calls_per_worker]
        return min(idle, key=lambda w: w.outstanding) if idle else None

    def lost(self, worker: Worker) -> None:
        """A worker died: replace it while the restart budget lasts."""
        if worker in self.workers:
            self.workers.remove(worker)
        if not worker.alive:
            return
        worker.alive = False
        self.died += 1
        if self.restarts_left > 0:
            self.restarts_left -= 1
            self.workers.append(Worker(self.spawn()))


@dataclasses.dataclass(eq=False)
class Item:
    """One candidate in flight: the pools it is still owed to and its build."""

    task: Task
    candidate: Candidate
    owed: list[str]
    build: Any = None
    build_attempts: int = 0
    run_attempts: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(eq=False)
class Call:
    stage: str  # "build" | a pool name
    worker: Worker
    items: list[Item]
    deadline: float  # monotonic seconds


class Sweep:
    """The state and the loop of one submit."""

    def __init__(
        self,
        config: ServiceConfig,
        evaluator: EvaluatorConfig,
        build_workers: WorkerSet,
        bench_workers: Mapping[str, WorkerSet],
        tasks: Mapping[str, Task],
        recorded: dict[Key, EvalResult],
        sink: Any = None,
        on_progress: Callable[[SweepProgress], None] | None = None,
        runtime: Runtime | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtime = runtime or RayRuntime()
        self.clock = clock  # seconds, monotonic: call deadlines and elapsed time
        self.cfg = config
        self.evaluator = evaluator
        # per item of a call: the slowest build worker's stretched build limit; a bench worker
        # may rebuild (at its own priority) before it runs
        slowest = build_slowdown(config, max(config.build_nice_first, config.build_nice_last))
        self.build_limit_s = evaluator.build_timeout_s * slowest
        # ... and, beside overlap_runs - 1 other runs, may wait for the device's turn that long each
        self.bench_limit_s = evaluator.build_timeout_s + evaluator.run_timeout_s * evaluator.overlap_runs
        # calls a bench worker runs at once (its actor's max_concurrency): one prepares while another times
        self.bench_calls = max(config.calls_per_worker, evaluator.overlap_runs)
        self.build_workers = build_workers
        self.bench_workers = dict(bench_workers)
        self.pools = list(bench_workers)
        self.tasks = tasks
        self.recorded = recorded
        self.sink = sink  # has add(result) and tick(): the results table, or None
        self.on_progress = on_progress
        self.progress = {p: PoolProgress(p) for p in self.pools}
        self.results: dict[Key, EvalResult] = {}
        self.order: list[Key] = []  # every key of the input, in input order, once
        self.owed_keys: set[Key] = set()  # keys taken from the input and not yet finished
        self.build_queue: deque[Item] = deque()
        self.bench_queues: dict[str, deque[Item]] = {p: deque() for p in self.pools}
        self.calls: dict[Any, Call] = {}  # object ref -> call
        self.pulled = 0
        self.in_flight = 0
        self.input_done = False
        self.started = clock()

    def ordered_results(self) -> list[EvalResult]:
        return [self.results[key] for key in self.order]

    # -- the loop -----------------------------------------------------------------------------

    def run(self, candidates: Iterable[Candidate]) -> None:
        source = iter(candidates)
        last_report = 0.0
        while True:
            self._pull(source)
            self._dispatch()
            if self.input_done and not self.calls and self.in_flight == 0:
                break
            if not self.calls:
                raise RuntimeError("evaluation service stalled: candidates in flight but no call running")
            ready = self.runtime.wait(list(self.calls), num_returns=1, timeout=WAIT_S)
            for ref in ready:
                self._collect(ref)
            self._kill_overdue()
            if self.sink:
                self.sink.tick()
            now = self.clock()
            if self.on_progress and (ready or now - last_report >= WAIT_S):
                self.on_progress(self.snapshot())
                last_report = now
        if self.on_progress:
            self.on_progress(self.snapshot())

    def snapshot(self) -> SweepProgress:
        for pool, progress in self.progress.items():
            progress.workers = len(self.bench_workers[pool].workers)
        return SweepProgress(
            pools=tuple(dataclasses.replace(p) for p in self.progress.values()),
            pulled=self.pulled,
            in_flight=self.in_flight,
            build_workers=len(self.build_workers.workers),
            input_done=self.input_done,
            elapsed_s=self.clock() - self.started,
        )

    # -- input --------------------------------------------------------------------------------

    def _pull(self, source: Iterator[Candidate]) -> None:
        """Take candidates from the input until `max_in_flight` are in flight (back-pressure)."""
        while not self.input_done and self.in_flight < self.cfg.max_in_flight:
            candidate = next(source, None)
            if candidate is None:
                self.input_done = True
                return
            self.pulled += 1
            owed = []
            for pool in self.pools:
                key = (candidate.candidate_id, pool)
                if key in self.results or key in self.owed_keys:
                    self.progress[pool].duplicates += 1
                elif key in self.recorded:
                    self.progress[pool].skipped += 1
                    self.order.append(key)
                    self.results[key] = self.recorded.pop(key)
                else:
                    self.order.append(key)
                    self.owed_keys.add(key)
                    self.progress[pool].submitted += 1
                    self.progress[pool].building += 1
                    owed.append(pool)
            if not owed:
                continue
            self.in_flight += 1
            task = self.tasks.get(candidate.task_id)
            item = Item(task, candidate, owed)  # type: ignore[arg-type]
            if task is None:  # returned, never recorded: see the module docstring
                for pool in list(owed):
                    self._finish(item, pool, _unknown_task(candidate, pool), "building", record=False)
            else:
                self.build_queue.append(item)

    # -- dispatch -----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        if self.build_queue and not self.build_workers.workers:
            self._stage_gone(self.build_queue, "build", "building")
        self._fill(self.build_queue, self.build_workers, "build", self.build_limit_s, self.cfg.calls_per_worker)
        for pool, queue in self.bench_queues.items():
            if queue and not self.bench_workers[pool].workers:
                self._stage_gone(queue, pool, "queued")
            self._fill(queue, self.bench_workers[pool], pool, self.bench_limit_s, self.bench_calls)

    def _fill(self, queue: deque[Item], workers: WorkerSet, stage: str, per_item_s: float, calls: int) -> None:
        """Send batches to free workers (each has at most `calls` unanswered); a short queue is spread
        over all of them."""
        while queue:
            worker = workers.free(calls)
            if worker is None:
                return
            size = max(1, min(self.cfg.batch_size, len(queue) // len(workers.workers)))
            items = [queue.popleft() for _ in range(size)]
            if stage == "build":
                ref = self.runtime.call(
                    worker.handle, "build", [(it.task, it.candidate) for it in items], self.evaluator
                )
            else:
                ref = self.runtime.call(
                    worker.handle, "run", [(it.task, it.candidate, it.build) for it in items], self.evaluator
                )
                self.progress[stage].queued -= size
                self.progress[stage].running += size
            worker.outstanding += 1
            worker.items += size
            self.calls[ref] = Call(stage, worker, items, self.clock() + size * per_item_s + self.cfg.call_margin_s)

    def _kill_overdue(self) -> None:
        """Kill a worker whose call ran past its time limit; its items come back as retries."""
        now = self.clock()
        overdue = [ref for ref, call in self.calls.items() if call.deadline < now and call.worker.alive]
        if overdue:  # a call that finished while the loop was busy (a slow store write) is not hung
            finished = self.runtime.wait(overdue, num_returns=len(overdue), timeout=0)
            for ref in set(overdue) - set(finished):
                self.runtime.kill(self.calls[ref].worker.handle)

    # -- collect ------------------------------------------------------------------------------

    def _collect(self, ref: Any) -> None:
        call = self.calls.pop(ref)
        call.worker.outstanding -= 1
        call.worker.items -= len(call.items)
        workers = self._workers(call.stage)
        outputs: list[Any]
        try:
            outputs = self.runtime.get(ref)
            if len(outputs) != len(call.items):
                raise RuntimeError(f"{len(outputs)} outputs for {len(call.items)} items")
        except WorkerDied as exc:
            workers.lost(call.worker)
            outputs = [f"{call.stage} worker died: {first_line(exc, 200)}"] * len(call.items)
        except Exception as exc:  # the call failed as a whole (e.g. a result that did not pickle)
            outputs = [f"{call.stage} call failed: {type(exc).__name__}: {first_line(exc, 200)}"] * len(call.items)
        for item, output in zip(call.items, outputs):
            if call.stage == "build":
                self._built(item, output)
            else:
                self._ran(item, call.stage, output)

    def _built(self, item: Item, output: Any) -> None:
        """A build worker's answer for one item: a Build, an infra_error result, or a reason."""
        if isinstance(output, str):
            output = infra_error(item.task.task_id, item.candidate.candidate_id, "", output)
        failure = output if isinstance(output, EvalResult) else (None if output.ok else output.failure)
        if failure is not None and failure.status in RETRYABLE_STATUSES and item.build_attempts < self.cfg.retries:
            item.build_attempts += 1
            for pool in item.owed:
                self.progress[pool].retries += 1
            self.build_queue.append(item)
        elif failure is not None:
            for pool in list(item.owed):
                self._finish(item, pool, failure, "building")
        else:
            item.build = output
            for pool in item.owed:
                self.progress[pool].building -= 1
                self.progress[pool].queued += 1
                self.bench_queues[pool].append(item)

    def _ran(self, item: Item, pool: str, output: EvalResult | str) -> None:
        if isinstance(output, str):
            output = infra_error(item.task.task_id, item.candidate.candidate_id, pool, output)
        attempts = item.run_attempts.get(pool, 0)
        if output.status in RETRYABLE_STATUSES and attempts < self.cfg.retries:
            item.run_attempts[pool] = attempts + 1
            self.progress[pool].retries += 1
            self.progress[pool].running -= 1
            self.progress[pool].queued += 1
            self.bench_queues[pool].append(item)
        else:
            self._finish(item, pool, output, "running")

    def _workers(self, stage: str) -> WorkerSet:
        return self.build_workers if stage == "build" else self.bench_workers[stage]

    def _stage_gone(self, queue: deque[Item], stage: str, counter: str) -> None:
        """Every worker of a stage died and none may be restarted: fail what waits for it."""
        workers = self._workers(stage)
        reason = workers.unavailable or f"{stage} workers: none left ({workers.died} died, restart budget spent)"
        while queue:
            item = queue.popleft()
            for pool in [p for p in item.owed if stage in ("build", p)]:
                self._finish(
                    item, pool, infra_error(item.task.task_id, item.candidate.candidate_id, pool, reason), counter
                )

    def _finish(self, item: Item, pool: str, result: EvalResult, counter: str, record: bool = True) -> None:
        """Record the one result of (item, pool); `counter` is the stage count it leaves."""
        key = (item.candidate.candidate_id, pool)
        result = dataclasses.replace(result, pool=pool, candidate_id=key[0], task_id=item.candidate.task_id)
        progress = self.progress[pool]
        setattr(progress, counter, getattr(progress, counter) - 1)
        progress.done += 1
        progress.ok += result.ok
        self.results[key] = result
        self.owed_keys.discard(key)
        if self.sink and record:
            self.sink.add(result)
        item.owed.remove(pool)
        if not item.owed:
            self.in_flight -= 1


def _unknown_task(candidate: Candidate, pool: str) -> EvalResult:
    return EvalResult(
        candidate_id=candidate.candidate_id,
        task_id=candidate.task_id,
        pool=pool,
        status="runtime_error",
        reason=f"unknown task {candidate.task_id!r}: it is not among the tasks given to the evaluation service",
    )


def check_inputs(candidates: Sequence[Candidate], tasks: Mapping[str, Task], pools: Mapping[str, PoolConfig]) -> None:
    """Fail, before anything runs or is recorded, when a candidate's task is not in `tasks` or a
    pool can never run the family of a task (a cuda task on a cpu pool): one line, with the
    count and a few of the offenders."""
    missing = Counter(repr(c.task_id) for c in candidates if c.task_id not in tasks)
    if missing:
        raise UserError(
            f"{missing.total()} of {len(candidates)} candidates name a task that is not among the tasks "
            f"given: {_few(missing)}; give the tasks they were written for. Nothing was evaluated "
            "or recorded"
        )
    families = Counter(tasks[c.task_id].family for c in candidates)
    unable = Counter(
        {f"pool {pool} for {family} tasks": families[family] for pool, family in unable_pools(pools, families)}
    )
    if unable:
        raise UserError(
            f"{len(unable)} pool(s) can never run the family of some candidates: {_few(unable)}; choose "
            "pools whose device the family runs on (cuda tasks need a GPU pool, e.g. H100). Nothing was "
            "evaluated or recorded"
        )


def _few(counts: Counter, shown: int = 3) -> str:
    """`'a' (5 candidates), 'b' (2 candidates) and 4 more`: the most common few of `counts`."""
    text = ", ".join(f"{name} ({n} candidate{'s' * (n != 1)})" for name, n in counts.most_common(shown))
    return text + (f" and {len(counts) - shown} more" if len(counts) > shown else "")
