"""The sweep's bookkeeping on a deterministic runtime, without Ray: calls finish in the order the
test chooses, workers die when it says, the clock moves only when nothing can finish. However
calls complete, every (candidate, pool) of the input is recorded exactly once."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from speedforge.cluster.sweep import Sweep, WorkerDied, WorkerSet
from speedforge.config import EvaluatorConfig, ServiceConfig
from speedforge.evaluator.evaluate import Build
from speedforge.records import Candidate, EvalResult, Task

TASK = Task(task_id="cpp/t", family="cpp", name="t", source="class Model: ...")
POOLS = ("cpu", "H100")
HANG = object()  # a call's outcome: never finishes until its worker is killed


class FakeWorker:
    """A worker handle: answers each call at once, or as its script says for one call."""

    def __init__(self, name: str, script: dict[int, object] | None = None, infra: Counter | None = None) -> None:
        self.name = name
        self.script = dict(script or {})  # call number -> WorkerDied(...) or HANG
        self.infra = infra if infra is not None else Counter()  # candidate id -> infra_errors still to return
        self.calls = 0

    def answer(self, method: str, batch: list) -> object:
        self.calls += 1
        scripted = self.script.get(self.calls)
        if scripted is not None:
            return scripted
        if method == "build":
            return [
                Build(
                    candidate_id=c.candidate_id,
                    task_id=t.task_id,
                    ok=True,
                    failure=None,
                    build_dir="",
                    key=c.candidate_id,
                    build_s=0.0,
                    cached=False,
                )
                for t, c in batch
            ]
        outputs = []
        for task, candidate, _ in batch:
            status = "ok"
            if self.infra[candidate.candidate_id] > 0:
                self.infra[candidate.candidate_id] -= 1
                status = "infra_error"
            outputs.append(
                EvalResult(
                    candidate_id=candidate.candidate_id,
                    task_id=task.task_id,
                    pool=self.name,
                    status=status,
                    speedup=2.0 if status == "ok" else None,
                )
            )
        return outputs


class FakeRuntime:
    """Finishes one call per wait, chosen by `pick` among the finishable ones (default: the
    newest, so calls complete in the reverse of the order they were sent); a kill ends the
    worker's unfinished calls with WorkerDied. When only hung calls are left, the clock jumps
    past every deadline, as a real one would while the loop waits."""

    def __init__(self, pick=lambda refs: refs[-1], late_kill: bool = False) -> None:
        self.pick = pick
        self.late_kill = late_kill  # a killed worker's hung call answers anyway (the kill came too late)
        self.now = 0.0
        self.ids = itertools.count()
        self.outcomes: dict[int, object] = {}
        self.handles: dict[int, FakeWorker] = {}
        self.killed: list[FakeWorker] = []
        self.sent: list[tuple[str, str, tuple[str, ...]]] = []  # (worker, method, candidate ids)

    def clock(self) -> float:
        return self.now

    def call(self, handle: FakeWorker, method: str, batch: list, evaluator: EvaluatorConfig) -> int:
        ref = next(self.ids)
        self.handles[ref] = handle
        self.outcomes[ref] = handle.answer(method, batch)
        self.sent.append((handle.name, method, tuple(item[1].candidate_id for item in batch)))
        return ref

    def wait(self, refs: list[int], num_returns: int, timeout: float) -> list[int]:
        ready = [ref for ref in refs if self.outcomes[ref] is not HANG]
        if not ready and timeout > 0:
            self.now += 10_000.0
        return [self.pick(ready)] if ready and num_returns == 1 else ready

    def get(self, ref: int) -> object:
        outcome = self.outcomes.pop(ref)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def kill(self, handle: FakeWorker) -> None:
        self.killed.append(handle)
        for ref, outcome in self.outcomes.items():
            if self.handles[ref] is handle and outcome is HANG:
                self.outcomes[ref] = self.late_answer(handle, ref) if self.late_kill else WorkerDied("killed")

    def late_answer(self, handle: FakeWorker, ref: int) -> list[EvalResult]:
        _, method, ids = self.sent[ref]
        return [
            EvalResult(candidate_id=i, task_id=TASK.task_id, pool=handle.name, status="ok", speedup=1.0) for i in ids
        ]


class Sink:
    """The results table: what was recorded, in order."""

    def __init__(self) -> None:
        self.added: list[EvalResult] = []

    def add(self, result: EvalResult) -> None:
        self.added.append(result)

    def tick(self) -> None:
        pass


def candidates(n: int) -> list[Candidate]:
    return [Candidate.make(TASK.task_id, f"class ModelNew: ...  # {i}", created_at=0.0) for i in range(n)]


def sweep(
    runtime: FakeRuntime,
    scripts: dict[str, list[dict]] | None = None,
    infra: Counter | None = None,
    pools=POOLS,
    workers: int = 2,
    restarts: int = 3,
    recorded=None,
    evaluator: EvaluatorConfig | None = None,
    **service,
) -> tuple[Sweep, Sink]:
    """A sweep over `pools` with `workers` fake workers per stage; scripts[stage][i] scripts the
    i-th worker that stage spawns (replacements included)."""
    scripts = scripts or {}

    def _spawn(stage: str):
        count = itertools.count()
        return lambda: FakeWorker(stage, _nth(scripts.get(stage, []), next(count)), infra)

    build = WorkerSet("build", _spawn("build"), restarts)
    build.grow_to(workers)
    bench = {pool: WorkerSet(pool, _spawn(pool), restarts) for pool in pools}
    for worker_set in bench.values():
        worker_set.grow_to(workers)
    sink = Sink()
    config = ServiceConfig(**({"calls_per_worker": 2} | service))
    return Sweep(
        config,
        evaluator or EvaluatorConfig(),
        build,
        bench,
        {TASK.task_id: TASK},
        dict(recorded or {}),
        sink,
        runtime=runtime,
        clock=runtime.clock,
    ), sink


def _nth(scripts: list[dict], index: int) -> dict:
    return scripts[index] if index < len(scripts) else {}


def recorded_pairs(sink: Sink) -> Counter:
    return Counter((r.candidate_id, r.pool) for r in sink.added)


def every_pair(items: list[Candidate], pools=POOLS) -> Counter:
    return Counter((c.candidate_id, pool) for c in items for pool in pools)


def test_calls_finishing_in_reverse_order_record_every_pair_once_in_input_order():
    runtime = FakeRuntime(pick=lambda refs: refs[-1])
    items = candidates(7)
    run, sink = sweep(runtime)
    run.run(items)
    assert recorded_pairs(sink) == every_pair(items)
    assert [(r.candidate_id, r.pool) for r in run.ordered_results()] == [
        (c.candidate_id, p) for c in items for p in POOLS
    ]
    finished = [r.candidate_id for r in sink.added if r.pool == "cpu"]
    assert finished != [c.candidate_id for c in items]  # they did finish out of order
    assert all(p.done == 7 and p.ok == 7 and p.retries == 0 for p in run.snapshot().pools)


def test_a_worker_that_dies_mid_call_is_replaced_and_its_items_are_recorded_once():
    runtime = FakeRuntime(pick=lambda refs: refs[0])
    items = candidates(4)
    died = WorkerDied("The actor died unexpectedly before finishing this task.")
    run, sink = sweep(runtime, scripts={"cpu": [{1: died}]})  # the first cpu worker dies on its first call
    run.run(items)
    assert recorded_pairs(sink) == every_pair(items)
    assert all(r.status == "ok" for r in sink.added)
    cpu = next(p for p in run.snapshot().pools if p.pool == "cpu")
    assert (cpu.workers, cpu.retries, run.bench_workers["cpu"].died) == (2, 1, 1)
    first_call = next(ids for worker, method, ids in runtime.sent if worker == "cpu")
    assert sum(1 for worker, _, ids in runtime.sent if worker == "cpu" and ids == first_call) == 2  # sent again once


def test_a_pool_whose_workers_all_die_records_infra_error_once_per_pair():
    runtime = FakeRuntime()
    items = candidates(3)
    died = WorkerDied("node lost")
    run, sink = sweep(runtime, scripts={"H100": [{1: died}] * 3}, workers=1, restarts=1)
    run.run(items)
    assert recorded_pairs(sink) == every_pair(items)
    statuses = {(r.candidate_id, r.pool): r.status for r in sink.added}
    assert {s for (_, pool), s in statuses.items() if pool == "cpu"} == {"ok"}
    assert {s for (_, pool), s in statuses.items() if pool == "H100"} == {"infra_error"}
    assert run.bench_workers["H100"].workers == []


def test_infra_errors_are_retried_up_to_the_limit_then_recorded_once():
    runtime = FakeRuntime()
    items = candidates(2)
    flaky, broken = items
    infra = Counter({flaky.candidate_id: 1, broken.candidate_id: 99})
    run, sink = sweep(runtime, infra=infra, pools=("cpu",), retries=2)
    run.run(items)
    assert recorded_pairs(sink) == every_pair(items, ("cpu",))
    status = {r.candidate_id: r.status for r in sink.added}
    assert status == {flaky.candidate_id: "ok", broken.candidate_id: "infra_error"}
    runs = Counter(i for worker, method, ids in runtime.sent if method == "run" for i in ids)
    assert runs == {flaky.candidate_id: 2, broken.candidate_id: 3}  # first try + retries, never more
    assert run.snapshot().pools[0].retries == 3


def test_a_hung_call_is_killed_at_its_deadline_and_its_items_run_once_more():
    runtime = FakeRuntime()
    items = candidates(3)
    run, sink = sweep(runtime, scripts={"cpu": [{1: HANG}]}, pools=("cpu",))
    run.run(items)
    assert [w.name for w in runtime.killed] == ["cpu"]
    assert recorded_pairs(sink) == every_pair(items, ("cpu",))
    assert all(r.status == "ok" for r in sink.added)


def test_a_call_that_answers_although_its_worker_was_killed_is_recorded_once_not_retried():
    runtime = FakeRuntime(late_kill=True)
    items = candidates(3)
    run, sink = sweep(runtime, scripts={"cpu": [{1: HANG}]}, pools=("cpu",))
    run.run(items)
    assert len(runtime.killed) == 1
    assert recorded_pairs(sink) == every_pair(items, ("cpu",))
    runs = Counter(i for worker, method, ids in runtime.sent if method == "run" for i in ids)
    assert set(runs.values()) == {1}


def test_repeated_and_already_recorded_candidates_are_not_evaluated_again():
    runtime = FakeRuntime()
    items = candidates(3)
    done = EvalResult(candidate_id=items[0].candidate_id, task_id=TASK.task_id, pool="cpu", status="ok", speedup=3.0)
    run, sink = sweep(runtime, pools=("cpu",), recorded={(done.candidate_id, "cpu"): done})
    run.run([items[0], items[1], items[1], items[2], items[2], items[1]])
    assert recorded_pairs(sink) == every_pair(items[1:], ("cpu",))
    assert run.ordered_results()[0] == done
    progress = run.snapshot().pools[0]
    assert (progress.submitted, progress.skipped, progress.duplicates) == (2, 1, 3)
    runs = Counter(i for worker, method, ids in runtime.sent if method == "run" for i in ids)
    assert runs == {items[1].candidate_id: 1, items[2].candidate_id: 1}


class CountingRuntime(FakeRuntime):
    """Also counts each worker's unanswered calls, and the most it ever had at once, per stage."""

    def __init__(self) -> None:
        # builds finish first, so the bench queue fills and the sweep sends each bench worker all it may take
        super().__init__(pick=lambda refs: min(refs, key=lambda ref: (self.sent[ref][1] != "build", ref)))
        self.open: Counter = Counter()
        self.peak: Counter = Counter()

    def call(self, handle: FakeWorker, method: str, batch: list, evaluator: EvaluatorConfig) -> int:
        ref = super().call(handle, method, batch, evaluator)
        self.open[id(handle)] += 1
        self.peak[handle.name] = max(self.peak[handle.name], self.open[id(handle)])
        return ref

    def get(self, ref: int) -> object:
        self.open[id(self.handles[ref])] -= 1
        return super().get(ref)


@pytest.mark.parametrize("overlap", [1, 3])
def test_a_bench_worker_is_sent_overlap_runs_calls_at_once(overlap):
    """evaluator.overlap_runs calls per bench worker (its actor runs that many at once: one prepares
    while another times), whatever calls_per_worker says; builds keep calls_per_worker."""
    runtime = CountingRuntime()
    items = candidates(12)
    run, sink = sweep(
        runtime, pools=("H100",), workers=1, calls_per_worker=1, evaluator=EvaluatorConfig(overlap_runs=overlap)
    )
    run.run(items)
    assert recorded_pairs(sink) == every_pair(items, ("H100",))
    assert (runtime.peak["H100"], runtime.peak["build"]) == (overlap, 1)
