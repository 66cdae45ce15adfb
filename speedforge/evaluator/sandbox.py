"""Run one evaluator job in a fresh sandboxed process and bring back its JSON result.

The parent side of the sandbox. Each job runs in a process forked from a warm zygote
(speedforge.evaluator.zygote), in its own process session and network, PID and mount namespaces,
with a scrubbed environment, resource limits, Landlock and a /dev/shm of its own
(docs/concepts/evaluator.md, the run stage). From here it is killed past its time, memory, disk or
process limit (RLIMIT_NPROC does not bind root). Its scratch folder (`scratch_dir`) is named after
the process that made it and removed however the job ends. Whoever wants its sandboxes gone at a
moment of its own makes a `Zygote`, passes it to `run_job` and closes it; everyone else shares
`default_zygote()`. No sandbox process outlives its launcher: an interrupted job's group is killed
on the way out, `Zygote.close` (at exit) kills every live job, and after a SIGKILL the zygote's
parent-death signal does, which follows the thread that forked: each zygote is started from a
thread that lives as long as this process, since evaluations may run in short-lived threads.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import json
import os
import queue
import re
import signal
import socket
import stat
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
from speedforge.evaluator import phases, turns, verdict

if TYPE_CHECKING:
    from speedforge.evaluator.job import Job

# Environment variables a sandbox may see; everything else (credentials included) is dropped.
ENV_ALLOW = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TERM",
    "TZ",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "CC",
    "CXX",
    "CUDAHOSTCXX",
    "TORCH_CUDA_ARCH_LIST",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "VIRTUAL_ENV",
    "SPEEDFORGE_PHASE_LOG",  # a diagnostic switch (speedforge.evaluator.phases), no secret
)
# NVLink multicast stays off in every candidate process, whatever the parent's environment says:
# a program that uses it can put a host's GPUs, which others share, out of service for days.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
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
# these settings (docs/benchmarks/defaults.md). Blocks over 1 GiB are still mapped afresh. Without
# mxfast=0 the in-sandbox test failed 1 run in 6 (a small freed chunk in a fast bin pinned the
# block); with it, 10 of 10 passed.
#
# Every parameter mallopt can change is named here, so that the process's allocator settings are
# known: glibc has no getter for them, and the harness writes these values back before every call
# (speedforge.evaluator.process_state), so that a candidate's mallopt (a perturb byte, a small mmap
# threshold) cannot slow the reference's allocations. The trim threshold is the highest mallopt
# can set (INT_MAX, 2 GiB of free heap top); top_pad, perturb and mmap_max are glibc's defaults.
MALLOC_TUNABLES = (
    "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=2147483647:"
    "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0:glibc.malloc.top_pad=131072:"
    "glibc.malloc.perturb=0:glibc.malloc.mmap_max=65536"
)
ZYGOTE_START_TIMEOUT_S = 300.0
# The zygote's import path is the interpreter's and the environment's folders: python -P (no
# current folder, where `-m` or `-c` would put it first), -s (no user site-packages), $PYTHONPATH's
# absolute folders only (an empty or relative entry means the current folder), and last the folder
# speedforge was imported from (a checkout that is not installed), so that nothing there (a
# random.py, a torch.py) shadows a module.
SPEEDFORGE_ROOT = str(Path(speedforge.__file__).resolve().parent.parent)
ZYGOTE_MODULE = "speedforge.evaluator.zygote"  # named on its command line, where `ps` shows it
ZYGOTE_BOOT = (
    "import importlib, sys; sys.path.append(sys.argv[2]); "
    "sys.exit(importlib.import_module(sys.argv[1]).main(sys.argv[3:]))"
)
SCRATCH_PREFIX = "job-"
MAX_SCRATCH_ENTRIES = 100_000  # files and folders a job may leave in its folders; more is over the disk quota


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of one sandboxed job."""

    result: dict | None  # the child's result, when the harness sent one that verified (speedforge.evaluator.verdict)
    returncode: int | None  # negative: killed by that signal; above 128: its namespace's process was
    timed_out: bool
    killed_for_memory: bool
    killed_for_processes: bool
    wall_s: float
    stderr_tail: str
    killed_for_disk: bool = False
    # a record the job sent ahead of its result, before any candidate code was imported
    # (speedforge.evaluator.child.send_first)
    first: dict | None = None
    channel_problem: str = ""  # how the verdict channel was misused (no result is taken then), "" if it was not
    # the device's turn (speedforge.evaluator.turns): seconds waited for it, seconds held, and of
    # those held the pristine turn's (a cold run's pristine reference, or a pristine job's)
    turn_wait_s: float = 0.0
    turn_held_s: float = 0.0
    pristine_held_s: float = 0.0
    turn_problem: str = ""  # the turn was granted without the device's lock: why

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
        PYTHONSAFEPATH="1",
        GLIBC_TUNABLES=MALLOC_TUNABLES,
        **NO_MULTICAST,
    )
    folders = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    if folders:
        env["PYTHONPATH"] = os.pathsep.join(folders)
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
            command = [
                sys.executable,
                "-P",
                "-s",
                "-B",
                "-c",
                ZYGOTE_BOOT,
                ZYGOTE_MODULE,
                SPEEDFORGE_ROOT,
                str(child.fileno()),
                str(os.getpid()),
            ]
            self._proc = self._launcher.popen(
                command,
                pass_fds=(child.fileno(),),
                env=scrubbed_env(),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
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

    def launch(self, job_path: str, fds: tuple[int, ...], isolate: bool) -> int:
        """Fork a sandboxed child for the job, handing it `fds` (result pipe, stdout, stderr, and
        the turn socket of a run); returns its pid (its process group id too)."""
        with self._lock:
            self._ensure()
            request_id = next(self._ids)
            with self._cond:
                self._started[request_id] = {}
            socket.send_fds(
                self._sock, [json.dumps({"id": request_id, "job": job_path, "isolate": isolate}).encode()], list(fds)
            )
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


def run_job(
    job: Job,
    workdir: Path,
    timeout_s: float,
    memory_limit_mb: int,
    max_processes: int = 64,
    isolate_network: bool = True,
    zygote: Zygote | None = None,
    disk_limit_mb: int | None = None,
    pin: int = 0,
    quiet: bool = False,
) -> Outcome:
    """Run `job` in a child sandboxed by `zygote` (default: `default_zygote()`); always returns
    an Outcome, killing the child if need be. `disk_limit_mb` (default: the job's config's) is
    what the job may add to its scratch folder (`workdir`) and its build folder together.

    A run (or pristine) job gets the device's turn from here on request (speedforge.evaluator.turns),
    its timed phase pinned to `pin` CPUs claimed then (0: unpinned); the time it waited for the
    turn does not count against `timeout_s`, and the turn is released when the job has ended. It
    shares the device with other jobs for its whole life, or, `quiet`, has it alone
    (turns.device_use), waiting for that before it starts."""
    if job.kind in ("run", "pristine"):
        with turns.device_use(turns.device_key(job.device), quiet):
            return _run_job(
                job, workdir, timeout_s, memory_limit_mb, max_processes, isolate_network, zygote, disk_limit_mb, pin
            )
    return _run_job(
        job, workdir, timeout_s, memory_limit_mb, max_processes, isolate_network, zygote, disk_limit_mb, pin
    )


def _run_job(
    job: Job,
    workdir: Path,
    timeout_s: float,
    memory_limit_mb: int,
    max_processes: int,
    isolate_network: bool,
    zygote: Zygote | None,
    disk_limit_mb: int | None,
    pin: int,
) -> Outcome:
    zygote = zygote if zygote is not None else default_zygote()
    workdir.mkdir(parents=True, exist_ok=True)
    job_path = workdir / "job.json"
    job_path.write_text(job.to_json())
    stderr_path = workdir / "stderr.txt"
    disk = _DiskWatch(
        [workdir] + ([Path(job.build_dir)] if job.build_dir else []),
        job.config.disk_limit_mb if disk_limit_mb is None else disk_limit_mb,
    )
    channel, channel_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    turn_sock = job_sock = None
    if job.kind in ("run", "pristine"):
        turn_sock, job_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    start = time.perf_counter()
    with open(workdir / "stdout.txt", "wb") as out, open(stderr_path, "wb") as err:
        fds = (channel_end.fileno(), out.fileno(), err.fileno()) + (
            (job_sock.fileno(),) if job_sock is not None else ()
        )
        try:
            pid = zygote.launch(str(job_path), fds, isolate_network)
        except (OSError, RuntimeError) as exc:
            for sock in (channel, channel_end, turn_sock, job_sock):
                if sock is not None:
                    sock.close()
            raise RuntimeError(f"could not start the sandbox: {exc}") from None
    channel_end.close()
    turn = None
    if job_sock is not None:
        job_sock.close()
        turn = turns.Turn(
            turn_sock,
            turns.device_key(job.device),
            f"{job.candidate.candidate_id}:{job.kind}",
            done_allowed=job.pristine_first,
            pin=pin,
            pristine=job.kind == "pristine",
        )
    phases.mark(f"{job.kind}:launched")
    reader = verdict.Reader(channel, first_expected=job.pristine_first)
    ended = False
    try:
        returncode, killed_for = _watch(
            zygote,
            pid,
            timeout_s,
            memory_limit_mb,
            max_processes,
            disk,
            turn.credit_s if turn is not None else None,
            reader.broken,
        )
        ended = True
    finally:  # what the job left running, or all of it when interrupted (KeyboardInterrupt)
        _kill_group(pid)
        if not ended:  # its folders are removed next: let it end first
            zygote.wait(pid, 5.0)
        if turn is not None:  # the job has ended: its turn with it
            turn.close()
    reader.close()
    phases.mark(f"{job.kind}:ended")
    result = reader.result if not killed_for and not reader.problem else None
    stderr_tail = _tail(stderr_path)
    phases.adopt(job.kind, stderr_tail)
    return Outcome(
        result=result,
        returncode=returncode,
        timed_out=killed_for == "time",
        killed_for_memory=killed_for == "memory",
        killed_for_processes=killed_for == "processes",
        killed_for_disk=killed_for == "disk",
        wall_s=time.perf_counter() - start,
        stderr_tail=stderr_tail,
        first=reader.first if not reader.problem else None,
        channel_problem=reader.problem,
        turn_wait_s=turn.waited_s if turn is not None else 0.0,
        turn_held_s=turn.held_s if turn is not None else 0.0,
        pristine_held_s=turn.pristine_held_s if turn is not None else 0.0,
        turn_problem=turn.problem if turn is not None else "",
    )


def scratch_dir(parent: Path) -> Path:
    """A new, empty scratch folder for one job under `parent`, named after this process (its PID
    namespace, id and start time); folders there whose process has gone are removed first."""
    parent.mkdir(parents=True, exist_ok=True)
    remove_orphaned_scratch(parent)
    owner = f"{_pid_namespace()}.{os.getpid()}.{_start_ticks(os.getpid())}"
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{owner}-", dir=parent))


def remove_orphaned_scratch(parent: Path) -> list[Path]:
    """Remove the scratch folders under `parent` whose process (in this PID namespace) has gone:
    what a killed evaluator left. Returns the folders removed."""
    namespace, removed = _pid_namespace(), []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        match = re.fullmatch(rf"{SCRATCH_PREFIX}(\d+)\.(\d+)\.(\d+)-.*", entry.name)
        if not match or int(match[1]) != namespace:
            continue  # not a scratch folder, or one of another PID namespace (a container sharing the cache)
        if _start_ticks(int(match[2])) != int(match[3]):  # gone, or its PID now someone else's
            from speedforge.evaluator.zygote import remove_tree

            remove_tree(entry.path)
            removed.append(Path(entry.path))
    return removed


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _start_ticks(pid: int) -> int:
    """When process `pid` started (clock ticks after boot, from /proc), or -1 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return -1


def _watch(
    zygote: Zygote,
    pid: int,
    timeout_s: float,
    memory_limit_mb: int,
    max_processes: int,
    disk: _DiskWatch,
    waited_s=None,
    broken: threading.Event | None = None,
) -> tuple[int | None, str]:
    """Wait for the child; kill it on timeout, when its process tree exceeds the memory limit, the
    process limit or the disk quota, or once its verdict channel was misused (`broken`). Returns
    (returncode, what it was killed for: "time", "memory", "processes", "disk", "channel" or "").
    `waited_s()`: seconds the child has waited for the device's turn, which the time limit does
    not count."""
    deadline = time.monotonic() + timeout_s
    poll_s = 0.005
    while True:
        code = zygote.wait(pid, poll_s)
        if code is not None:
            return code, ""
        poll_s = min(poll_s * 2, 0.2)
        killed_for = "time" if time.monotonic() > deadline + (waited_s() if waited_s else 0.0) else ""
        if broken is not None and broken.is_set():
            killed_for = "channel"
        if not killed_for:
            procs = _tree(pid)
            if _memory_mb(procs) + _shm_mb(pid) > memory_limit_mb:
                killed_for = "memory"
            elif len(procs) > max_processes + 1:  # +1: the namespace's keeper process is the harness's
                killed_for = "processes"
            elif disk.over(procs):
                killed_for = "disk"
        if killed_for:
            _kill_group(pid)
            return zygote.wait(pid, 30.0), killed_for


class _DiskWatch:
    """What a job has added to its folders: the blocks of their files (each counted once), plus
    the files its processes keep open after deleting them, less what was there at its start."""

    def __init__(self, roots: list[Path], limit_mb: int) -> None:
        self.roots, self.limit_bytes = roots, limit_mb << 20
        self.devices = {os.stat(root).st_dev for root in roots if root.exists()}
        self.baseline = self._walk(set())[0]

    def over(self, procs: list[psutil.Process]) -> bool:
        seen: set[tuple[int, int]] = set()
        used, entries = self._walk(seen)
        used += self._deleted_open_files(procs, seen)
        return entries > MAX_SCRATCH_ENTRIES or used - self.baseline > self.limit_bytes

    def _walk(self, seen: set[tuple[int, int]]) -> tuple[int, int]:
        used = entries = 0
        stack = [str(root) for root in self.roots]
        while stack and entries <= MAX_SCRATCH_ENTRIES:
            try:
                listing = list(os.scandir(stack.pop()))
            except OSError:
                continue
            for entry in listing:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries += 1
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    used += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode):
                    stack.append(entry.path)
        return used, entries

    def _deleted_open_files(self, procs: list[psutil.Process], seen: set[tuple[int, int]]) -> int:
        used = 0
        for proc in procs:
            try:
                fds = os.listdir(f"/proc/{proc.pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    st = os.stat(f"/proc/{proc.pid}/fd/{fd}")
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 0 and st.st_dev in self.devices and key not in seen:
                    seen.add(key)
                    used += st.st_blocks * 512
        return used


def _shm_mb(pid: int) -> float:
    """What the job keeps in its private /dev/shm (a tmpfs in its mount namespace, which holds
    it outside any process's memory); 0 while it has none of its own."""
    try:
        own = os.statvfs(f"/proc/{pid}/root/dev/shm")
        if os.stat(f"/proc/{pid}/root/dev/shm").st_dev == os.stat("/dev/shm").st_dev:
            return 0.0
    except OSError:
        return 0.0
    return (own.f_blocks - own.f_bfree) * own.f_frsize / 2**20


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
