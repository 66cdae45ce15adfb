"""The host's faults: a build that fails because the machine did (its disk full, over quota or
failing, a compiler killed for memory) is infra_error, retried and never cached, not the
candidate's compile_error.

A fault is recognised by the lines the OS and the tools write for it, anchored at the tools' own
prefixes, so that what a candidate makes a compiler print (#error, #pragma GCC error, a static
assertion, an echoed source line, an include of a strangely named file) does not read as one.
Flags can still make a compiler print anything, so the parent believes a claim only where it sees
the host in that state itself (`HostWatch`). The harness (in the sandbox) and the build cache (in
the parent) both read these; this module imports nothing of the evaluator's but its records.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import threading
import types
from pathlib import Path

from speedforge.evaluator.job import StageResult

DISK_FULL, OVER_QUOTA, IO_ERROR, COMPILER_KILLED = "disk full", "disk quota exceeded", "I/O error", "compiler killed"
FAULT_ERRNOS = types.MappingProxyType({errno.ENOSPC: DISK_FULL, errno.EDQUOT: OVER_QUOTA, errno.EIO: IO_ERROR})
_OS_WORDS = types.MappingProxyType(
    {os.strerror(number): kind for number, kind in FAULT_ERRNOS.items()}
)  # "No space left on device"
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
