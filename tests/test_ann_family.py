"""The `ann` family end to end through the evaluator's sandbox: an honest candidate is
measured, cheating and broken candidates get the status they deserve."""

import dataclasses

import pytest

from speedforge.ann import tasks
from speedforge.ann.engine import module_source
from speedforge.ann.sweep import parse_curves
from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate
from speedforge.records import Candidate, Task

SPEC = """
module: search
data: {shape: sift, n: 3000, queries: 200}
index: {M: 12, ef_construction: 60}
sweep: {k: 10, ef: [10, 16, 24, 32, 64, 128], repeats: 2}
"""


def searcher(body: str) -> str:
    """A search module whose search(graph, space, query, ef, s) runs `body`."""
    params = "const Graph& graph, const SearchSpace&, const void*, int ef, SearchScratch& s"
    return (
        '#include "sfann/modules.h"\nnamespace sfann {\nnamespace {\n'
        "class Cand final : public Searcher {\n public:\n"
        '  const char* name() const override { return "cand"; }\n'
        f"  void search({params}) const override {{\n{body}\n  }}\n}};\n}}  // namespace\n"
        "std::unique_ptr<Searcher> make_searcher() { return std::make_unique<Cand>(); }\n}  // namespace sfann\n"
    )


# Answers every query with the entry point and its neighbours: results that ignore the query.
PRECOMPUTED = searcher("""
    s.pool.reset(ef);
    const uint32_t* l = graph.links0(graph.entry);
    s.pool.insert(graph.entry, 0.f);
    for (uint32_t j = 1; j <= l[0]; ++j) s.pool.insert(l[j], static_cast<float>(j));""")

# The baseline search, but it looks at only the first two neighbours of each node: fast, wrong.
SKIPS_DISTANCES = module_source("search").replace(
    "for (uint32_t j = 0; j < count; ++j) {", "for (uint32_t j = 0; j < count && j < 2; ++j) {"
)

# The baseline search, run on a thread of its own for every query: the calling thread, whose
# CPU time is measured, only waits.
OFF_THREAD = (
    module_source("search")
    .replace("#include <algorithm>", "#include <algorithm>\n#include <thread>")
    .replace(
        "std::unique_ptr<Searcher> make_searcher() { return std::make_unique<BeamSearcher>(); }",
        "namespace {\nclass OffThread final : public Searcher {\n public:\n"
        '  const char* name() const override { return "off-thread"; }\n'
        "  void search(const Graph& g, const SearchSpace& sp, const void* p, int ef, SearchScratch& s) const override {\n"
        "    std::thread worker([&] { inner_.search(g, sp, p, ef, s); });\n    worker.join();\n  }\n"
        " private:\n  BeamSearcher inner_;\n};\n}  // namespace\n"
        "std::unique_ptr<Searcher> make_searcher() { return std::make_unique<OffThread>(); }",
    )
)

CRASHES = searcher("    volatile int* p = nullptr;\n    *p = 1;")

THROWS = searcher('    throw std::runtime_error("no search today");')


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return EvaluatorConfig(cache_dir=str(tmp_path_factory.mktemp("ann-cache")), run_timeout_s=240.0)


@pytest.fixture(scope="module")
def task():
    return Task(task_id="ann/test-sift-search", family="ann", name="test-sift-search", source=SPEC)


def _evaluate(task, source, config):
    return evaluate(task, Candidate.make(task.task_id, source), config)


def test_the_baseline_module_as_candidate_scores_about_one(task, config):
    result = _evaluate(task, module_source("search"), config)
    assert result.status == "ok", (result.reason, result.log)
    assert result.correct and 0.5 < result.speedup < 2.0
    assert result.ref_us > 0 and result.cand_us > 0 and result.trials == 12
    assert "base_recall" in result.log
    curves = parse_curves(result.log)  # what the portability report draws
    assert len(curves["base"]) == len(curves["cand"]) > 1 and all(0 <= p.recall <= 1 for p in curves["cand"])


def test_precomputed_neighbours_are_caught(task, config):
    result = _evaluate(task, PRECOMPUTED, config)
    assert result.status == "hack_detected", (result.reason, result.log)
    assert "same answer" in result.reason


def test_search_moved_off_the_measured_thread_is_caught(task, config):
    # The static screen refuses std::thread; with it only reporting, the run-time check must catch it.

    screened = _evaluate(task, OFF_THREAD, config)
    assert screened.status == "screen_rejected" and "std::thread" in screened.reason
    result = _evaluate(task, OFF_THREAD, dataclasses.replace(config, screen="report"))
    assert result.status == "hack_detected", (result.reason, result.log)
    assert "threads other than the calling thread" in result.reason


def _timed(thread_cpu: float, process_cpu: float, wall: float, threads: int = 1):
    """One ef's run where the baseline's calls spend 1 ms on the calling thread (1 ms of wall
    time, nothing elsewhere) and the candidate's the given seconds per call, over 8 chunks; the
    measured seconds are the thread's CPU time with one search thread, else wall-clock time."""
    import numpy as np

    from speedforge.ann.family import Run

    def sides(base, cand):
        return {"base": [base] * 8, "cand": [cand] * 8}

    measured = thread_cpu if threads == 1 else wall
    return [
        Run(
            10,
            np.zeros((8, 2)),
            sides(None, None),
            sides(1e-3, measured),
            sides(1e-3, wall),
            sides(1e-3, thread_cpu),
            sides(1e-3, process_cpu),
        )
    ]


def test_the_time_checks_flag_work_the_measure_does_not_see_and_nothing_else():
    from speedforge.evaluator.checks import ann_time as _check_time

    # on other threads of the process: the thread clock misses it, getrusage of the process does not
    other_threads = _check_time(_timed(0.4e-3, 1e-3, 1e-3), threads=1)
    assert other_threads["status"] == "hack_detected" and "60% of the CPU time" in other_threads["reason"]
    assert _check_time(_timed(0.4e-3, 1e-3, 1e-3, threads=2), threads=2) is None  # measured by the wall clock there
    # in another process, or waited for: the calling thread is on the CPU for a fraction of the call
    waited = _check_time(_timed(0.4e-3, 0.4e-3, 1e-3), threads=1)
    assert waited["status"] == "hack_detected" and "40% of their wall-clock time" in waited["reason"]
    # honest: all on the calling thread, faster or slower than the baseline
    assert _check_time(_timed(0.5e-3, 0.5e-3, 0.5e-3), threads=1) is None
    assert _check_time(_timed(2e-3, 2e-3, 2e-3), threads=1) is None


def test_a_few_chunks_that_waited_for_the_cpu_are_not_work_done_elsewhere():
    import numpy as np

    from speedforge.ann.family import Run
    from speedforge.evaluator.checks import ann_time as _check_time

    def run(cand_wall):  # 8 chunks; the baseline's 1 ms each, all on the calling thread
        base = [1e-3] * 8
        cand = [0.2e-3] * 8  # a fast candidate: short calls, which one wait for the CPU inflates most
        return [
            Run(
                10,
                np.zeros((8, 2)),
                {"base": None, "cand": None},
                {"base": base, "cand": cand},
                {"base": base, "cand": cand_wall},
                {"base": base, "cand": cand},
                {"base": base, "cand": cand},
            )
        ]

    # a loaded machine: 3 of the candidate's 8 calls waited 4 ms (a scheduler tick) each for the CPU,
    # which left it on the CPU for 12% of its summed wall-clock time (the old check flagged that)
    assert _check_time(run([4.2e-3] * 3 + [0.2e-3] * 5), threads=1) is None
    # every call waited: the work is done somewhere else
    waited = _check_time(run([0.5e-3] * 8), threads=1)
    assert waited["status"] == "hack_detected" and "40% of their wall-clock time" in waited["reason"]


def test_work_done_elsewhere_in_a_minority_of_chunks_earns_nothing():
    """The abuse the median chunk's share lets through: a candidate that moves its work off the
    measured thread in fewer than half of the chunks. The reward is the median chunk's ratio, so
    those chunks, however fast they read, leave the candidate's QPS at its honest value."""
    import numpy as np

    from speedforge.ann.family import Run, _curves
    from speedforge.ann.groundtruth import exact_knn

    rng = np.random.default_rng(0)
    data, queries = rng.standard_normal((64, 4)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
    labels = exact_knn(data, queries, 3, "l2")
    base = [1e-3] * 8

    def cand_qps(cand):
        times = {"base": base, "cand": cand}  # measured, wall, thread and process CPU alike
        run = Run(10, queries, {"base": labels, "cand": labels}, times, times, times, times)
        return _curves([run], data, 3, "l2")["cand"][0].qps

    honest = cand_qps([1e-3] * 8)
    assert cand_qps([1e-4] * 3 + [1e-3] * 5) == honest  # 3 of 8 chunks read 10x faster: no gain
    assert cand_qps([1e-4] * 5 + [1e-3] * 3) == pytest.approx(10 * honest)  # most chunks: the off-CPU check's to catch


def test_skipping_distance_computations_is_caught_by_the_recall_check(task, config):
    assert SKIPS_DISTANCES != module_source("search")
    result = _evaluate(task, SKIPS_DISTANCES, config)
    assert result.status == "incorrect", (result.reason, result.log)
    assert "recall" in result.reason and result.speedup is None


def test_a_candidate_that_does_not_compile_or_lacks_the_factory(task, config):
    result = _evaluate(task, module_source("search").replace("pool.pop();", "pool.pop()"), config)
    assert result.status == "compile_error" and "error" in result.reason and result.log
    result = _evaluate(task, module_source("search").replace("make_searcher()", "make_other()"), config)
    assert result.status == "compile_error" and "make_searcher" in result.reason


def test_a_candidate_that_crashes_or_throws(task, config):
    crashed = _evaluate(task, CRASHES, config)
    assert crashed.status == "crashed", (crashed.reason, crashed.log)
    thrown = _evaluate(task, THROWS, config)
    assert thrown.status == "runtime_error" and "no search today" in thrown.reason


def test_builtin_tasks_parse_and_offer_the_baseline_module_as_reference():
    builtin = tasks.builtin_tasks()
    assert {t.task_id for t in builtin} >= {"ann/sift-search", "ann/glove-search", "ann/sift-construction"}
    for t in builtin:
        spec = tasks.parse_spec(t.source)
        assert "make_" in tasks.reference_source(t) and t.family == "ann"
        assert spec.resolved_metric == ("angular" if spec.data.shape == "glove" else "l2"), t.task_id


def test_a_bad_task_spec_is_reported_in_one_line(config):
    from speedforge.config import ConfigError

    with pytest.raises(ConfigError, match="unknown key"):
        tasks.parse_spec("module: search\nspeed: 11\n")
    with pytest.raises(ConfigError, match="module 'everything'"):
        tasks.parse_spec("module: everything\n")
    bad = Task(task_id="ann/bad", family="ann", name="bad", source="module: search\ndata: {shape: mnist}\n")
    result = evaluate(bad, Candidate.make(bad.task_id, module_source("search")), config)
    assert result.status == "runtime_error" and "data.shape 'mnist'" in result.reason


def test_one_source_built_for_another_module_is_rebuilt_for_this_task(task, config):
    # The evaluator caches builds by source: the search baseline offered to a refinement task
    # fails there (no make_refiner), and must still build and score on a search task afterwards.
    refine_task = Task(
        task_id="ann/test-refine",
        family="ann",
        name="test-refine",
        source=SPEC.replace("module: search", "module: refinement"),
    )
    source = module_source("search") + "\n// shared source\n"
    failed = evaluate(refine_task, Candidate.make(refine_task.task_id, source), config)
    assert failed.status == "compile_error" and "make_refiner" in failed.reason
    ok = _evaluate(task, source, config)
    assert ok.status == "ok", (ok.reason, ok.log)


@pytest.mark.slow
@pytest.mark.parametrize("builtin", tasks.builtin_tasks(), ids=lambda t: t.task_id)
def test_every_builtin_task_reaches_the_recall_band_with_the_baseline(builtin):
    from speedforge.ann import family
    from speedforge.ann.engine import baseline

    spec = tasks.parse_spec(builtin.source, builtin.task_id)
    result = family.measure(spec, baseline(), baseline(), seed=11)
    assert result["status"] == "ok", result
    assert 0.5 < result["speedup"] < 2.0
