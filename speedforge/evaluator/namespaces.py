"""Linux namespaces through raw libc calls, for the sandbox's forked children.

`isolate()` puts the calling (single-threaded) process into new network, PID and mount
namespaces and forks: the child it returns in is PID 1 of a namespace of its own, with a fresh
/proc (the CUDA driver reads /proc/<getpid()>), a private, size-limited /dev/shm (a tmpfs that
exists only in its mount namespace: the kernel frees it, and everything written there, when the
namespace's last process ends, however it ends), no network, and the kernel kills every process
in that namespace when the child exits. The parent side (the keeper) waits and mirrors the
child's end; the child dies with the keeper (a parent-death signal), and `die_with_parent` ties
any other harness process to its parent the same way.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG = 1
SHM = "/dev/shm"

_private_shm = False  # whether this process's /dev/shm is the tmpfs `isolate` mounted

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]


def die_with_parent(sig: int, parent_pid: int) -> bool:
    """Have the kernel send `sig` to this process when its parent ends; False when the parent
    `parent_pid` has already ended (then the signal will never come: the caller should exit).

    Linux sends it when the parent *thread* that forked this process ends, so a process started
    from a short-lived thread must be started from one that lives as long as its process.
    """
    _libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    return os.getppid() == parent_pid


def _unshare(flags: int) -> int:
    return 0 if _libc.unshare(ctypes.c_int(flags)) == 0 else ctypes.get_errno()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def private_shm() -> bool:
    """Whether this process's /dev/shm is a private tmpfs mounted by `isolate`."""
    return _private_shm


def isolate(shm_mb: int) -> list[str]:
    """Enter new namespaces and fork. Returns (in the child only) warnings for what was refused.
    `shm_mb`: the size of the private /dev/shm.

    The parent never returns: it waits for the child and exits as the child did.
    """
    global _private_shm
    warnings: list[str] = []
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS
    err = _unshare(flags)
    if err and uid != 0:  # unprivileged: a user namespace grants the rights for the others
        err = _unshare(flags | CLONE_NEWUSER)
        if not err:
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"0 {uid} 1")
            _write("/proc/self/gid_map", f"0 {gid} 1")
    if err:
        warnings.append(
            f"the kernel refused new namespaces ({os.strerror(err)}): the sandbox keeps the network "
            "and its processes are killed by process group only"
        )
        return warnings
    pid = os.fork()
    if pid:
        _mirror(pid)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if (
        _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0
        or _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0
    ):
        warnings.append(f"could not mount a private /proc ({os.strerror(ctypes.get_errno())})")
    problem = _mount_shm(shm_mb)
    _private_shm = not problem
    if problem:
        warnings.append(f"could not mount a private {SHM} ({problem}): the sandbox may not write there")
    return warnings


def _mount_shm(size_mb: int) -> str:
    """Mount a tmpfs of `size_mb` MiB on /dev/shm; '' on success, else why not."""
    if not os.path.isdir(SHM):
        return "no such folder"
    options = f"size={max(1, int(size_mb))}m,mode=1777".encode()
    if _libc.mount(b"tmpfs", SHM.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        return os.strerror(ctypes.get_errno())
    return ""


def _mirror(pid: int) -> None:
    """Wait for the namespace's first process and end the same way (signal as 128 + number).

    As PID 1 of its namespace that process ignores SIGXCPU (the kernel drops default-action
    signals to a namespace's init), so past its CPU-time limit only the hard limit's SIGKILL
    ends it: a SIGKILL after more CPU time than the soft limit reads as SIGXCPU (the kernel's
    accounting of the child, sampled, falls a little short of the hard limit it enforced).
    """
    while True:
        try:
            _, status, usage = os.wait4(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        soft, _ = resource.getrlimit(resource.RLIMIT_CPU)  # inherited: the child's limit too
        if number == signal.SIGKILL and soft != resource.RLIM_INFINITY and usage.ru_utime + usage.ru_stime >= soft:
            number = signal.SIGXCPU
        os._exit(128 + number)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
