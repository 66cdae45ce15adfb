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
never cached as the candidate's result (speedforge.evaluator.host_faults).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

from speedforge.evaluator.host_faults import claimed_fault
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
