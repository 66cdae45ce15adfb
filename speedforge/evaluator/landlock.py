"""Landlock (Linux >= 5.13) through raw system calls: restrict which paths the sandboxed process
may read and write, and (ABI >= 4) forbid TCP bind/connect, and (ABI >= 6) signals to and
abstract sockets of processes outside the sandbox.

`restrict` applies to the calling thread and its future children; call it while the process
is single-threaded (before torch starts thread pools) so every thread inherits it.
"""

from __future__ import annotations

import ctypes
import glob
import os
import platform
import struct

# System call numbers are shared by x86_64 and aarch64 for these new calls.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem access rights by the ABI that introduced them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_FS_ABI1 = (1 << 13) - 1
_NET_BIND_TCP, _NET_CONNECT_TCP = 1, 2  # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2  # ABI 6

DIR_RIGHTS_READ = EXECUTE | READ_FILE | READ_DIR
# The devices a sandbox may write: what Python and torch open for writing (subprocess's
# DEVNULL, os.urandom's fallback), and the NVIDIA driver's device files, which CUDA opens
# read-write. The rest of /dev (disks, ttys, kmsg, the host's /dev/shm) is read-only at most.
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
NVIDIA_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def abi_version() -> int:
    """The kernel's Landlock ABI version, or 0 where Landlock is missing or disabled."""
    if platform.system() != "Linux":
        return 0
    version = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def writable_devices(private_shm: bool) -> list[str]:
    """The paths under /dev a sandbox may write: the harmless devices, the NVIDIA devices present,
    and /dev/shm only when it is the sandbox's own tmpfs (speedforge.evaluator.namespaces)."""
    paths = list(WRITABLE_DEVICES)
    for pattern in NVIDIA_DEVICES:
        paths += sorted(glob.glob(pattern))
    if private_shm:
        paths.append("/dev/shm")
    return paths


def _handled_fs(abi: int) -> int:
    rights = _FS_ABI1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    return rights


def restrict(read_paths: list[str], write_paths: list[str], deny_tcp: bool = True) -> str | None:
    """Allow reading under `read_paths` and reading+writing under `write_paths`; deny the rest.

    Returns None on success, or a warning line saying why the restriction was not applied.
    """
    abi = abi_version()
    if abi < 1:
        return "Landlock is not available in this kernel: file access of the sandbox is not restricted"
    handled_fs = _handled_fs(abi)
    handled_net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if (deny_tcp and abi >= 4) else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    if abi >= 6:
        attr = struct.pack("QQQ", handled_fs, handled_net, scoped)
    elif abi >= 4:
        attr = struct.pack("QQ", handled_fs, handled_net)
    else:
        attr = struct.pack("Q", handled_fs)
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset_fd = _libc.syscall(_SYS_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset_fd < 0:
        return f"Landlock ruleset refused ({os.strerror(ctypes.get_errno())}): file access is not restricted"
    try:
        write_rights = handled_fs
        for path in write_paths:
            _add_path(ruleset_fd, path, write_rights)
        for path in read_paths:
            _add_path(ruleset_fd, path, DIR_RIGHTS_READ)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"prctl(NO_NEW_PRIVS) refused ({os.strerror(ctypes.get_errno())}): file access is not restricted"
        if _libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)) != 0:
            return f"Landlock restrict_self refused ({os.strerror(ctypes.get_errno())}): file access is not restricted"
    finally:
        os.close(ruleset_fd)
    return None


def _add_path(ruleset_fd: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist needs no rule
    try:
        if not os.path.isdir(path):
            rights &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE
        attr = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr is packed
        buf = ctypes.create_string_buffer(attr, len(attr))
        if (
            _libc.syscall(
                _SYS_ADD_RULE, ctypes.c_int(ruleset_fd), ctypes.c_int(_RULE_PATH_BENEATH), buf, ctypes.c_uint32(0)
            )
            != 0
        ):
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
