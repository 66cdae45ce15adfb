"""The build cache: one build directory per content hash of (source, toolchain, torch version,
target architectures, flags), and an index of build outcomes written only by the parent.

Layout under `cache_dir`: `builds/<key>/` (the sandbox may write here, its own key only),
`index/<key>.json` (outcome of the build, never writable by a sandbox), `locks/<key>.lock`.

A build is cached only once it has finished: its index record is written after the sandbox
reported the outcome. A build directory without a record, found when its lock is taken, is
what an interrupted or failed build left (object files, a half-linked .so, torch's `lock`
file, which would make the next build wait for a build that is gone): it is emptied first.

An ok build's record keeps a sha256 of each of its artifacts (`ARTIFACT_SUFFIXES`: the libraries
the run stage loads, the objects ninja links them from, the build's JSON records); `lookup`
verifies them, so a truncated or damaged build is built again (`locked` says so once) instead of
crashing every later run that loads it.

The host's faults (a full disk, an exceeded quota, an I/O error, a compiler killed for memory) are
never cached as the candidate's result: see `host_fault` and `HostWatch` below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import threading
from pathlib import Path

from speedforge.evaluator.job import StageResult
from speedforge.files import write_whole

HARNESS_VERSION = "2"  # 2: extensions built by the build stage, named by content (evaluator.extensions)
CACHEABLE_STATUSES = ("ok", "compile_error", "runtime_error")
# The files of a build whose checksums its record keeps: what the run stage loads (extension
# libraries, the records of what was built) and the objects ninja would link them from again.
ARTIFACT_SUFFIXES = (".so", ".o", ".json")


@functools.lru_cache(maxsize=None)
def toolchain_id() -> str:
    """Compiler, CUDA compiler, torch, Python and machine, as one string (cached per process)."""
    parts = [f"python {platform.python_version()}", platform.machine()]
    try:
        parts.append(f"torch {importlib.metadata.version('torch')}")
    except importlib.metadata.PackageNotFoundError:
        parts.append("torch missing")
    for tool in (os.environ.get("CXX", "c++"), "nvcc"):
        path = shutil.which(tool)
        if not path:
            parts.append(f"{tool} missing")
            continue
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
            lines = [line for line in out.splitlines() if line.strip()]
            parts.append(lines[-1] if tool == "nvcc" and lines else (lines[0] if lines else tool))
        except (OSError, subprocess.TimeoutExpired):
            parts.append(f"{tool} unusable")
    return " | ".join(parts)


@functools.lru_cache(maxsize=None)
def visible_cuda_arch() -> str:
    """Compute capabilities of the GPUs visible here ("9.0", "8.0;9.0"), asked of nvidia-smi so
    the asking process does not initialise CUDA; "" where there is none."""
    path = shutil.which("nvidia-smi")
    if not path:
        return ""
    try:
        out = subprocess.run(
            [path, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    archs = {line.strip() for line in out.splitlines() if line.strip().replace(".", "").isdigit()}
    return ";".join(sorted(archs, key=lambda a: tuple(map(int, a.split(".")))))


def build_arch(device: str, cuda_arch_list: str) -> str:
    """The architectures a build of a family on `device` targets, as its key names them: none for
    a CPU family (its C++ does not depend on the GPU), the configured list, or else the visible
    GPUs' (what torch targets when TORCH_CUDA_ARCH_LIST is unset). `speedforge eval` (no list:
    the visible GPU) and a sweep (the pools' list) then share one build of a candidate on the
    same machine and cache."""
    if device != "cuda":
        return ""
    return cuda_arch_list or visible_cuda_arch()


def build_key(source: str, family: str, cuda_arch_list: str, flags: str = "") -> str:
    digest = hashlib.sha256()
    for part in (HARNESS_VERSION, family, source, toolchain_id(), cuda_arch_list, flags):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:32]


class BuildCache:
    def __init__(self, cache_dir: str | os.PathLike) -> None:
        self.root = Path(cache_dir)
        for sub in ("builds", "index", "locks", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def build_dir(self, key: str) -> Path:
        path = self.root / "builds" / key
        path.mkdir(parents=True, exist_ok=True)
        return path

    def lookup(self, key: str) -> dict | None:
        """The recorded outcome of the build of `key`, or None: not built yet, or an ok build
        whose artifacts no longer match their checksums (`damage`)."""
        entry = self._entry(key)
        if entry is None or self.damage(key, entry):
            return None
        entry.pop("artifacts", None)
        return entry

    def record(self, key: str, outcome: dict) -> None:
        """Keep the outcome of a finished build; an ok one with the checksums of its artifacts.
        An outcome that is not the candidate's (infra_error, or a failure that names a host fault
        the host did not show: `HostWatch.judge`) is not kept."""
        if outcome.get("status") not in CACHEABLE_STATUSES:
            return
        if outcome["status"] == "ok":
            outcome = {**outcome, "artifacts": self._checksums(key)}
        elif claimed_fault(str(outcome.get("reason", "")), str(outcome.get("log", ""))) is not None:
            return
        write_whole(self.root / "index" / f"{key}.json", json.dumps(outcome))

    def damage(self, key: str, entry: dict) -> str:
        """What is wrong with the build behind an ok record ("" when nothing): an artifact that
        is missing or whose sha256 is not the recorded one, or a record kept without checksums."""
        if entry.get("status") != "ok":
            return ""
        artifacts = entry.get("artifacts")
        if not isinstance(artifacts, dict):
            return "has no checksums"
        folder = self.root / "builds" / key
        for name, digest in sorted(artifacts.items()):
            if _sha256(folder / name) != digest:
                return f"failed its checksum ({name})"
        return ""

    def _entry(self, key: str) -> dict | None:
        try:
            entry = json.loads((self.root / "index" / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        return entry if isinstance(entry, dict) else None

    def _checksums(self, key: str) -> dict[str, str]:
        folder = self.root / "builds" / key
        files = (path for path in folder.rglob("*") if path.suffix in ARTIFACT_SUFFIXES)
        return {
            str(path.relative_to(folder)): _sha256(path)
            for path in sorted(files)
            if path.is_file() and not path.is_symlink()
        }

    @contextlib.contextmanager
    def locked(self, key: str):
        """Serialise builds of one key across processes (build workers share the cache); the
        build directory of a key not yet built is emptied of what an unfinished build left, and
        a damaged build (`damage`) is dropped with its record. Yields the warning that says so
        ("" when there was none), for the build that follows to carry once."""
        with open(self.root / "locks" / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                entry = self._entry(key)
                damage = self.damage(key, entry) if entry is not None else ""
                if entry is None or damage:
                    (self.root / "index" / f"{key}.json").unlink(missing_ok=True)
                    shutil.rmtree(self.root / "builds" / key, ignore_errors=True)
                    self.build_dir(key)
                yield f"cached build of {key} {damage}: rebuilt" if damage else ""
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def scratch(self) -> Path:
        """A private, empty temp dir for one sandboxed job (those of evaluators that have gone
        are removed first: speedforge.evaluator.sandbox.scratch_dir)."""
        from speedforge.evaluator.sandbox import scratch_dir

        return scratch_dir(self.root / "tmp")


def _sha256(path: Path) -> str:
    """The file's sha256 in hex, "" where it cannot be read."""
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except OSError:
        return ""


# -- the host's faults ------------------------------------------------------------------------------
#
# A build that fails because the machine did (its disk full, over quota or failing, a compiler
# killed for memory) is infra_error, retried and never cached, not the candidate's compile_error.
# A fault is recognised by the lines the OS and the tools write for it, anchored at the tools' own
# prefixes, so that what a candidate makes a compiler print (#error, #pragma GCC error, a static
# assertion, an echoed source line, an include of a strangely named file) does not read as one.
# Flags can still make a compiler print anything, so the parent believes a claim only where it sees
# the host in that state itself (`HostWatch`).

DISK_FULL, OVER_QUOTA, IO_ERROR, COMPILER_KILLED = "disk full", "disk quota exceeded", "I/O error", "compiler killed"
FAULT_ERRNOS = {errno.ENOSPC: DISK_FULL, errno.EDQUOT: OVER_QUOTA, errno.EIO: IO_ERROR}
_OS_WORDS = {os.strerror(number): kind for number, kind in FAULT_ERRNOS.items()}  # "No space left on device"
_WORDS = "|".join(map(re.escape, _OS_WORDS))
_FAULT_LINES = tuple(
    re.compile(pattern, re.M)
    for pattern in (
        # gcc's driver or cc1plus, its location first: "<file>:16:1: fatal error: error writing to <file>: ..."
        rf"^\S+: fatal error: .*: ({_WORDS})$",
        rf"^\S*\bld(?:\.\w+)?: (?:final link failed|cannot open output file \S+): ({_WORDS})$",  # the linker
        rf"^(?:\{{standard input\}}|\S+?)(?::\d+)?: Fatal error: can't (?:write|close) .*: '?({_WORDS})'?$",  # as
        rf"^ninja: .*: ({_WORDS})$",
        rf"\A\w*Error: \[Errno \d+\] ({_WORDS})",  # an OSError writing a build's files (the whole text)
        r"^\S+: fatal error: Killed signal terminated program \S+$",  # gcc's driver: cc1plus got SIGKILL
        r"^\S+: internal compiler error: Killed \(program \S+\)$",
        r"^nvcc error\s*: '\S+' died due to signal 9\b",
        r"^FAILED: \[code=137\] ",  # ninja: a command ended by SIGKILL
    )
)
PROBE_BYTES = 1 << 20  # what the parent writes to see whether the cache's disk still takes a write
_JUDGED = ("compile_error", "runtime_error", "infra_error")  # how a sandbox reports a failed compile


def host_fault(text: str) -> tuple[str, str] | None:
    """(kind, the line that shows it) for the first host fault a compiler's, ninja's or Python's
    output reports; None when it reports none."""
    found = [(match.start(), match) for pattern in _FAULT_LINES for match in [pattern.search(text)] if match]
    if not found:
        return None
    match = min(found, key=lambda item: item[0])[1]
    words = match.group(1) if match.groups() else ""
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return _OS_WORDS.get(words, COMPILER_KILLED), text[start : end if end >= 0 else len(text)].strip()[:300]


def exception_fault(exc: BaseException) -> tuple[str, str] | None:
    """(kind, evidence) for an exception that reports a host fault: an OSError with its errno,
    or a build error whose compiler output shows one (`host_fault`)."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS:
        return FAULT_ERRNOS[exc.errno], text[:300]
    return host_fault(text)


_HOST_FAILED = "the host failed the"
_NOT_SHOWN = "the build failed with a host fault that the host does not show"
_CLAIM = re.compile(rf"\A(?:{_HOST_FAILED} \w+|{_NOT_SHOWN}) \((?P<kind>[^;)]*)[^)]*\): (?P<evidence>[^\n]*)")


def host_fault_reason(kind: str, evidence: str, stage: str = "build") -> str:
    """The reason of an infra_error for a host fault found in a stage (`claimed_fault` reads it)."""
    return f"{_HOST_FAILED} {stage} ({kind}; the host's fault, not the candidate's): {evidence}"


def claimed_fault(reason: str, log: str) -> tuple[str, str] | None:
    """(kind, evidence) of the host fault a failed stage's result claims: named in its reason
    (`host_fault_reason`) or shown by its text; None when it claims none."""
    named = _CLAIM.match(reason)
    if named:
        return named["kind"], named["evidence"]
    return host_fault(reason) or host_fault(log)


def oom_kills() -> int | None:
    """How many processes the kernel has killed for want of memory, in any cgroup (the
    `oom_kill` count of /proc/vmstat); None where it cannot be read."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def disk_short(root: Path, need_bytes: int) -> bool:
    """Whether the filesystem under `root` has less room than `need_bytes`, or fails a small
    write with a host fault's errno."""
    try:
        stat = os.statvfs(root)
        if stat.f_bavail * stat.f_frsize < need_bytes:
            return True
    except OSError as exc:
        return exc.errno in FAULT_ERRNOS
    probe = root / f".probe.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(probe, "wb") as file:
            file.write(bytes(PROBE_BYTES))
            file.flush()
            os.fsync(file.fileno())
    except OSError as exc:
        return exc.errno in FAULT_ERRNOS
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    return False


class HostWatch:
    """What the parent sees of the host around one build, to believe a host fault the build's
    text claims or not: the disk under the cache (short of what a stage may write, or failing a
    write), and whether the kernel killed a process for memory while it ran."""

    def __init__(self, root: str | os.PathLike, need_mb: int, kills=oom_kills) -> None:
        self.root, self.need_bytes, self.kills = Path(root), need_mb << 20, kills
        self.kills_before = kills()

    def shows(self, kind: str) -> bool:
        if kind == COMPILER_KILLED:
            now = self.kills()
            return None not in (now, self.kills_before) and now > self.kills_before
        return disk_short(self.root, self.need_bytes)

    def judge(self, result: StageResult) -> StageResult:
        """A build's result with a host fault it claims made infra_error where the host shows
        that fault. A claim the host does not show is the candidate's failure (compile_error
        where the sandbox had called it infra_error) and is not cached (`BuildCache.record`), so
        a fault that came and went is tried again."""
        claim = claimed_fault(result.reason, result.log) if result.status in _JUDGED else None
        if claim is None:
            return result
        kind, evidence = claim
        if self.shows(kind):
            return dataclasses.replace(result, status="infra_error", reason=host_fault_reason(kind, evidence))
        if result.status != "infra_error":
            return result
        return dataclasses.replace(result, status="compile_error", reason=f"{_NOT_SHOWN} ({kind}): {evidence}")
