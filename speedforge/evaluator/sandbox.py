"""Run one evaluator job in a fresh sandboxed process and bring back its JSON result.

The parent side of the sandbox. The child (speedforge.evaluator.child) starts:
- in its own process session, so the whole group is killed (SIGKILL) on timeout;
- in new network and PID namespaces (util-linux `unshare`), so it has no network and every
  process it starts dies with it;
- with an environment scrubbed to an allow-list (no credentials), HOME and TMPDIR in a private
  temp dir;
- under a memory watchdog that kills the process tree past the limit.
Inside, the child adds resource limits and Landlock before any candidate code runs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

import speedforge

# Environment variables a sandbox may see; everything else (credentials included) is dropped.
ENV_ALLOW = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ",
    "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES", "CC", "CXX", "CUDAHOSTCXX", "TORCH_CUDA_ARCH_LIST",
    "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "VIRTUAL_ENV",
)
STDERR_TAIL_BYTES = 8000


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one sandboxed job."""

    result: dict | None  # the child's JSON result, when it wrote one
    returncode: int | None
    timed_out: bool
    killed_for_memory: bool
    killed_for_processes: bool
    wall_s: float
    stderr_tail: str
    warnings: tuple[str, ...]

    @property
    def signal_name(self) -> str:
        if self.returncode is not None and self.returncode < 0:
            return signal.Signals(-self.returncode).name
        if self.returncode is not None and self.returncode > 128:  # unshare reports the child's signal so
            try:
                return signal.Signals(self.returncode - 128).name
            except ValueError:
                return ""
        return ""


def scrubbed_env(workdir: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOW}
    bin_dir = os.path.dirname(sys.executable)  # ninja and friends live beside the interpreter
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(
        HOME=workdir,
        TMPDIR=workdir,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
        PYTHONPATH=str(Path(speedforge.__file__).resolve().parent.parent),
        PYTHONHASHSEED="0",
    )
    env.update(extra or {})
    return env


@functools.lru_cache(maxsize=None)
def namespace_prefix() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The command prefix that puts the child in new network and PID namespaces, and warnings.

    Tried once per process: as root plain namespaces, else inside a new user namespace.
    """
    unshare = shutil.which("unshare")
    if not unshare:
        return (), ("util-linux 'unshare' not found: the sandbox has the network and no PID namespace",)
    candidates = [[unshare, "--net", "--pid", "--fork", "--kill-child"]]
    if os.geteuid() != 0:
        candidates.insert(0, [unshare, "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"])
    for prefix in candidates:
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return tuple(prefix), ()
    return (), ("the kernel refused new network/PID namespaces: the sandbox keeps the network",)


def run_job(job: dict, workdir: Path, timeout_s: float, memory_limit_mb: int, max_processes: int = 64,
            isolate_network: bool = True, env_extra: dict[str, str] | None = None) -> Outcome:
    """Run `job` in a sandboxed child; always returns an Outcome, killing the child if need be."""
    workdir.mkdir(parents=True, exist_ok=True)
    job_path = workdir / "job.json"
    job_path.write_text(json.dumps(job))
    prefix, warnings = namespace_prefix() if isolate_network else ((), ("network isolation disabled by config",))
    read_fd, write_fd = os.pipe()
    cmd = [*prefix, sys.executable, "-s", "-B", "-m", "speedforge.evaluator.child", str(job_path), str(write_fd)]
    stderr_path = workdir / "stderr.txt"
    start = time.perf_counter()
    with open(workdir / "stdout.txt", "wb") as out, open(stderr_path, "wb") as err:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=(write_fd,),
                env=scrubbed_env(str(workdir), env_extra), cwd=workdir, start_new_session=True,
            )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            return Outcome(None, None, False, False, False, 0.0, f"could not start the sandbox: {exc}", tuple(warnings))
        os.close(write_fd)
        chunks: list[bytes] = []
        reader = threading.Thread(target=_drain, args=(read_fd, chunks), daemon=True)
        reader.start()
        timed_out, over_memory, over_processes = _watch(proc, timeout_s, memory_limit_mb, max_processes)
        _kill_group(proc.pid)
        reader.join(timeout=5)
    wall_s = time.perf_counter() - start
    result = None
    if not (timed_out or over_memory or over_processes):
        try:
            result = json.loads(b"".join(chunks).decode()) if chunks else None
        except (ValueError, UnicodeDecodeError):
            result = None
    return Outcome(
        result=result if isinstance(result, dict) else None,
        returncode=proc.returncode,
        timed_out=timed_out,
        killed_for_memory=over_memory,
        killed_for_processes=over_processes,
        wall_s=wall_s,
        stderr_tail=_tail(stderr_path),
        warnings=tuple(warnings),
    )


def _drain(fd: int, chunks: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as pipe:
        while data := pipe.read(65536):
            chunks.append(data)


def _watch(proc: subprocess.Popen, timeout_s: float, memory_limit_mb: int,
           max_processes: int) -> tuple[bool, bool, bool]:
    """Wait for the child; kill it on timeout, or when its process tree exceeds the memory limit
    or the process limit (RLIMIT_NPROC does not bind root, so the count is watched from here).
    Returns (timed_out, over_memory, over_processes)."""
    deadline = time.monotonic() + timeout_s
    poll_s = 0.01
    while True:
        try:
            proc.wait(timeout=poll_s)
            return False, False, False
        except subprocess.TimeoutExpired:
            pass
        poll_s = min(poll_s * 2, 0.2)
        verdict = (time.monotonic() > deadline, False, False)
        if not verdict[0]:
            procs = _tree(proc.pid)
            # +2: unshare and the child itself are not the candidate's processes
            verdict = (False, _memory_mb(procs) > memory_limit_mb, len(procs) > max_processes + 2)
        if any(verdict):
            _kill_group(proc.pid)
            proc.wait()
            return verdict


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _memory_mb(procs: list[psutil.Process]) -> float:
    """Proportional set size of the process tree: shared pages of forked children count once."""
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except (psutil.Error, AttributeError):
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
    return total / 2**20


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - STDERR_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
