"""Runtime guards, taken inside the sandbox before the candidate is imported and checked after
each phase: timer and torch functions unchanged, global torch settings unchanged, no new
threads, no child processes, no switched CUDA stream.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
import types

import torch

def _watched_objects() -> dict[str, object]:
    return {
        "time": time,
        "torch": torch,
        "torch.cuda": torch.cuda,
        "torch.nn.functional": torch.nn.functional,
        "torch.testing": torch.testing,
        "torch.Tensor": torch.Tensor,
        "torch._C.TensorBase": torch._C.TensorBase,
        "torch.nn.Module": torch.nn.Module,
        "torch.cuda.Event": torch.cuda.Event,
    }


def function_table() -> dict[str, int]:
    """id() of every callable attribute of the watched modules and classes."""
    table: dict[str, int] = {}
    for prefix, obj in _watched_objects().items():
        namespace = vars(obj) if isinstance(obj, type) else {n: getattr(obj, n, None) for n in dir(obj)}
        for name, value in namespace.items():
            if callable(value) and not isinstance(value, types.ModuleType):
                table[f"{prefix}.{name}"] = id(value)
    return table


def global_settings() -> dict[str, object]:
    """Process-wide torch settings that would change the reference's speed or numerics too."""
    settings: dict[str, object] = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "num_threads": torch.get_num_threads(),
        "grad_enabled": torch.is_grad_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
    }
    if torch.cuda.is_available():
        matmul = torch.backends.cuda.matmul
        settings["cuda.matmul.allow_tf32"] = matmul.allow_tf32
        settings["cuda.matmul.fp16_reduced"] = matmul.allow_fp16_reduced_precision_reduction
        settings["cuda.matmul.bf16_reduced"] = matmul.allow_bf16_reduced_precision_reduction
    return settings


# Process starts from Python raise audit events, and an audit hook cannot be removed once added.
# Thread starts raise none before Python 3.13, so the thread-start primitives are wrapped
# instead, the originals kept only in a closure. Either way a thread or process that finished
# long before the check is still counted.
PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.system")
THREAD_STARTERS = (("_thread", "start_new_thread"), ("_thread", "start_joinable_thread"),
                   ("threading", "_start_new_thread"), ("threading", "_start_joinable_thread"))


def install_start_counter():
    """Count thread and process starts from now on; returns a function reading the counts."""
    counts = {"threads": 0, "processes": 0}

    def on_event(event: str, args: tuple) -> None:
        if event in PROCESS_EVENTS:
            counts["processes"] += 1

    def counting(start):
        def start_thread(*args, **kwargs):
            counts["threads"] += 1
            return start(*args, **kwargs)

        return start_thread

    sys.addaudithook(on_event)
    for module_name, attr in THREAD_STARTERS:
        module = sys.modules.get(module_name) or __import__(module_name)
        if hasattr(module, attr):
            setattr(module, attr, counting(getattr(module, attr)))
    return lambda: dict(counts)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def child_pids() -> list[int]:
    """Pids of this process's children (read from /proc/self, valid inside a PID namespace)."""
    pids: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return pids


@dataclasses.dataclass
class Baseline:
    functions: dict[str, int]
    settings: dict[str, object]
    threads: int
    python_threads: int
    stream: object
    starts: object  # reads the audit hook's counts of thread and process starts
    started: dict[str, int]

    @staticmethod
    def take(device: torch.device) -> "Baseline":
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        starts = install_start_counter()
        return Baseline(function_table(), global_settings(), thread_count(), threading.active_count(), stream,
                        starts, starts())

    def violations(self, device: torch.device, original_current_stream) -> list[str]:
        """What changed since the baseline, one line each; empty when nothing did."""
        found: list[str] = []
        now = function_table()
        patched = sorted(k for k, v in self.functions.items() if now.get(k, v) != v)
        if patched:
            found.append(f"patched functions: {', '.join(patched[:5])}")
        settings = global_settings()
        changed = sorted(k for k, v in self.settings.items() if settings.get(k) != v)
        if changed:
            found.append(f"changed global torch settings: {', '.join(changed)}")
        started = self.starts()
        for kind in ("threads", "processes"):
            if started[kind] > self.started[kind]:
                found.append(f"started {kind} from Python ({started[kind] - self.started[kind]})")
        if threading.active_count() > self.python_threads:
            found.append(f"started Python threads ({threading.active_count() - self.python_threads} new)")
        elif thread_count() > self.threads:
            found.append(f"started native threads ({thread_count() - self.threads} new)")
        if child_pids():
            found.append(f"started child processes ({len(child_pids())})")
        if device.type == "cuda" and original_current_stream(device) != self.stream:
            found.append("switched the current CUDA stream")
        return found
