"""The fork server behind the sandbox: `python -m speedforge.evaluator.zygote SOCKET_FD PARENT_PID`.

Started once per evaluating process with a scrubbed environment, it imports torch and the
harness (but never initialises CUDA, which does not survive fork), then forks one child per job
request. Each child starts its own process session, enters new namespaces
(speedforge.evaluator.namespaces), locks itself down and runs the job
(speedforge.evaluator.child). Forking a warm interpreter saves the ~2 s of `import torch` that
a fresh process pays for every candidate.

Protocol over a Unix SOCK_SEQPACKET socket, one JSON object per message: the parent sends
{"id", "job", "isolate"} with three file descriptors (the verdict channel,
speedforge.evaluator.verdict; stdout; stderr) attached, and
a fourth for a run (its turn socket, speedforge.evaluator.turns);
the zygote answers {"id", "pid"} once forked (or {"id", "error"}), and {"pid", "status"} when
that child has ended (status as os.waitpid gives it).

Its jobs never outlive the process that started the zygote: the zygote gets SIGTERM when that
process ends (a parent-death signal), and on SIGTERM or the end of its socket it kills the
process group of every live job before it exits; each job gets SIGKILL when the zygote ends.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import sys
import time

_JOBS: dict[int, str] = {}  # live job children (each the leader of its process group): their scratch folders


def preload() -> None:
    """Import what every job needs, without initialising CUDA.

    torch.utils.cpp_extension asks torch.cuda.is_available() at import; answered by the CUDA
    runtime, that initialises the driver and every later fork fails ("Cannot re-initialize CUDA
    in forked subprocess"). Answered through NVML, it does not.

    What `torch.compile` sets up on first use is set up here, so that it predates every job's
    guard baseline and is not taken for the candidate's doing: dynamo's wrapping of
    torch.manual_seed (at import) and of nn.Module.__init__/__setstate__ (generation tagging);
    inductor compiles in-process (TORCHINDUCTOR_COMPILE_THREADS=1, read when its config is
    imported) instead of in a pool of worker processes; and torch's progress bars (tqdm, in
    torch.fx's interpreter) start no monitor thread.
    """
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    import torch

    import torch.utils.cpp_extension  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch._inductor.config  # noqa: F401
    from torch._dynamo.mutation_guard import install_generation_tagging_init
    from torch.hub import tqdm

    install_generation_tagging_init()
    _torch_patcher()
    tqdm.monitor_interval = 0
    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised in the sandbox zygote; forked jobs could not use the GPU")

    from speedforge import families
    from speedforge.evaluator import child, guards, harness, landlock, namespaces  # noqa: F401

    families.names()  # imports every family's module now, not in each job


def _torch_patcher() -> None:
    """What torch.compile's first call rebinds in torch's own modules (dynamo's TorchPatcher: the
    jit tracers and the fused optimizers wrapped so that dynamo does not trace into them, and
    torch.distributions' argument validation off), done here, so that the guards' table of
    module functions (speedforge.evaluator.guards.module_functions) is taken after it. Where this
    torch has no such patcher, nothing is done."""
    try:
        from torch._dynamo.eval_frame import TorchPatcher
    except ImportError:
        return
    patch = getattr(TorchPatcher, "patch", None)
    if patch is not None:
        patch()


def serve(sock: socket.socket) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        try:
            ready, _, _ = select.select([sock, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(sock)
        if sock in ready:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 8)
            if not data:  # the parent went away: its jobs go with it (main)
                return
            _start_job(sock, json.loads(data), fds)


def _start_job(sock: socket.socket, request: dict, fds: list[int]) -> None:
    zygote_pid = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        _send(sock, {"id": request["id"], "error": f"fork failed: {exc}"})
        return
    if pid == 0:
        _in_child(sock, request, fds, zygote_pid)
    _JOBS[pid] = os.path.dirname(request["job"])
    for fd in fds:
        os.close(fd)
    _send(sock, {"id": request["id"], "pid": pid})


def _in_child(sock: socket.socket, request: dict, fds: list[int], zygote_pid: int) -> None:
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from speedforge.evaluator import child, namespaces, phases

        phases.in_job()
        if not namespaces.die_with_parent(signal.SIGKILL, zygote_pid):
            return
        result_fd, out_fd, err_fd, *turn_fd = (
            fds  # result_fd: the verdict channel  # a run's turn socket (speedforge.evaluator.turns)
        )
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.close(out_fd)
        os.close(err_fd)
        phases.mark("forked")
        os.setsid()
        job = child.load_job(request["job"])
        child.limit_cpu_time(job)
        if request["isolate"]:
            warnings = namespaces.isolate(job.config.memory_limit_mb)
        else:
            warnings = [
                "network isolation disabled by config: the sandbox shares the host's network, and "
                "/dev/shm is the host's, which it may not write"
            ]
        phases.mark("isolated")
        child.execute(job, result_fd, warnings, turn_fd[0] if turn_fd else -1)
    finally:
        os._exit(70)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _JOBS.pop(pid, None)
        _send(sock, {"pid": pid, "status": status})


def _kill_jobs() -> None:
    """SIGKILL the process group of every live job (its namespace dies with its first process),
    wait for each to end and remove its scratch folder: the zygote ends this way when the
    process that started it has gone (SIGKILL included), which can no longer clean up."""
    for pid in _JOBS:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:  # forked, not yet the leader of its group
            os.kill(pid, signal.SIGKILL)
        except PermissionError:
            pass
    for pid, workdir in list(_JOBS.items()):
        try:
            os.waitpid(pid, 0)  # its keeper ends after the namespace's last process (namespaces)
        except ChildProcessError:
            pass
        remove_tree(workdir)
    _JOBS.clear()


def remove_tree(path: str) -> None:
    """Remove a folder, again while it still exists: a process of a job killed a moment ago may
    still be ending (a namespace's other processes end just after its keeper)."""
    for _ in range(20):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return
        time.sleep(0.05)


def _on_sigterm(*_) -> None:
    _kill_jobs()
    os._exit(0)


def _send(sock: socket.socket, message: dict) -> None:
    sock.send(json.dumps(message).encode())


def main(argv: list[str]) -> int:
    from speedforge.evaluator import namespaces

    signal.signal(signal.SIGTERM, _on_sigterm)
    if not namespaces.die_with_parent(signal.SIGTERM, int(argv[1])):
        return 0  # the parent is already gone
    sock = socket.socket(fileno=int(argv[0]))
    preload()
    _send(sock, {"ready": True})
    try:
        serve(sock)
    finally:
        _kill_jobs()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
