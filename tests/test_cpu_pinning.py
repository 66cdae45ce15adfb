"""CPU-family run stages are pinned to CPUs claimed host-wide (unpinned, a sandbox
measured on whichever CPU the scheduler gave it, 1.55x on one and 1.20x on the other)."""

from __future__ import annotations

import os

import pytest

from sandbox_probes import probe

from speedforge.evaluator import cpus


def test_claims_are_exclusive_and_take_the_highest_free_cpus_first():
    with cpus.claim(1, [0, 1, 2, 3]) as first:
        assert first == [3]
        with cpus.claim(2, [0, 1, 2, 3]) as second:
            assert second == [1, 2]
            with cpus.claim(2, [0, 1, 2, 3]) as third:
                assert third == [], "only CPU 0 is free: no partial claim"
            with cpus.claim(1, [0, 1, 2, 3]) as fourth:
                assert fourth == [0], "the failed claim above released what it had taken"
    with cpus.claim(4, [0, 1, 2, 3]) as everything:
        assert everything == [], "pinning to every CPU would change nothing"
    with cpus.claim(1, [0, 1, 2, 3]) as again:
        assert again == [3], "every claim ended with its block"


def _evaluate(tmp_path, expected: list[int], pin: bool = True):
    tmp_path = tmp_path / "cache"
    body = f"        return torch.ones(1) if sorted(os.sched_getaffinity(0)) == {expected} else torch.zeros(1)"
    return probe("affinity", body, str(tmp_path), pin_cpus=pin)


@pytest.fixture(autouse=True)
def private_claims(tmp_path, monkeypatch):
    """Claims in a folder of this test's own, so that evaluations elsewhere on the host (another
    test run, a Ray bench worker) cannot hold the CPU the test expects."""
    folder = tmp_path / "claims"
    folder.mkdir()
    monkeypatch.setattr(cpus, "lock_dir", lambda: folder)


def test_a_lock_file_another_user_made_read_only_still_claims(tmp_path):
    (tmp_path / "claims" / "3.lock").touch(mode=0o444)
    with cpus.claim(1, [0, 1, 2, 3]) as taken:
        assert taken == [3]


@pytest.fixture()
def allowed() -> list[int]:
    cpus_here = cpus.allowed()
    if len(cpus_here) < 2:
        pytest.skip("pinning needs at least 2 CPUs; this machine allows this process only one")
    return cpus_here


def test_the_run_stage_runs_on_the_highest_free_cpu(tmp_path, allowed):
    result = _evaluate(tmp_path, [allowed[-1]])
    assert result.status == "ok", (result.status, result.reason)


def test_a_cpu_claimed_elsewhere_is_not_shared(tmp_path, allowed):
    with cpus.claim(1, allowed) as taken:
        assert taken == [allowed[-1]]
        result = _evaluate(tmp_path, [allowed[-2]])
    assert result.status == "ok", (result.status, result.reason)


def test_pinning_can_be_turned_off(tmp_path, allowed):
    result = _evaluate(tmp_path, allowed, pin=False)
    assert result.status == "ok", (result.status, result.reason)
    assert os.sched_getaffinity(0) == set(allowed)


def test_builds_leave_the_highest_cpus_to_timed_runs_where_the_host_has_enough():
    """A cold run builds extensions while other candidates are timed: on a 16-core H100 host a
    launch-bound reference read 1.62x its pristine time in two sandboxes in a row beside the
    builds, and the tripwire called it sabotage. Builds keep off the CPUs timed runs take."""
    sixteen = list(range(16))
    assert cpus.build_cpus(sixteen, -1, 1) == list(range(14))  # auto: 2 spare on 16
    assert cpus.build_cpus(list(range(32)), -1, 4) == list(range(28))  # a CPU run of 4 threads: 4 spare
    assert cpus.build_cpus(sixteen, -1, 4) == sixteen  # 16 < 5 x 4: none
    assert cpus.build_cpus([0, 1], -1, 1) == [0, 1]  # a 2-core box: too few to spare any
    assert cpus.build_cpus(list(range(9)), -1, 1) == list(range(9))  # 9 < 5 x 2
    assert cpus.build_cpus(list(range(10)), -1, 1) == list(range(8))
    assert cpus.build_cpus([0, 1], 1, 1) == [0]  # configured: one CPU left to runs
    assert cpus.build_cpus([0, 1], 5, 1) == [0]  # never all of them
    assert cpus.build_cpus([3], 1, 1) == [3]
    assert cpus.build_cpus(sixteen, 0, 1) == sixteen  # off


def test_a_build_sandbox_and_its_compilers_run_off_the_spare_cpus(tmp_path, allowed):
    """Through the real build path: the candidate (imported by its build, as load_inline runs
    there) writes the CPUs it may use to its build folder."""
    import dataclasses

    from speedforge.config import EvaluatorConfig
    from speedforge.evaluator import build_candidate
    from speedforge.records import Candidate, Task

    here = os.path.dirname(__file__)
    task = Task(task_id="test/add", family="cpp", name="add", source=open(f"{here}/data/cpp_add_task.py").read())
    source = (  # no compiler runs (a second each): naming torch.utils.cpp_extension makes it a build
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def forward(self, a, b):\n        return a + b * 2\n\n\n"
        "# torch.utils.cpp_extension is not called here\n"
        "import os as _os\n"
        "try:\n"
        "    with open(_os.path.join(_os.environ['TORCH_EXTENSIONS_DIR'], 'affinity.txt'), 'a') as _f:\n"
        "        _f.write(repr(sorted(_os.sched_getaffinity(0))) + ' ' + _os.environ.get('MAX_JOBS', '') + '\\n')\n"
        "except OSError:\n"
        "    pass\n"
    )
    config = EvaluatorConfig(cache_dir=str(tmp_path / "cache"), build_spare_cpus=1)
    built = build_candidate(task, Candidate.make(task.task_id, source, origin="test:affinity"), config)
    assert built.ok and not built.cached, built.failure
    first = open(os.path.join(built.build_dir, "affinity.txt")).read().splitlines()[0]
    assert first == f"{allowed[:-1]!r} {min(len(allowed) - 1, 8)}", first
    # with nothing spared the build may use every CPU this process may
    config = dataclasses.replace(config, cache_dir=str(tmp_path / "cache2"), build_spare_cpus=0)
    built = build_candidate(task, Candidate.make(task.task_id, source, origin="test:affinity"), config)
    first = open(os.path.join(built.build_dir, "affinity.txt")).read().splitlines()[0]
    assert first == f"{allowed!r} {min(len(allowed), 8)}", first
