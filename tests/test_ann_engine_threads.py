"""The engine's search on several threads: the same answers on any number of threads (also more
than the machine has), workers kept across calls, errors raised from workers, concurrent
callers, and forked children."""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from speedforge.ann.datasets import synthetic
from speedforge.ann.engine import baseline, build_candidate, load_extension, module_source

eng = baseline()
THREAD_COUNTS = (1, 2, 4, 16)


@pytest.fixture(scope="module")
def sift():
    return synthetic("sift", 3000, 300, seed=11)


@pytest.fixture(scope="module", params=["sq8", "none"])
def index(request, sift):
    index = eng.Index(sift.dim, "l2", M=8, ef_construction=40, quantization=request.param)
    index.build(sift.base, threads=2)
    return index


@pytest.fixture(scope="module")
def expected(index, sift):
    return index.search(sift.queries, 10, 40, threads=1)


def test_search_answers_the_same_on_any_number_of_threads(index, sift, expected):
    for threads in THREAD_COUNTS:
        labels, dists = index.search(sift.queries, 10, 40, threads=threads)
        np.testing.assert_array_equal(labels, expected[0])
        np.testing.assert_array_equal(dists, expected[1])


def test_repeated_searches_on_changing_thread_counts_keep_answering_the_same(index, sift, expected):
    for call in range(60):
        threads = THREAD_COUNTS[call % len(THREAD_COUNTS)]
        part = slice(call % 7, 300 - call % 5)  # batches of changing sizes, down to a single chunk
        labels, _ = index.search(sift.queries[part], 10, 40, threads=threads)
        np.testing.assert_array_equal(labels, expected[0][part])


def test_a_non_finite_query_is_named_by_its_row_on_any_number_of_threads(index, sift):
    queries = sift.queries.copy()
    queries[150, 3] = np.inf
    queries[41, 0] = np.nan
    for threads in THREAD_COUNTS:
        with pytest.raises(ValueError, match=r"queries contain NaN or infinite values \(first at row 41\)"):
            index.search(queries, 10, 40, threads=threads)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="lists threads through /proc")
def test_repeated_searches_reuse_the_same_worker_threads():
    script = """
import os
from speedforge.ann.datasets import synthetic
from speedforge.ann.engine import baseline
ds = synthetic("sift", 1000, 200, seed=1)
index = baseline().Index(ds.dim, "l2", M=8, ef_construction=20)
index.build(ds.base, threads=1)
tasks = lambda: set(os.listdir("/proc/self/task"))
before = tasks()
index.search(ds.queries, 10, 20, threads=4)
first = tasks()
for call in range(30):
    index.search(ds.queries, 10, 20, threads=2 + call % 3)
print(len(first - before), first == tasks())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True)
    workers, unchanged = out.stdout.split()
    assert int(workers) == 3 and unchanged == "True"


@pytest.fixture(scope="module")
def off_thread_failing_engine(tmp_path_factory):
    """The engine with a search module that fails on any thread but the one that loaded it (the
    caller's), and is slow on that one, so that workers take some of the queries."""
    source = module_source("search").replace('"beam-prefetch"', '"fails-off-thread"')
    source = source.replace(
        "namespace sfann {\nnamespace {\n",
        """#include <chrono>
#include <stdexcept>
#include <thread>

namespace sfann {
namespace {

const std::thread::id kLoader = std::this_thread::get_id();
""",
        1,
    )
    source = source.replace(
        "SearchScratch& scratch) const override {\n",
        """SearchScratch& scratch) const override {
    if (std::this_thread::get_id() != kLoader) throw std::runtime_error("search failed on a worker thread");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
""",
        1,
    )
    assert "kLoader" in source and "failed on a worker" in source
    return load_extension(build_candidate(source, "search", tmp_path_factory.mktemp("failing")).path)


def test_an_exception_in_a_worker_reaches_the_caller_and_the_pool_stays_usable(off_thread_failing_engine, sift):
    failing = off_thread_failing_engine.Index(sift.dim, "l2", M=8, ef_construction=40)
    failing.build(sift.base, threads=1)
    reference = eng.Index(sift.dim, "l2", M=8, ef_construction=40)
    reference.build(sift.base, threads=1)
    expected = reference.search(sift.queries[:20], 10, 40, threads=1)[0]
    for _ in range(3):
        with pytest.raises(RuntimeError, match="search failed on a worker thread"):
            failing.search(sift.queries, 10, 40, threads=4)
        np.testing.assert_array_equal(failing.search(sift.queries[:20], 10, 40, threads=1)[0], expected)


def test_concurrent_callers_each_get_their_answers(index, sift, expected):
    failures = []

    def caller(seed):
        rng = np.random.default_rng(seed)
        for _ in range(15):
            rows = rng.choice(len(sift.queries), size=120, replace=False)
            labels, _ = index.search(sift.queries[rows], 10, 40, threads=int(rng.choice([2, 4, 16])))
            if not np.array_equal(labels, expected[0][rows]):
                failures.append(seed)

    callers = [threading.Thread(target=caller, args=(seed,)) for seed in range(4)]
    for c in callers:
        c.start()
    for c in callers:
        c.join(timeout=240)
    assert not any(c.is_alive() for c in callers), "a concurrent search did not return"
    assert not failures


def _in_forked_child(check, timeout_s=60.0):
    """Runs check() in a forked child; True if it returned True (a child that hangs is killed)."""
    pid = os.fork()
    if pid == 0:
        try:
            code = 0 if check() else 1
        except BaseException:
            code = 2
        os._exit(code)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError(f"the forked child did not finish in {timeout_s:.0f} s")


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_searches_on_threads_after_the_parent_did(index, sift, expected):
    for threads in (4, 2, 16):
        np.testing.assert_array_equal(index.search(sift.queries, 10, 40, threads=threads)[0], expected[0])

    def child():
        return all(np.array_equal(index.search(sift.queries, 10, 40, threads=t)[0], expected[0]) for t in (4, 16, 2))

    assert _in_forked_child(child)
    assert _in_forked_child(lambda: _in_forked_child(child))  # a grandchild too
    np.testing.assert_array_equal(index.search(sift.queries, 10, 40, threads=4)[0], expected[0])


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_while_another_thread_searches_can_search_on_threads(sift):
    busy = eng.Index(sift.dim, "l2", M=8, ef_construction=40)
    busy.build(sift.base, threads=2)
    idle = eng.Index(sift.dim, "l2", M=8, ef_construction=40)
    idle.build(sift.base, threads=2)
    expected = idle.search(sift.queries, 10, 40, threads=1)[0]
    stop = threading.Event()

    def keep_searching():
        while not stop.is_set():
            busy.search(sift.queries, 10, 40, threads=2)

    searcher = threading.Thread(target=keep_searching)
    searcher.start()
    try:
        for _ in range(5):
            time.sleep(0.01)
            assert _in_forked_child(lambda: np.array_equal(idle.search(sift.queries, 10, 40, threads=2)[0], expected))
    finally:
        stop.set()
        searcher.join()
