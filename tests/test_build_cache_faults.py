"""The host's faults are not the candidate's, and a damaged cached build is built again.

A build the host failed (a full disk, an exceeded quota, an I/O error, a compiler killed for memory)
is infra_error and is never cached; the parent believes such a claim only where it sees the host in
that state. Every cached build carries the checksums of its artifacts, which a lookup verifies: a
damaged build is dropped, built again, and the result says so once.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import evaluate, extensions, harness, host_faults
from speedforge.evaluator.buildcache import BuildCache
from speedforge.evaluator.host_faults import HostWatch, claimed_fault, host_fault
from speedforge.evaluator.checks import Verdict
from speedforge.evaluator.job import Job, StageResult
from speedforge.records import Candidate, Task

DATA = Path(__file__).parent / "data"

# The lines a full disk made gcc write in a build (a 256 KiB tmpfs under the cache).
GCC_DISK_FULL = (
    "FAILED: [code=1] main.o \nc++ -MMD -MF main.o.d -fPIC -std=c++20 -O2 -c /c/builds/k/sf_1/main.cpp -o main.o \n"
    "/c/builds/k/sf_1/main.cpp:16:1: fatal error: error writing to /c/tmp/job-1/ccnj9KpO.s: No space left on device\n"
    "   16 | }\n      | ^\ncompilation terminated.\nninja: build stopped: subcommand failed.\n"
)


def _add_task() -> Task:
    return Task(task_id="test/add", family="cpp", name="add", source=(DATA / "cpp_add_task.py").read_text())


def _config(cache_dir: Path) -> EvaluatorConfig:
    return EvaluatorConfig(
        cache_dir=str(cache_dir),
        run_timeout_s=60.0,
        correctness_trials=2,
        cpu_timed_calls=5,
        min_timed_s=0.0,
        max_timed_calls=5,
        warmup_calls=1,
    )


# -- what reads as the host's fault ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, kind",
    [
        (GCC_DISK_FULL, "disk full"),
        (
            "/usr/bin/ld: final link failed: No space left on device\ncollect2: error: ld returned 1 exit status",
            "disk full",
        ),
        (
            "{standard input}: Assembler messages:\n{standard input}:1234: Fatal error: can't write 8 bytes to section "
            ".text of main.o: 'Disk quota exceeded'",
            "disk quota exceeded",
        ),
        ("cc1plus: fatal error: /c/builds/k/sf_1/main.cpp: Input/output error", "I/O error"),
        ("OSError: [Errno 28] No space left on device: '/c/builds/k/sf_1/main.cpp'", "disk full"),
        ("c++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated.", "compiler killed"),
        ("c++: internal compiler error: Killed (program cc1plus)", "compiler killed"),
        ("nvcc error   : 'cicc' died due to signal 9 (Kill signal)", "compiler killed"),
        ("[1/2] c++ -c main.cpp\nFAILED: [code=137] main.o \nc++ -c main.cpp\nKilled\n", "compiler killed"),
    ],
)
def test_the_hosts_fault_is_read_from_the_tools_own_lines(text, kind):
    found = host_fault(text)
    assert found is not None and found[0] == kind
    assert found[1] and found[1] in text


@pytest.mark.parametrize(
    "text",
    [
        "/c/main.cpp:3:2: error: #error x: No space left on device\n    3 | #error x: No space left on device",  # #error
        "/c/main.cpp:1:9: error: fatal error: x: No space left on device",  # #pragma GCC error "..."
        "/c/main.cpp:1:1: error: static assertion failed: x: No space left on device",
        "/c/main.cpp:1:10: fatal error: x: No space left on device: No such file or directory",  # #include "x: ..."
        "/c/main.cpp:5:3: error: call to 'f' declared with attribute error: x: Disk quota exceeded",
        "/c/main.cpp:1:9: note: '#pragma message: c++: fatal error: Killed signal terminated program cc1plus'",
        "    3 | c++: fatal error: Killed signal terminated program cc1plus",  # an echoed source line
        "/usr/bin/ld: main.o: in function `f': main.cpp:(.text+0x5): warning: x: No space left on device",
        "RuntimeError: the candidate says OSError: [Errno 28] No space left on device",
        "/c/main.cpp:16:1: error: 'undefined_name' was not declared in this scope",
    ],
)
def test_what_a_candidate_makes_a_compiler_print_is_not_a_host_fault(text):
    assert host_fault(text) is None


# -- the parent believes a claim only where the host shows it --------------------------------------


def _failed(status: str, reason: str, log: str = "") -> StageResult:
    return StageResult(status, reason, log=log)


def test_a_full_disk_the_host_shows_makes_a_failed_build_an_infra_error(tmp_path):
    short = HostWatch(tmp_path, need_mb=1 << 40)  # more room than any disk has: this one is short
    judged = short.judge(_failed("compile_error", "RuntimeError: Error building extension", GCC_DISK_FULL))
    assert judged.status == "infra_error"
    assert judged.reason.startswith("the host failed the build (disk full; the host's fault, not the candidate's)")
    assert "No space left on device" in judged.reason


def test_a_host_fault_the_host_does_not_show_stays_the_candidates_and_is_not_cached(tmp_path):
    roomy = HostWatch(tmp_path, need_mb=1)
    compile_error = _failed("compile_error", "RuntimeError: Error building extension", GCC_DISK_FULL)
    assert roomy.judge(compile_error) == compile_error
    claimed = _failed(
        "infra_error", host_faults.host_fault_reason("disk full", "fatal error: ...: No space left on device")
    )
    judged = roomy.judge(claimed)
    assert judged.status == "compile_error" and "does not show" in judged.reason
    cache = BuildCache(tmp_path / "cache")
    for result in (compile_error, judged):
        cache.record("k", result.to_dict())
        assert cache.lookup("k") is None  # tried again next time: a fault that came and went
    plain = _failed(
        "compile_error", "RuntimeError: Error building extension", "main.cpp:1:1: error: 'x' was not declared"
    )
    assert roomy.judge(plain) == plain
    cache.record("k", plain.to_dict())
    assert cache.lookup("k")["status"] == "compile_error"


def test_a_killed_compiler_is_the_hosts_only_when_the_kernel_killed_for_memory_meanwhile(tmp_path):
    killed = _failed(
        "compile_error",
        "RuntimeError: Error building extension",
        "c++: fatal error: Killed signal terminated program cc1plus\ncompilation terminated.",
    )
    counts = iter([3, 4])
    assert HostWatch(tmp_path, 1, kills=lambda: next(counts)).judge(killed).status == "infra_error"
    assert HostWatch(tmp_path, 1, kills=lambda: 3).judge(killed).status == "compile_error"
    assert (
        HostWatch(tmp_path, 1, kills=lambda: None).judge(killed).status == "compile_error"
    )  # unreadable: not believed


def test_the_cache_never_keeps_an_infra_error(tmp_path):
    cache = BuildCache(tmp_path)
    cache.record("k", _failed("infra_error", "build stage failed").to_dict())
    assert cache.lookup("k") is None and not list((tmp_path / "index").iterdir())


# -- checksums of cached builds ----------------------------------------------------------------------


def _fake_build(cache: BuildCache, key: str) -> Path:
    folder = cache.build_dir(key)
    (folder / "sf_1").mkdir()
    (folder / "sf_1" / "sf_1.so").write_bytes(b"\x7fELF" + bytes(4096))
    (folder / "sf_1" / "main.o").write_bytes(b"\x7fELF" + bytes(1024))
    (folder / "sf_1" / "build.ninja").write_text("rule cxx\n")
    (folder / extensions.OUTCOMES_FILE).write_text("{}")
    return folder


def test_an_ok_build_is_recorded_with_the_checksums_of_its_artifacts(tmp_path):
    cache = BuildCache(tmp_path)
    _fake_build(cache, "k")
    cache.record("k", StageResult("ok", build_s=1.0).to_dict())
    entry = json.loads((tmp_path / "index" / "k.json").read_text())
    assert sorted(entry["artifacts"]) == sorted([extensions.OUTCOMES_FILE, "sf_1/main.o", "sf_1/sf_1.so"])
    assert StageResult.from_dict(cache.lookup("k")).ok  # the checksums stay in the index
    with cache.locked("k") as rebuilt:
        assert rebuilt == ""
        assert (tmp_path / "builds" / "k" / "sf_1" / "sf_1.so").exists()  # a sound build is kept


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_build_fails_its_lookup_and_is_dropped_once_with_a_warning(tmp_path, damage):
    cache = BuildCache(tmp_path)
    library = _fake_build(cache, "k") / "sf_1" / "sf_1.so"
    cache.record("k", StageResult("ok").to_dict())
    if damage == "truncated":
        os.truncate(library, 100)
    else:
        library.unlink()
    assert cache.lookup("k") is None
    with cache.locked("k") as rebuilt:
        assert rebuilt == "cached build of k failed its checksum (sf_1/sf_1.so): rebuilt"
        assert cache.lookup("k") is None and not (tmp_path / "index" / "k.json").exists()
        assert list((tmp_path / "builds" / "k").iterdir()) == []  # emptied for the build that follows
        _fake_build(cache, "k")
        cache.record("k", StageResult("ok").to_dict())
    with cache.locked("k") as again:
        assert again == ""
    assert cache.lookup("k") is not None


def test_an_ok_record_without_checksums_is_built_again(tmp_path):
    cache = BuildCache(tmp_path)
    _fake_build(cache, "k")
    (tmp_path / "index" / "k.json").write_text(json.dumps(StageResult("ok").to_dict()))  # as kept before checksums
    assert cache.lookup("k") is None
    with cache.locked("k") as rebuilt:
        assert rebuilt == "cached build of k has no checksums: rebuilt"


# -- the sandbox's classification (harness), in this process ---------------------------------------


@pytest.fixture
def build_job(tmp_path, monkeypatch):
    """A build job of the add task in tmp_path, with a fake compiler behind load_inline; what
    harness.build sets (the environment, torch's loaders, sys.modules) is put back afterwards."""
    import torch.utils.cpp_extension as cpp_extension

    for name in ("TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "MAX_JOBS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setattr(extensions, "_installed", [])
    for name in extensions.LOADERS:
        monkeypatch.setattr(cpp_extension, name, getattr(cpp_extension, name))
    for name in ("sf_candidate", "sf_reference"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    (tmp_path / "work").mkdir()
    (tmp_path / "build").mkdir()

    def make(source: str, compiler_error: Exception | None = None) -> Job:
        def fake_load_inline(*args, **kwargs):
            raise compiler_error

        monkeypatch.setattr(cpp_extension, "load_inline", fake_load_inline)
        task = _add_task()
        return Job(
            kind="build",
            task=task,
            candidate=Candidate.make(task.task_id, source),
            device="cpu",
            seed=0,
            workdir=str(tmp_path / "work"),
            build_dir=str(tmp_path / "build"),
            config=EvaluatorConfig(),
        )

    yield make
    for name in ("sf_candidate", "sf_reference"):
        sys.modules.pop(name, None)


MODEL = "\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n        return a + 2 * b\n"
LOADS = (
    "from torch.utils.cpp_extension import load_inline\n_ext = load_inline(name='x', cpp_sources='', functions=[])\n"
)


def test_a_compile_the_host_failed_is_an_infra_error(build_job):
    result = harness.build(build_job(LOADS + MODEL, RuntimeError(f"Error building extension 'x': {GCC_DISK_FULL}")))
    assert result["status"] == "infra_error"
    assert claimed_fault(result["reason"], "")[0] == "disk full"


def test_a_compile_the_host_failed_is_an_infra_error_also_where_the_candidate_caught_it(build_job):
    source = (
        "from torch.utils.cpp_extension import load_inline\ntry:\n"
        "    _ext = load_inline(name='x', cpp_sources='', functions=[])\nexcept Exception:\n    _ext = None\n"
    )
    result = harness.build(build_job(source + MODEL, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/b/main.cpp")))
    assert result["status"] == "infra_error" and "(disk full;" in result["reason"]


def test_a_host_fault_the_candidate_raises_itself_is_its_own_failure(build_job):
    forged = (f"raise RuntimeError({('Error building extension: ' + GCC_DISK_FULL)!r})\n", "compile_error")
    raised = ("import errno, os\nraise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n", "runtime_error")
    for source, status in (forged, raised):
        job = build_job(source + MODEL)
        with pytest.raises(Verdict) as verdict:
            harness._load_candidate(job)
        assert verdict.value.status == status


def test_a_full_disk_before_the_candidate_runs_is_the_hosts(build_job, monkeypatch):
    def no_room(source, name, workdir):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{workdir}/{name}.py")

    job = build_job(MODEL)
    monkeypatch.setattr(harness, "_load_module", no_room)
    with pytest.raises(Verdict) as verdict:
        harness._load_candidate(job)
    assert verdict.value.status == "infra_error" and "(disk full;" in verdict.value.reason


# -- end to end: real builds (about 30 s each on a 2-core machine) -------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB tmpfs (too small for a build) and a function that gives it room; skipped where
    tmpfs cannot be mounted here (not root, or no CAP_SYS_ADMIN)."""
    mount, umount = shutil.which("mount"), shutil.which("umount")
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or not mount or not umount:
        pytest.skip("mounting a tmpfs needs root and mount(8): the full-disk build is not tried")
    done = subprocess.run([mount, "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): the full-disk build is not tried")

    def make_room() -> None:
        subprocess.run([mount, "-o", "remount,size=256m", str(disk)], check=True)

    try:
        yield disk, make_room
    finally:
        if subprocess.run([umount, str(disk)], capture_output=True).returncode != 0:
            subprocess.run([umount, "-l", str(disk)], capture_output=True)


@pytest.mark.slow
def test_a_build_on_a_full_disk_is_an_infra_error_and_builds_once_there_is_room(tiny_disk):
    disk, make_room = tiny_disk
    task, config = _add_task(), _config(disk / "cache")
    candidate = Candidate.make(task.task_id, (DATA / "cpp_add_fast.py").read_text())
    full = evaluate(task, candidate, config)
    assert full.status == "infra_error", (full.status, full.reason, full.log[-2000:])
    assert full.reason.startswith("the host failed the build (disk full;")
    assert not list((disk / "cache" / "index").iterdir())  # nothing cached for the candidate
    make_room()
    roomy = evaluate(task, candidate, config)
    assert roomy.status == "ok", (roomy.status, roomy.reason, roomy.log[-2000:])
    assert not roomy.build_cached


@pytest.mark.slow
def test_a_damaged_cached_build_is_rebuilt_and_said_once(tmp_path):
    task, config = _add_task(), _config(tmp_path / "cache")
    candidate = Candidate.make(task.task_id, (DATA / "cpp_add_fast.py").read_text())
    first = evaluate(task, candidate, config)
    assert first.status == "ok", (first.status, first.reason, first.log[-2000:])
    [library] = (tmp_path / "cache" / "builds").rglob("*.so")
    os.truncate(library, library.stat().st_size // 2)
    damaged = evaluate(task, candidate, config)
    assert damaged.status == "ok", (damaged.status, damaged.reason, damaged.log[-2000:])
    assert not damaged.build_cached
    name = library.relative_to(next((tmp_path / "cache" / "builds").iterdir()))
    said = [w for w in damaged.warnings if "failed its checksum" in w]
    assert (
        said and said[0].startswith("cached build of ") and said[0].endswith(f"failed its checksum ({name}): rebuilt")
    )
    again = evaluate(task, candidate, config)
    assert again.status == "ok" and again.build_cached
    assert not [w for w in again.warnings if "checksum" in w]


@pytest.mark.parametrize("status", ["hack_detected", "timeout", "crashed"])
def test_a_verdict_other_than_a_failed_compile_is_never_turned_into_the_hosts_fault(tmp_path, status):
    caught = _failed(status, "during loading ModelNew: a patched timer", GCC_DISK_FULL)
    assert HostWatch(tmp_path, need_mb=1 << 40).judge(caught) == caught
