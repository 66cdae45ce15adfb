"""Runtime guards, taken inside the sandbox before the candidate is imported and checked after
each phase: timer, torch and the evaluator's own functions unchanged, the evaluator's module-level
values unchanged (`harness_values`), global torch settings unchanged, no new threads, no child
processes, no switched CUDA stream.

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

import collections
import dataclasses
import functools
import gc
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


# Entries Python adds to a namespace when they are first read (a class's or a module's
# `__annotations__`), which no behaviour of the harness depends on.
_LAZY_ENTRIES = frozenset({"__annotations__", "__annotate__", "__annotate_func__", "__annotations_cache__"})
# a module's builtins are the builtins module's namespace, whose callables `module_functions` watches
_UNCOMPARED = _LAZY_ENTRIES | {"__builtins__"}
_ATOMS = frozenset({str, bytes, int, float, bool, complex, type(None), range, type(Ellipsis)})
_SEQUENCES = (list, tuple, set, frozenset, collections.deque)
_SHAPE_DEPTH = 12  # containers nested deeper than this are compared by identity alone


def _sealed_module(name: object) -> bool:
    """speedforge's own modules (by name): those `seal_harness` seals."""
    return type(name) is str and (name == "speedforge" or name.startswith("speedforge."))


def harness_values() -> list[tuple[str, dict, dict[str, list], frozenset[str]]]:
    """Every module-level binding of speedforge's modules loaded now, each with the objects it
    reaches: (module, namespace, {attribute: the objects its value reaches, in a fixed order},
    the names the module declares as the harness's own run state).

    The function table compares the evaluator's callables; what the harness reads besides them is
    as much its own: the readers that take a timing into the sent record, the encoder's table of
    escapes, the table of checks and their statuses, the table of backend knobs, a captured
    builtin. A candidate that reached one (sys.modules, which torch hands on as torch.sys) could
    rebind it through the module's namespace (the sealed module refuses only setattr), change it
    in place (a dict, a list; the dict behind a read-only MappingProxyType, which
    gc.get_referents hands out; a field of a frozen record, through object.__setattr__), or swap
    a function's code, defaults or closure. So no list of names: the value of every binding is
    walked (`_reach`) through the containers, the functions, and the classes and instances of
    speedforge's own that it holds, and every object met is held, so that identity is compared,
    not an id a new object could reuse; a container's order of iteration is part of it, so a
    change in place shows as another object, or another count, somewhere in the walk.

    Left out: the bindings a module names in its `HARNESS_STATE` (a tuple, read now, before the
    candidate loads), which the harness itself sets while the candidate runs (whether this run
    holds the device's turn: speedforge.evaluator.turns)."""
    found = []
    for name, module in list(sys.modules.items()):
        if isinstance(module, types.ModuleType) and _sealed_module(name):
            namespace = vars(module)
            declared = namespace.get("HARNESS_STATE", ())
            own = frozenset(declared) if type(declared) is tuple else frozenset()
            entries = {attr: _reach(value) for attr, value in list(namespace.items()) if attr not in _UNCOMPARED | own}
            found.append((name, namespace, entries, own))
    return found


def changed_harness_values(baseline: list[tuple[str, dict, dict[str, list], frozenset[str]]]) -> list[str]:
    """The bindings of `harness_values()`'s table that were rebound, changed in place, or deleted
    since it was taken, and those added since that are not modules (a submodule imported later
    is bound on its package)."""
    changed = []
    for name, namespace, entries, own in baseline:
        for attr, reached in entries.items():
            if attr not in namespace or not _same(reached, _reach(namespace[attr])):
                changed.append(f"{name}.{attr}")
        for attr, value in list(namespace.items()):
            if attr not in entries and attr not in _UNCOMPARED | own and type(value) is not types.ModuleType:
                changed.append(f"{name}.{attr}")
    return changed


def _same(before: list, after: list) -> bool:
    return len(before) == len(after) and all(a is b for a, b in zip(before, after))


def _reach(value: object) -> list:
    """The objects `value` reaches, `value` first, each once, in the order of a depth-first walk:
    into the entries of dicts and mapping proxies, the items of lists, tuples, sets and deques,
    a function's code, defaults and closure, a bound method's function and object, what a
    functools.cache function keeps (process_state's table of process state, found once), and the
    namespace and slots of a class or an instance of speedforge's own. Other objects (a module,
    a tensor, a compiled pattern, a lock) are compared by identity.

    Only built-in types' own methods read them (`dict.items` on a dict subclass, a slot's own
    descriptor, never getattr or an object's __iter__), so that no code of an object the
    candidate put in a table runs inside the guards."""
    out: list = []
    seen: set[int] = set()

    def walk(item: object, depth: int) -> None:
        out.append(item)
        kind = type(item)
        if kind in _ATOMS or depth > _SHAPE_DEPTH or id(item) in seen:
            return
        seen.add(id(item))
        for entry in _entries(item, kind):
            walk(entry, depth + 1)

    walk(value, 0)
    return out


_CACHED = type(functools.cache(lambda: None))
_class_namespace = type.__dict__["__dict__"].__get__  # a class's own namespace, whatever its metaclass says
_EMPTY_CELL = object()


def _entries(item: object, kind: type) -> list:
    """What `_reach` walks into from `item` (of type `kind`), in order."""
    if issubclass(kind, dict):
        return [x for pair in dict.items(item) for x in pair]
    if kind is types.MappingProxyType:  # the mapping it shows, which gc hands out to anyone
        return gc.get_referents(item)
    for base in _SEQUENCES:
        if issubclass(kind, base):
            return list(base.__iter__(item))
    if kind is types.FunctionType:
        cells = []
        for cell in item.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # not filled yet
                cells.append(_EMPTY_CELL)
        return [item.__code__, item.__defaults__, item.__kwdefaults__, *cells]
    if kind is types.MethodType:
        return [item.__func__, item.__self__]
    if kind is _CACHED:  # a function of functools.cache's: its function and what it keeps (a table found once)
        return gc.get_referents(item)
    if issubclass(kind, type):
        namespace = _class_namespace(item)
        if not _sealed_module(namespace.get("__module__")):
            return []
        return [x for key, entry in dict.items(dict(namespace)) if key not in _LAZY_ENTRIES for x in (key, entry)]
    if not _sealed_module(_class_namespace(kind).get("__module__")):
        return []
    found, instance_dict = [], False
    for base in kind.__mro__:
        namespace = _class_namespace(base)
        holder = namespace.get("__dict__")
        if type(holder) is types.GetSetDescriptorType and not instance_dict:
            instance_dict = True
            found += [x for pair in dict.items(holder.__get__(item)) for x in pair]
        slots = namespace.get("__slots__", ())
        for name in [slots] if type(slots) is str else slots:
            descriptor = namespace.get(name)
            if type(descriptor) is types.MemberDescriptorType:
                try:
                    found += [name, descriptor.__get__(item)]
                except AttributeError:  # not set
                    found += [name, _EMPTY_CELL]
    return found


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
# The tables below are read-only: the guards read them after candidate code ran.
# The Python spelling -> the (backend, op) entry of torch's fp32_precision tree.
_FP32_KNOBS = types.MappingProxyType(
    {
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
)
_MEANS = types.MappingProxyType(
    {
        "torch.backends.cuda.matmul.fp32_precision": "TF32 matmul, as torch.backends.cuda.matmul.allow_tf32 = True sets",
        "torch.backends.cudnn.conv.fp32_precision": "TF32 convolutions, as torch.backends.cudnn.allow_tf32 = True sets",
    }
)
_MATMUL_RANK = types.MappingProxyType({"highest": 2, "high": 1, "medium": 0})
# "none": inherits, never lower than its parent's
_FP32_RANK = types.MappingProxyType({"none": 2, "ieee": 2, "tf32": 1, "bf16": 0})


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


KNOBS = types.MappingProxyType(_knob_table())


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
    values: list[tuple[str, dict, dict[str, list], frozenset[str]]]  # the evaluator's module-level values
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
            harness_values(),
            global_settings(),
            native_threads(),
            threading.active_count(),
            stream,
            starts,
            starts(),
        )
