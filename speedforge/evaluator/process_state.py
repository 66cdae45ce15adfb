"""Process-wide state the reference's speed can depend on: read all of it, put it back.

A candidate runs in the reference's process, so anything it changes process-wide could slow the
reference. The harness takes a `capture()` before the candidate is imported and `apply()`s it around
every reference call (speedforge.evaluator.harness, `_Harness.switch`); the candidate keeps what it
set for its own calls. The state is found, not listed, so that a knob nobody thought of is covered
too: the getter/setter pairs of torch's global context and of torch._C's submodules, walked
recursively; the properties of the `torch.backends.*` modules; thread counts (torch's and each BLAS
library's), default dtype and device, grad, autocast and anomaly modes; the interpreter's hooks,
limits and collector; torch's module-level hook registries and its function and dispatch mode
stacks; os.environ; every thread's scheduling (`SCHEDULING`). glibc's malloc parameters have no
getter and are written back before every call instead (sandbox.MALLOC_TUNABLES). The precision and
algorithm knobs go through guards.KNOBS; what no capture covers is the pristine tripwire's
(docs/concepts/evaluator.md).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import sys
import threading
import types

import torch

from speedforge.evaluator import blas_threads, guards

# Getter/setter pairs of torch._C that are not settings, or are the precision knobs guards owns.
_NOT_STATE = (
    "thread_name",
    "tracing_state",
    "torch_function_state",
    "dispatch_mode",
    "graph_exec_group",
    "value_trace",
    "tensor_metadata",
    "warnAlways",
    "backcompat_",
    "autograd_fallback_mode",
    "dtensor_allow_implicit_replication",
)
_PRECISION = (
    "tf32",
    "float32_matmul_precision",
    "reduced_precision_reduction",
    "fp16_accumulation",
    "fp32_precision",
    "cudnn_benchmark",
    "cudnn_deterministic",
    "fp16_bf16_reduction",
)
_PRECISION_PROPS = ("allow_tf32", "fp32_precision", "benchmark", "deterministic", "allow_fp16", "allow_bf16")
_SCALAR = (bool, int, float, str, type(None))
ENVIRONMENT = "os.environ"


def _c_pairs() -> dict[str, tuple]:
    C = torch._C
    found: dict[str, tuple] = {}
    for name in dir(C):
        if not name.startswith("_get_"):
            continue
        stem = name[len("_get_") :]
        setter = getattr(C, "_set_" + stem, None)
        if stem.endswith("_sdp_enabled"):  # _get_flash_sdp_enabled / _set_sdp_use_flash
            setter = getattr(C, "_set_sdp_use_" + stem[: -len("_sdp_enabled")], None)
        if setter is None or any(word in stem for word in _NOT_STATE + _PRECISION):
            continue
        found[f"torch._C.{name}"] = (getattr(C, name), setter)
    return found


def _c_submodule_pairs() -> dict[str, tuple]:
    """get_X / set_X (or _get_X / _set_X) pairs of torch._C's submodules, walked recursively: the
    frame-evaluation callback of torch._C._dynamo.eval_frame among them (its getter is
    get_eval_frame_callback, its setter set_eval_frame), a hook that sees every Python frame of
    the reference's call and could rewrite its module from inside it."""
    found: dict[str, tuple] = {}
    seen: set[int] = set()

    def walk(module: types.ModuleType, prefix: str, depth: int) -> None:
        if id(module) in seen or depth > 3:
            return
        seen.add(id(module))
        for name in dir(module):
            value = getattr(module, name, None)
            if isinstance(value, types.ModuleType) and name.startswith("_") is (depth == 0):
                walk(value, f"{prefix}.{name}", depth + 1)
            if depth == 0 or not name.lstrip("_").startswith("get_"):
                continue
            setter_prefix = name[: name.index("get_")] + "set_"
            stem = name[name.index("get_") + 4 :]
            for setter in (setter_prefix + stem, setter_prefix + stem.removesuffix("_callback")):
                if callable(getattr(module, setter, None)) and not any(word in stem for word in _NOT_STATE):
                    found[f"{prefix}.{name}"] = (getattr(module, name), getattr(module, setter))
                    break

    walk(torch._C, "torch._C", 0)
    return found


def _backend_properties() -> dict[str, tuple]:
    """Properties of the torch.backends module objects, walked recursively."""
    import importlib
    import pkgutil

    import torch.backends

    for info in pkgutil.iter_modules(torch.backends.__path__):
        try:
            importlib.import_module(f"torch.backends.{info.name}")
        except Exception:  # a backend this build lacks
            continue
    found: dict[str, tuple] = {}
    seen: set[int] = set()

    def walk(obj, prefix: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        names = set(vars(obj)) | {
            n for n, v in vars(type(obj)).items() if hasattr(v, "__get__") and hasattr(v, "__set__")
        }
        for name in sorted(names):
            if name.startswith("__"):
                continue
            try:
                value = getattr(obj, name)
            except Exception:
                continue
            path = f"{prefix}.{name}"
            if isinstance(value, types.ModuleType):
                if value.__name__.startswith("torch.backends."):
                    walk(value, value.__name__)
            elif isinstance(value, _SCALAR) and not name.isupper() and name not in _PRECISION_PROPS:
                # a module global too (torch.backends.opt_einsum.strategy, mha._is_fastpath_enabled);
                # a constant among them is never written, its value never differing
                found[path] = (functools.partial(getattr, obj, name), functools.partial(setattr, obj, name))
            elif (
                type(value).__module__.startswith("torch.backends") and not callable(value) and not name.startswith("_")
            ):
                walk(value, path)

    walk(torch.backends, "torch.backends")
    return found


def _device_types() -> list[str]:
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _torch_settings() -> dict[str, tuple]:
    found: dict[str, tuple] = {
        "torch.get_num_threads": (torch.get_num_threads, torch.set_num_threads),
        "torch.get_num_interop_threads": (torch.get_num_interop_threads, None),  # fixed once work started
        "torch.get_default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "torch.get_default_device": (lambda: str(torch.get_default_device()), torch.set_default_device),
        "torch.is_grad_enabled": (torch.is_grad_enabled, torch.set_grad_enabled),
        "torch.is_inference_mode_enabled": (torch.is_inference_mode_enabled, None),
        "torch.is_anomaly_enabled": (torch.is_anomaly_enabled, torch.set_anomaly_enabled),
        "torch.is_deterministic_algorithms_warn_only_enabled": (
            torch.is_deterministic_algorithms_warn_only_enabled,
            lambda warn: torch.use_deterministic_algorithms(
                torch.are_deterministic_algorithms_enabled(), warn_only=warn
            ),
        ),
        "torch.is_autocast_cache_enabled": (torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
    }
    for device in _device_types():
        found[f"torch.is_autocast_enabled({device})"] = (
            functools.partial(torch.is_autocast_enabled, device),
            functools.partial(torch.set_autocast_enabled, device),
        )
        found[f"torch.get_autocast_dtype({device})"] = (
            functools.partial(torch.get_autocast_dtype, device),
            functools.partial(torch.set_autocast_dtype, device),
        )
    # the interpreter's: a profile or trace function, the thread switch interval, the recursion limit
    found["sys.getprofile"] = (sys.getprofile, sys.setprofile)
    found["sys.gettrace"] = (sys.gettrace, sys.settrace)
    found["sys.getswitchinterval"] = (sys.getswitchinterval, sys.setswitchinterval)
    found["sys.getrecursionlimit"] = (sys.getrecursionlimit, sys.setrecursionlimit)
    found["gc.get_threshold"] = (gc.get_threshold, lambda value: gc.set_threshold(*value))
    found["gc.isenabled"] = (gc.isenabled, lambda on: gc.enable() if on else gc.disable())
    if torch.cuda.is_available() and hasattr(torch.cuda, "get_per_process_memory_fraction"):
        found["torch.cuda.get_per_process_memory_fraction"] = (
            torch.cuda.get_per_process_memory_fraction,
            torch.cuda.set_per_process_memory_fraction,
        )
    return found


def _hook_registries() -> dict[str, tuple]:
    """Module-level hook registries of every torch module loaded (found by name: a dict or list
    whose name says hook), read as their contents and written back in place."""
    found: dict[str, tuple] = {}
    for module_name, module in sorted(sys.modules.items()):
        if not module_name.startswith("torch") or not isinstance(module, types.ModuleType):
            continue
        for name, value in list(vars(module).items()):
            if "hook" not in name.lower() or not isinstance(value, (dict, list)):
                continue
            if isinstance(value, dict):
                read = functools.partial(lambda d: tuple(d.items()), value)
                write = functools.partial(lambda d, items: (d.clear(), d.update(items)), value)
            else:
                read = functools.partial(tuple, value)
                write = functools.partial(lambda lst, items: lst.__setitem__(slice(None), items), value)
            found[f"{module_name}.{name}"] = (read, write)
    return found


def _function_modes() -> tuple:
    C = torch._C
    return tuple(C._get_function_stack_at(i) for i in range(C._len_torch_function_stack()))


def _set_function_modes(modes: tuple) -> None:
    C = torch._C
    while C._len_torch_function_stack():
        C._pop_torch_function_stack()
    for mode in modes:
        C._push_on_torch_function_stack(mode)


def _dispatch_modes() -> tuple:
    from torch.utils import _python_dispatch

    return tuple(_python_dispatch._get_current_dispatch_mode_stack())


def _set_dispatch_modes(modes: tuple) -> None:
    from torch.utils import _python_dispatch

    while torch._C._len_torch_dispatch_stack():
        _python_dispatch._pop_mode()
    for mode in modes:
        _python_dispatch._push_mode(mode)


# glibc's mallopt parameter numbers (malloc.h), by the name of their tunable (glibc.malloc.NAME)
_MALLOPT = types.MappingProxyType(
    {
        "mxfast": 1,
        "trim_threshold": -1,
        "top_pad": -2,
        "mmap_threshold": -3,
        "mmap_max": -4,
        "perturb": -6,
        "arena_test": -7,
        "arena_max": -8,
    }
)
_INT_MAX = 2**31 - 1


@functools.cache
def malloc_parameters() -> tuple[tuple[int, int], ...]:
    """(mallopt parameter, value) of every malloc parameter GLIBC_TUNABLES names, read once (the
    sandbox sets it before the process starts; empty outside a sandbox or without glibc)."""
    found = []
    for item in os.environ.get("GLIBC_TUNABLES", "").split(":"):
        name, _, value = item.partition("=")
        stem = name.removeprefix("glibc.malloc.")
        if stem != name and stem in _MALLOPT and value.isdigit() and int(value) <= _INT_MAX:
            found.append((_MALLOPT[stem], int(value)))
    return tuple(found)


@functools.cache
def _mallopt():
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return None


def write_malloc_parameters() -> None:
    """Set glibc's malloc parameters back to the sandbox's (a few microseconds)."""
    mallopt = _mallopt()
    if mallopt is None:
        return
    for parameter, value in malloc_parameters():
        mallopt(parameter, value)


SCHEDULING = "threads' scheduling (affinity, policy, nice)"


def _threads() -> list[int]:
    try:
        return sorted(int(tid) for tid in os.listdir("/proc/self/task"))
    except OSError:
        return [threading.get_native_id()]


def _scheduling_read() -> dict[int, tuple]:
    found = {}
    for tid in _threads():
        try:
            found[tid] = (
                tuple(sorted(os.sched_getaffinity(tid))),
                os.sched_getscheduler(tid),
                os.getpriority(os.PRIO_PROCESS, tid),
            )
        except OSError:  # it ended meanwhile
            continue
    return found


def _scheduling_write(target: dict[int, tuple]) -> None:
    """Each thread that still exists back to its affinity, policy and nice value; raises when one
    cannot be (a nice value lowered back needs a privilege the sandbox does not have)."""
    for tid, (cpus, policy, nice) in target.items():
        try:
            if os.sched_getscheduler(tid) != policy:
                os.sched_setscheduler(tid, policy, os.sched_param(0))
            if os.getpriority(os.PRIO_PROCESS, tid) != nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            if tuple(sorted(os.sched_getaffinity(tid))) != cpus:
                os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:  # it ended meanwhile
            continue


def refresh_scheduling(states: list[dict[str, object]]) -> None:
    """Record the threads' scheduling now in effect in each of `states` (after the harness pinned
    the process itself: the pin is every side's)."""
    now = _scheduling_read()
    for state in states:
        state[SCHEDULING] = now


def _environment_read() -> dict[str, str]:
    return dict(os.environ)


def _environment_write(target: dict[str, str]) -> None:
    for name in set(os.environ) - set(target):
        del os.environ[name]
    for name, value in target.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@functools.cache
def entries() -> dict[str, tuple]:
    """name -> (read, write or None) of every piece of state found; found once per process
    (after torch is imported: the zygote preloads it)."""
    found = {
        **_c_pairs(),
        **_c_submodule_pairs(),
        **_backend_properties(),
        **_torch_settings(),
        **blas_threads.controls(),
        **_hook_registries(),
    }
    readable = {}
    for name, (read, write) in found.items():
        try:
            read()
        except Exception:  # not in this build, or not readable here
            continue
        readable[name] = (read, write)
    readable[ENVIRONMENT] = (_environment_read, _environment_write)
    readable[SCHEDULING] = (_scheduling_read, _scheduling_write)
    # last: a default device set or put back above is a function mode of its own
    readable["torch function modes"] = (_function_modes, _set_function_modes)
    readable["torch dispatch modes"] = (_dispatch_modes, _set_dispatch_modes)
    return readable


def capture() -> dict[str, object]:
    """The state now in effect, backend precision knobs included (tens of microseconds)."""
    state: dict[str, object] = {name: read() for name, (read, _) in entries().items()}
    state.update(guards.read_knobs())
    return state


def apply(target: dict[str, object], current: dict[str, object]) -> list[str]:
    """Make `target` the state in effect, `current` being the state now; returns what could not
    be put back (one line each), empty when all of it was. State that cannot be read (glibc's
    malloc parameters) is written every time, to the sandbox's values, for either side."""
    write_malloc_parameters()
    if target == current:
        return []
    guards.apply_knobs({k: target[k] for k in guards.KNOBS}, {k: current[k] for k in guards.KNOBS})
    failed = []
    for name, (_, write) in entries().items():
        if target[name] == current[name]:
            continue
        if write is None:
            failed.append(f"{name} is {_show(current[name])}, was {_show(target[name])}, and cannot be set back")
            continue
        try:
            write(target[name])
        except Exception as exc:
            failed.append(f"{name} could not be set back to {_show(target[name])} ({type(exc).__name__})")
    return failed


def differences(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """Names whose value differs between two captures."""
    return sorted(name for name in before if after.get(name) != before[name])


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
