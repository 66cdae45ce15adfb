"""Runs that overlap on one device, and a run that ran out of device memory beside another.

`evaluator.overlap_runs` sandboxes run at once per device (speedforge.evaluator.turns): each
prepares, outside the device's turn, while another times. Preparing allocates device memory (the
reference's and the candidate's weights, inputs and first calls), so two runs of a task with large
tensors can each fit the device alone and not together: on an H100, every held-out sample of
KernelBench's level2/34 (a ConvTranspose3d whose output is 4 GiB; ~50 GiB in use per sandbox) came
back `infra_error` "CUDA out of memory" while the sample beside it prepared.

`run_overlapped` runs one sandboxed run as one of the overlapping ones; when it ran out of device
memory while another run of this process was under way, it is run once more alone: the others
finish and none starts until it is done. A run that ran out of memory alone is not run again (its
result stands). The gate is per process, which is where the overlapping runs of a batch (the
local path's threads) and of a bench worker (its actor's concurrent calls) are.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from speedforge.records import EvalResult

OUT_OF_MEMORY = ("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory")


def out_of_device_memory(result: EvalResult) -> bool:
    """The run failed because device memory ran out in the harness (an infra_error, not the candidate's verdict)."""
    return (
        isinstance(result, EvalResult)
        and result.status == "infra_error"
        and any(marker in result.reason for marker in OUT_OF_MEMORY)
    )


class _Span:
    overlapped = False  # another run was under way at some moment of this one


class OverlapGate:
    """Shared spans for overlapping runs, an exclusive one for a run that must be alone."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active: list[_Span] = []
        self._alone = 0  # exclusive spans running or waiting: no shared span starts meanwhile

    @contextlib.contextmanager
    def shared(self) -> Iterator[_Span]:
        span = _Span()
        with self._cond:
            self._cond.wait_for(lambda: self._alone == 0)
            for other in self._active:
                other.overlapped = True
            span.overlapped = bool(self._active)
            self._active.append(span)
        try:
            yield span
        finally:
            with self._cond:
                self._active.remove(span)
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._alone += 1
            self._cond.wait_for(lambda: not self._active)
            span = _Span()
            self._active.append(span)
        try:
            yield
        finally:
            with self._cond:
                self._active.remove(span)
                self._alone -= 1
                self._cond.notify_all()


GATE = OverlapGate()


def run_overlapped(run: Callable[[], EvalResult], gate: OverlapGate = GATE) -> EvalResult:
    """`run()` beside the process's other runs; once more, alone, when it ran out of device memory beside one."""
    with gate.shared() as span:
        result = run()
    if not (span.overlapped and out_of_device_memory(result)):
        return result
    with gate.exclusive():
        return run()
