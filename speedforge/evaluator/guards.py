"""Runtime guards, taken inside the sandbox before the candidate is imported and checked after
each phase: timer, torch and the evaluator's own functions unchanged, global torch settings unchanged, no new
threads, no child processes, no switched CUDA stream.

What torch itself does is not the candidate's: its intra-op (OpenMP) pool is warmed to full
size before the baseline (`warm_thread_pools`), dynamo's wrapping and inductor's in-process
compilation are set up in the zygote (speedforge.evaluator.zygote.preload), and native threads
that torch or the CUDA driver name as theirs (`TORCH_THREAD_NAMES`) are not counted. A thread
the candidate starts, from Python or from C++, is.

Backend knobs are not global settings here: `read_knobs`/`apply_knobs` let the harness give
each side its own (speedforge.evaluator.harness `_Harness.switch`), and `precision_downgrades`
names the candidate's knobs that lower float32 precision (a contract violation unless allowed).

This module takes the baseline; the checks against it are speedforge.evaluator.checks's guard
checks (`checks.guard_findings`), run by the harness after every phase.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import types

import torch

from speedforge.evaluator.sealed import Sealed


def _watched_classes() -> dict[str, type]:
    """The classes whose methods the timer and the checks call (their modules' functions are in
    `module_functions`' table, with every module of torch's and the standard library's)."""
    return {
        "torch.Tensor": torch.Tensor,
        "torch._C.TensorBase": torch._C.TensorBase,
        "torch.nn.Module": torch.nn.Module,
        "torch.cuda.Event": torch.cuda.Event,
    }


# A callable added to a watched class shadows what it inherits (torch.Tensor.all is
# TensorBase.all until assigned), so on classes a new entry counts as a patch. Modules gain
# attributes of their own as they load lazily, so there only changed entries do.
WATCHED_CLASSES = frozenset(_watched_classes())


HARNESS = "speedforge.evaluator"


def _harness_objects() -> dict[str, object]:
    """The evaluator's own modules loaded in this process, and the classes they define: a candidate
    that reached one (through sys.modules, which torch hands on as torch.sys) could swap the
    clock the timer reads or a method of the timer, and the measurement would be its."""
    found: dict[str, object] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == HARNESS or name.startswith(HARNESS + ".")):
            continue
        found[name] = module
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == name:
                found[f"{name}.{attr}"] = value
    return found


class _SealedModule(types.ModuleType):
    """A module of speedforge's in a sandbox once the candidate loads: its attributes cannot be set
    or deleted (a submodule imported later may still be bound)."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and name not in vars(self):
            return super().__setattr__(name, value)
        raise AttributeError(f"{self.__name__}.{name} is the evaluator's and cannot be set from the sandbox")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{self.__name__}.{name} is the evaluator's and cannot be deleted from the sandbox")


def seal_harness() -> None:
    """Seal speedforge's modules in this process (`_SealedModule`), before the candidate loads: a
    candidate that reached one (sys.modules, which torch hands on as torch.sys) cannot swap the
    timer's clock or a function the harness calls, even for one call and back. What is left to it
    (object.__setattr__ on the module, its __dict__) the screen names; a class's methods are in
    the function table (`function_table`), checked after every phase."""
    for name, module in list(sys.modules.items()):
        if (
            module is not None
            and type(module) is types.ModuleType
            and (name == "speedforge" or name.startswith("speedforge."))
        ):
            module.__class__ = _SealedModule


def function_table() -> dict[str, int]:
    """id() of every callable attribute of the watched classes, and of the evaluator's own modules
    and classes; of every attribute of a sealed record class (speedforge.evaluator.sealed), whose
    fields are descriptors, not callables."""
    table: dict[str, int] = {}
    for prefix, obj in {**_watched_classes(), **_harness_objects()}.items():
        every = isinstance(obj, Sealed)
        for name, value in dict(vars(obj)).items():
            if every or (callable(value) and not isinstance(value, types.ModuleType)):
                table[f"{prefix}.{name}"] = id(value)
    return table


def classes_without_additions() -> frozenset[str]:
    """The classes in `function_table` on which a new attribute counts as a patch: the watched
    classes, and the evaluator's sealed records (a property or a __getattribute__ put on one would
    read its fields for the timer)."""
    return WATCHED_CLASSES | {prefix for prefix, obj in _harness_objects().items() if isinstance(obj, Sealed)}


def _watched_module(name: str) -> bool:
    """torch's modules and the standard library's (builtins among them): what the reference's
    code reaches at call time besides its own."""
    top = name.split(".", 1)[0]
    return top == "torch" or top in sys.stdlib_module_names


def module_functions() -> list[tuple[str, dict, dict[str, object]]]:
    """Every callable of every module of torch's and of the standard library's loaded now, the
    module's namespace beside it: (name, namespace, {attribute: callable}). A list of modules (it
    was time, torch, torch.cuda, torch.nn.functional and torch.testing) is not all the reference
    reaches at call time: torch.nn.functional looks its kernels up in torch._C._nn on every call
    (F.leaky_relu calls torch._C._nn.leaky_relu), nn.Module's call asks
    torch._C._get_tracing_state, an nn.ModuleList's indexing calls the builtins len and
    isinstance. A candidate that swapped one for a slower function of its own (keeping the
    original for itself) would time the reference through it: ok at 1.41x and 1.50x for the
    reference's own work, under the pristine tripwire's limit. So no list of names: every such
    module (torch._C's submodules are in sys.modules too) is watched, by its namespace (`vars`,
    which loads nothing lazily), each callable held, so that identity is compared, not an id a
    new object could reuse. A module gains attributes as it loads lazily; only a changed or
    deleted entry counts. What torch.compile rebinds on first
    use (TorchPatcher) is set up in the zygote, before this; in a process that then compiled,
    scripted, traced, ran an LSTM, warned and called numpy, none of the 52,000 callables of all
    its modules changed. Third-party modules (numpy, triton, sympy) are left out: they are no
    KernelBench reference's, and what they rebind lazily is theirs to know."""
    found = []
    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType) and _watched_module(name):
            namespace = vars(module)
            found.append(
                (
                    name,
                    namespace,
                    {
                        attr: value
                        for attr, value in list(namespace.items())
                        if callable(value) and not isinstance(value, types.ModuleType)
                    },
                )
            )
    return found


def changed_module_functions(baseline: list[tuple[str, dict, dict[str, object]]]) -> list[str]:
    """The entries of `module_functions()`'s table that changed or went since it was taken."""
    missing = object()
    return [
        f"{name}.{attr}"
        for name, namespace, entries in baseline
        for attr, value in entries.items()
        if namespace.get(attr, missing) is not value
    ]


def global_settings() -> dict[str, object]:
    """Process-wide torch settings that would change the reference's speed or numerics too (the
    backend knobs below are switched per side instead)."""
    return {
        "num_threads": torch.get_num_threads(),
        "grad_enabled": torch.is_grad_enabled(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }


# Backend knobs, in the order they are applied: the legacy setters first (each also sets the
# fp32_precision entries it stands for), then the fp32_precision tree (parents before ops), then
# the rest. The legacy getters raise once legacy and new APIs were mixed: read as MIXED, and the
# fp32_precision entries (which always read) still tell what is on.
MIXED = "mixed legacy/new API"
ALGORITHM_KNOBS = ("torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic")
_FP32_KNOBS = {  # the Python spelling -> the (backend, op) entry of torch's fp32_precision tree
    "torch.backends.fp32_precision": ("generic", "all"),
    "torch.backends.cudnn.fp32_precision": ("cuda", "all"),
    "torch.backends.cuda.matmul.fp32_precision": ("cuda", "matmul"),
    "torch.backends.cudnn.conv.fp32_precision": ("cuda", "conv"),
    "torch.backends.cudnn.rnn.fp32_precision": ("cuda", "rnn"),
    "torch.backends.mkldnn.fp32_precision": ("mkldnn", "all"),
    "torch.backends.mkldnn.matmul.fp32_precision": ("mkldnn", "matmul"),
    "torch.backends.mkldnn.conv.fp32_precision": ("mkldnn", "conv"),
    "torch.backends.mkldnn.rnn.fp32_precision": ("mkldnn", "rnn"),
}
_MEANS = {
    "torch.backends.cuda.matmul.fp32_precision": "TF32 matmul, as torch.backends.cuda.matmul.allow_tf32 = True sets",
    "torch.backends.cudnn.conv.fp32_precision": "TF32 convolutions, as torch.backends.cudnn.allow_tf32 = True sets",
}
_MATMUL_RANK = {"highest": 2, "high": 1, "medium": 0}
_FP32_RANK = {"none": 2, "ieee": 2, "tf32": 1, "bf16": 0}  # "none": inherits, never lower than its parent's


def _legacy(getter):
    def read():
        try:
            return getter()
        except RuntimeError:
            return MIXED

    return read


def _fp32(backend: str, op: str):
    return (
        lambda: torch._C._get_fp32_precision_getter(backend, op),
        lambda value: torch._C._set_fp32_precision_setter(backend, op, value),
    )


def _knob_table() -> dict[str, tuple]:
    """name -> (read, write); the knobs this torch build has."""
    C = torch._C
    table = {
        "torch.set_float32_matmul_precision": (
            _legacy(C._get_float32_matmul_precision),
            C._set_float32_matmul_precision,
        ),
        "torch.backends.cudnn.allow_tf32": (_legacy(C._get_cudnn_allow_tf32), C._set_cudnn_allow_tf32),
    }
    table.update({name: _fp32(*entry) for name, entry in _FP32_KNOBS.items()})
    table.update(
        {
            "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (
                C._get_cublas_allow_fp16_reduced_precision_reduction,
                lambda value: C._set_cublas_allow_fp16_reduced_precision_reduction(*value),
            ),
            "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (
                C._get_cublas_allow_bf16_reduced_precision_reduction,
                lambda value: C._set_cublas_allow_bf16_reduced_precision_reduction(*value),
            ),
            "torch.backends.cuda.matmul.allow_fp16_accumulation": (
                C._get_cublas_allow_fp16_accumulation,
                C._set_cublas_allow_fp16_accumulation,
            ),
            "torch.backends.cudnn.benchmark": (C._get_cudnn_benchmark, C._set_cudnn_benchmark),
            "torch.backends.cudnn.deterministic": (C._get_cudnn_deterministic, C._set_cudnn_deterministic),
        }
    )
    readable = {}
    for name, (read, write) in table.items():
        try:
            read()
        except (AttributeError, RuntimeError):
            continue  # not in this build
        readable[name] = (read, write)
    return readable


KNOBS = _knob_table()


def read_knobs() -> dict[str, object]:
    """The backend knobs now in effect (a few microseconds)."""
    return {name: read() for name, (read, _) in KNOBS.items()}


def apply_knobs(target: dict[str, object], current: dict[str, object]) -> None:
    """Make `target` the knobs in effect, `current` being those in effect now; nothing is set
    when they agree. A MIXED legacy value is left to the fp32_precision entries."""
    if target == current:
        return
    for name, (_, write) in KNOBS.items():
        if target[name] != MIXED:
            write(target[name])


def _lowered(name: str, ref: object, cand: object) -> bool:
    if ref == MIXED or cand == MIXED or name in ALGORITHM_KNOBS:
        return False
    if name == "torch.set_float32_matmul_precision":
        return _MATMUL_RANK.get(cand, 2) < _MATMUL_RANK.get(ref, 2)
    if name in _FP32_KNOBS:
        return _FP32_RANK.get(cand, 2) < _FP32_RANK.get(ref, 2)
    if name == "torch.backends.cudnn.allow_tf32" or "accumulation" in name:
        return bool(cand) and not ref
    return bool(cand[0]) and not ref[0]  # (allow, allow split-K) of a reduced-precision reduction


def precision_downgrades(ref: dict[str, object], cand: dict[str, object]) -> list[str]:
    """The candidate's knobs that lower float32 precision below the reference's, one line each."""
    found = []
    for name in KNOBS:
        if _lowered(name, ref[name], cand[name]):
            meaning = f" ({_MEANS[name]})" if name in _MEANS else ""
            found.append(f"{name} {_show(cand[name])}, the reference's {_show(ref[name])}{meaning}")
    return found


def _show(value: object) -> str:
    return repr(value[0] if isinstance(value, tuple) else value)


# Process starts from Python raise audit events, and an audit hook cannot be removed once added.
# Thread starts raise none before Python 3.13, so the thread-start primitives are wrapped
# instead, the originals kept only in a closure. Either way a thread or process that finished
# long before the check is still counted.
PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.system")
THREAD_STARTERS = (
    ("_thread", "start_new_thread"),
    ("_thread", "start_joinable_thread"),
    ("threading", "_start_new_thread"),
    ("threading", "_start_joinable_thread"),
)


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


# Native threads that torch, its allocator and the CUDA driver start and name as theirs, as
# /proc/self/task/*/comm shows them. Any other new thread counts: a thread the candidate starts
# (std::thread, pthreads, OpenMP of its own) carries the name of the thread that started it.
# OpenMP threads of torch's intra-op pool carry that name too: warm_thread_pools starts them
# all before the baseline.
TORCH_THREAD_NAMES = (
    "pt_autograd_",
    "pt_thread_pool",
    "PTThreadPool",
    "pt_main_thread",
    "cuda-EvtHandlr",
    "cuda0",
    "jemalloc_bg_thd",
)


def native_threads() -> dict[int, str]:
    """tid -> name of every thread of this process."""
    found: dict[int, str] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                found[int(tid)] = f.read().strip()
        except OSError:
            continue  # it ended meanwhile
    return found


def warm_thread_pools() -> None:
    """Start torch's intra-op pool at its full size (torch.get_num_threads()) now: a parallel op
    of two grains (2 x 32768 elements) per thread. The pool's threads then predate the baseline,
    and a candidate whose work is parallel (a large torch.zeros) starts none."""
    torch.zeros(torch.get_num_threads() << 16).add_(1)


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
    module_functions: list[tuple[str, dict, dict[str, object]]]
    settings: dict[str, object]
    threads: dict[int, str]  # tid -> name
    python_threads: int
    stream: object
    starts: object  # reads the audit hook's counts of thread and process starts
    started: dict[str, int]

    @staticmethod
    def take(device: torch.device) -> "Baseline":
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        starts = install_start_counter()
        return Baseline(
            function_table(),
            module_functions(),
            global_settings(),
            native_threads(),
            threading.active_count(),
            stream,
            starts,
            starts(),
        )
