"""The build cache: one build directory per content hash of (source, toolchain, torch version,
target architectures, flags), and an index of build outcomes written only by the parent.

Layout under `cache_dir`: `builds/<key>/` (the sandbox may write here, its own key only),
`index/<key>.json` (outcome of the build, never writable by a sandbox), `locks/<key>.lock`.

A build is cached only once it has finished: its index record is written after the sandbox
reported the outcome. A build directory without a record, found when its lock is taken, is
what an interrupted or failed build left (object files, a half-linked .so, torch's `lock`
file, which would make the next build wait for a build that is gone): it is emptied first.
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

from speedforge.files import write_whole

HARNESS_VERSION = "2"  # 2: extensions built by the build stage, named by content (evaluator.extensions)
CACHEABLE_STATUSES = ("ok", "compile_error", "runtime_error")


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
        out = subprocess.run([path, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout  # fmt: skip
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
        path = self.root / "index" / f"{key}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def record(self, key: str, outcome: dict) -> None:
        if outcome.get("status") not in CACHEABLE_STATUSES:
            return
        path = self.root / "index" / f"{key}.json"
        write_whole(path, json.dumps(outcome))

    @contextlib.contextmanager
    def locked(self, key: str):
        """Serialise builds of one key across processes (build workers share the cache); the
        build directory of a key not yet built is emptied of what an unfinished build left."""
        with open(self.root / "locks" / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self.lookup(key) is None:
                    shutil.rmtree(self.root / "builds" / key, ignore_errors=True)
                    self.build_dir(key)
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def scratch(self) -> Path:
        """A private, empty temp dir for one sandboxed job (those of evaluators that have gone
        are removed first: speedforge.evaluator.sandbox.scratch_dir)."""
        from speedforge.evaluator.sandbox import scratch_dir

        return scratch_dir(self.root / "tmp")
