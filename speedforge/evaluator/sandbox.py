"""Run one evaluator job in a fresh sandboxed process and bring back its JSON result.

The parent side of the sandbox. Jobs run in processes forked from a warm zygote
(speedforge.evaluator.zygote), each of which:
- starts its own process session, so the whole group is killed (SIGKILL) on timeout;
- enters new network, PID and mount namespaces: no network, a /proc of its own, and every
  process it starts dies with it;
- inherits an environment scrubbed to an allow-list (no credentials), with HOME and TMPDIR in a
  private temp dir;
- adds resource limits and Landlock itself, before any candidate code runs;
- is watched from here: killed past the time limit, the memory limit (proportional set size of
  its process tree) or the process limit (RLIMIT_NPROC does not bind root).

The zygote is an object, `Zygote`: whoever wants its sandboxes gone at a moment of its own
choosing makes one, passes it to `run_job` (and the evaluator's entry points) and closes it;
everyone else shares `default_zygote()`, made on first use.

No sandbox process outlives the process that launched it: a job interrupted here
(KeyboardInterrupt included) has its process group killed on the way out, `Zygote.close` (run
at exit for every zygote still open) kills every live job and the zygote, and if this process
dies without cleaning up (SIGKILL, SIGTERM) the zygote's parent-death signal makes it kill its
jobs. Each zygote is started from one thread that lives as long as this process: a parent-death
signal follows the thread that forked, and evaluations may run in short-lived threads (Ray
actors, thread pools).
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

import speedforge

if TYPE_CHECKING:
    from speedforge.evaluator.job import Job

# Environment variables a sandbox may see; everything else (credentials included) is dropped.
ENV_ALLOW = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ",
    "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES", "CC", "CXX", "CUDAHOSTCXX", "TORCH_CUDA_ARCH_LIST",
    "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "VIRTUAL_ENV",
)
STDERR_TAIL_BYTES = 8000
# glibc's heap, set once for the zygote and every job: memory a tensor frees is reused by the
# next tensor of the same size instead of being faulted in afresh. By default glibc serves large
# blocks with mmap (a fresh block, page-faulted on first touch, every time) until its adaptive
# threshold rises, returns the heap's top to the kernel past a threshold, and keeps small freed
# chunks in the per-thread cache and the fast bins, where they cannot coalesce; torch allocates with
# posix_memalign, which asks for more than the block it returns, so a freed block of the same
# size never satisfies the next request while a cached chunk pins its neighbour. Each of these
# made a timed call pay for thousands of page faults in some processes and none in others: the
# same cpp kernel measured 0.42x-1.43x over 6 sandboxes on a 2-core box, and 1.18x-1.27x with
# these settings (benchmarks/RESULTS.md). Blocks over 1 GiB are still mapped afresh. Without
# mxfast=0 the in-sandbox test failed 1 run in 6 (a small freed chunk in a fast bin pinned the
# block); with it, 10 of 10 passed.
MALLOC_TUNABLES = ("glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=17179869184:"
                   "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0")
ZYGOTE_START_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one sandboxed job."""

    result: dict | None  # the child's JSON result, when it wrote one
    returncode: int | None  # negative: killed by that signal; above 128: its namespace's process was
    timed_out: bool
    killed_for_memory: bool
    killed_for_processes: bool
    wall_s: float
    stderr_tail: str

    @property
    def signal_name(self) -> str:
        code = self.returncode
        number = -code if code is not None and code < 0 else (code - 128 if code is not None and code > 128 else 0)
        try:
            return signal.Signals(number).name if number else ""
        except ValueError:
            return ""


def scrubbed_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOW}
    bin_dir = os.path.dirname(sys.executable)  # ninja and friends live beside the interpreter
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    home = tempfile.gettempdir()
    env.update(
        HOME=home,
        TMPDIR=home,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
        PYTHONPATH=str(Path(speedforge.__file__).resolve().parent.parent),
        GLIBC_TUNABLES=MALLOC_TUNABLES,
    )
    return env


class _Launcher:
    """Starts processes from one daemon thread that lives as long as this process."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="speedforge-sandbox-launcher", daemon=True)
                self._thread.start()
        done = threading.Event()
        reply: dict = {}
        self._requests.put((args, kwargs, reply, done))
        done.wait()
        if "error" in reply:
            raise reply["error"]
        return reply["proc"]

    def _serve(self) -> None:
        while True:
            args, kwargs, reply, done = self._requests.get()
            try:
                reply["proc"] = subprocess.Popen(args, **kwargs)
            except BaseException as exc:  # handed to the caller
                reply["error"] = exc
            done.set()


class Zygote:
    """Client of one zygote process; thread-safe; starts it on the first launch and again if it
    dies. `close()` (or leaving a `with` block) kills its live jobs and the zygote; a later
    launch starts a fresh one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launcher = _Launcher()
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._ids = itertools.count()
        self._started: dict[int, dict] = {}
        self._exits: dict[int, int] = {}  # pid: wait status
        self._live: set[int] = set()  # jobs of the current zygote not seen to end
        self._cond = threading.Condition()

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._stop()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            command = [sys.executable, "-s", "-B", "-m", "speedforge.evaluator.zygote", str(child.fileno()),
                       str(os.getpid())]  # fmt: skip
            self._proc = self._launcher.popen(command, pass_fds=(child.fileno(),), env=scrubbed_env(),
                                              stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        finally:
            child.close()
        try:
            parent.settimeout(ZYGOTE_START_TIMEOUT_S)
            hello = parent.recv(1 << 16)
            if not hello or not json.loads(hello).get("ready"):
                raise RuntimeError("the sandbox zygote did not start")
            parent.settimeout(None)
        except BaseException:  # failed or interrupted: no half-started zygote is left behind
            self._sock = parent
            self._stop()
            raise
        self._sock = parent
        self._live = set()
        threading.Thread(target=self._read, args=(parent, self._live), daemon=True).start()
        _OPEN.add(self)

    def _read(self, sock: socket.socket, live: set[int]) -> None:
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            with self._cond:
                if not data:  # zygote gone, and its jobs with it: wake everyone waiting on it
                    for waiter in self._started.values():
                        waiter.setdefault("error", "the sandbox zygote died")
                    for pid in live:
                        self._exits[pid] = signal.SIGKILL  # a wait status: killed by SIGKILL
                    live.clear()
                    self._cond.notify_all()
                    return
                message = json.loads(data)
                if "id" in message:
                    self._started.setdefault(message["id"], {}).update(message)
                    if "pid" in message:
                        live.add(message["pid"])
                else:
                    self._exits[message["pid"]] = message["status"]
                    live.discard(message["pid"])
                self._cond.notify_all()

    def launch(self, job_path: str, fds: tuple[int, int, int], isolate: bool) -> int:
        """Fork a sandboxed child for the job; returns its pid (its process group id too)."""
        with self._lock:
            self._ensure()
            request_id = next(self._ids)
            with self._cond:
                self._started[request_id] = {}
            socket.send_fds(self._sock, [json.dumps({"id": request_id, "job": job_path, "isolate": isolate}).encode()],
                            list(fds))
        with self._cond:
            self._cond.wait_for(lambda: "pid" in self._started[request_id] or "error" in self._started[request_id])
            reply = self._started.pop(request_id)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["pid"]

    def wait(self, pid: int, timeout_s: float) -> int | None:
        """The child's exit code (negative: signal), or None if it has not ended within timeout_s."""
        with self._cond:
            if not self._cond.wait_for(lambda: pid in self._exits, timeout_s):
                return None
            status = self._exits.pop(pid)
        return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)

    @property
    def pid(self) -> int | None:
        """The zygote process's id while it runs, else None."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def close(self) -> None:
        """Kill every live job and the zygote (run at exit for every zygote still open)."""
        with self._cond:
            live = list(self._live)
        for pid in live:
            _kill_group(pid)
        self._stop()
        _OPEN.discard(self)

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _stop(self) -> None:
        """End the zygote: SIGTERM makes it kill its jobs and exit; SIGKILL if it has not within 5 s."""
        proc, sock, self._proc, self._sock = self._proc, self._sock, None, None
        if sock is not None:
            sock.close()
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_OPEN: weakref.WeakSet[Zygote] = weakref.WeakSet()  # zygotes with a process, closed at exit
_DEFAULT: Zygote | None = None
_DEFAULT_LOCK = threading.Lock()


def _close_open() -> None:
    for zygote in list(_OPEN):
        zygote.close()


atexit.register(_close_open)


def default_zygote() -> Zygote:
    """The zygote shared by callers that pass none: one per process, made on first use."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = Zygote()
        return _DEFAULT


def run_job(job: Job, workdir: Path, timeout_s: float, memory_limit_mb: int, max_processes: int = 64,
            isolate_network: bool = True, zygote: Zygote | None = None) -> Outcome:
    """Run `job` in a child sandboxed by `zygote` (default: `default_zygote()`); always returns
    an Outcome, killing the child if need be."""
    zygote = zygote if zygote is not None else default_zygote()
    workdir.mkdir(parents=True, exist_ok=True)
    job_path = workdir / "job.json"
    job_path.write_text(job.to_json())
    stderr_path = workdir / "stderr.txt"
    read_fd, write_fd = os.pipe()
    start = time.perf_counter()
    with open(workdir / "stdout.txt", "wb") as out, open(stderr_path, "wb") as err:
        try:
            pid = zygote.launch(str(job_path), (write_fd, out.fileno(), err.fileno()), isolate_network)
        except (OSError, RuntimeError) as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise RuntimeError(f"could not start the sandbox: {exc}") from None
    os.close(write_fd)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(read_fd, chunks), daemon=True)
    reader.start()
    try:
        returncode, timed_out, over_memory, over_processes = _watch(zygote, pid, timeout_s, memory_limit_mb,
                                                                    max_processes)  # fmt: skip
    finally:  # what the job left running, or all of it when interrupted (KeyboardInterrupt)
        _kill_group(pid)
    reader.join(timeout=5)
    result = None
    if not (timed_out or over_memory or over_processes) and chunks:
        try:
            result = json.loads(b"".join(chunks).decode())
        except (ValueError, UnicodeDecodeError):
            result = None
    return Outcome(
        result=result if isinstance(result, dict) else None,
        returncode=returncode,
        timed_out=timed_out,
        killed_for_memory=over_memory,
        killed_for_processes=over_processes,
        wall_s=time.perf_counter() - start,
        stderr_tail=_tail(stderr_path),
    )


def _drain(fd: int, chunks: list[bytes]) -> None:
    with os.fdopen(fd, "rb") as pipe:
        while data := pipe.read(65536):
            chunks.append(data)


def _watch(zygote: Zygote, pid: int, timeout_s: float, memory_limit_mb: int,
           max_processes: int) -> tuple[int | None, bool, bool, bool]:  # fmt: skip
    """Wait for the child; kill it on timeout, or when its process tree exceeds the memory limit
    or the process limit. Returns (returncode, timed_out, over_memory, over_processes)."""
    deadline = time.monotonic() + timeout_s
    poll_s = 0.005
    while True:
        code = zygote.wait(pid, poll_s)
        if code is not None:
            return code, False, False, False
        poll_s = min(poll_s * 2, 0.2)
        verdict = (time.monotonic() > deadline, False, False)
        if not verdict[0]:
            procs = _tree(pid)
            # +1: the namespace's keeper process is the harness's, not the candidate's
            verdict = (False, _memory_mb(procs) > memory_limit_mb, len(procs) > max_processes + 1)
        if any(verdict):
            _kill_group(pid)
            return zygote.wait(pid, 30.0), *verdict


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
