"""The reference's fingerprint: what its module is, taken after each of its calls and checked before
the next (speedforge.evaluator.harness, `_Harness.switch`).

Between two calls of the reference only the candidate and the harness run, so whatever changed in
the reference's module then was changed by the candidate, however it reached it (a frame walked
up to the harness's locals, a hook that saw the module, gc): a scale set to zero, weights zeroed,
a forward or a hook swapped in. The reference's own changes (a hidden state reassigned in forward,
batch-norm running statistics) happen during its calls, and each call's fingerprint includes them.

Between the timed calls the fingerprint is the structure alone (`take(..., values=False)` reads no
tensor data): summing the reference's weights just before its call would warm the caches for it
(identical work on a 4 MB weight read 0.79x on the CPU). The sums of the tensors that the
reference's own calls never changed (`unchanged`) are checked once the timed calls end; a timed
call's outputs are compared with the reference's besides.

A fingerprint is, for every submodule: its class and the functions of its class and bases (below
nn.Module, which the guards watch), every attribute of its instance (a tensor by where it lives, its
shape, strides, dtype and version counter; a dict such as `_parameters`, `_modules` or a hook dict
by its entries; a number or string by value; anything else by identity), and for every tensor the
sum of its elements' bit patterns as integers (a write through `.data` bumps no version counter):
exact, whatever order a reduction takes, NaN included, one pass over each tensor. All sums are
read in one transfer per device.
"""

from __future__ import annotations

import collections

_SCALAR = (bool, int, float, complex, str, bytes, type(None))
_SCALAR_TYPES = frozenset(_SCALAR)  # the exact types, found by one lookup (most of a module's attributes)
_CONTAINERS = (dict, list, tuple)
_CONTAINER_TYPES = frozenset({dict, list, tuple, collections.OrderedDict})  # exact types: one lookup
_BITS: dict = {}  # element size -> the integer dtype its bit patterns are summed as (filled on first use)


def _describe(torch, value, tensors: list, depth: int = 0) -> object:
    """One attribute's description. A module holds mostly flags, numbers and empty hook dicts, and a
    deep model hundreds of modules, each described before and after every timed call of the
    reference: the common cases come first, each by one type lookup (DenseNet201's 526 modules took
    19-42 ms a fingerprint on the 2-core box in 14,000 calls of this function; docs/benchmarks/overhead.md)."""
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return value
    if kind in _CONTAINER_TYPES:  # a module's dicts (`_parameters`, `_modules`, hooks), by type alone
        return _contents(torch, kind, value, tensors, depth)
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        try:
            version = value._version
        except RuntimeError:  # an inference tensor keeps none
            version = None
        strided = value.layout == torch.strided
        return (
            "tensor",
            value.data_ptr() if strided else id(value),
            tuple(value.shape),
            value.stride() if strided else (),
            str(value.dtype),
            str(value.device),
            version,
        )
    if isinstance(value, _SCALAR):  # a subclass of a scalar type (an IntEnum, a bool-like flag)
        return value
    if isinstance(value, torch.nn.Module):
        return ("module", id(value))
    if isinstance(value, _CONTAINERS):
        return _contents(torch, kind, value, tensors, depth)
    return (kind.__name__, id(value))


def _contents(torch, kind: type, value, tensors: list, depth: int) -> tuple:
    """A dict, list or tuple by its entries, two levels deep; deeper, by identity."""
    if depth >= 2:
        return (kind.__name__, id(value))
    if kind in _CONTAINER_TYPES and not value:  # an empty hook dict, most of them (a subclass's len is not asked)
        return (kind.__name__, id(value), ())
    items = value.items() if isinstance(value, dict) else enumerate(value)
    return (
        kind.__name__,
        id(value),
        tuple(
            (
                key if type(key) in _SCALAR_TYPES or isinstance(key, _SCALAR) else id(key),
                _describe(torch, item, tensors, depth + 1),
            )
            for key, item in items
        ),
    )


# Entries Python creates in a class's namespace when they are first read, which behaviour never
# depends on: reading `cls.__annotations__` (torch.jit.script does, for every submodule's class)
# adds an empty dict to a class that had none, so an honest candidate that scripts its own
# nn.Conv2d layers would otherwise read as having changed the reference's nn.Conv2d.
_LAZY_CLASS_ENTRIES = frozenset({"__annotations__", "__annotate__", "__annotate_func__", "__annotations_cache__"})


def _class_functions(torch, cls: type) -> tuple:
    found = []
    for base in cls.__mro__:
        if base is torch.nn.Module or base is object:
            break
        found.append(
            (
                id(base),
                tuple((name, id(value)) for name, value in vars(base).items() if name not in _LAZY_CLASS_ENTRIES),
            )
        )
    return tuple(found)


def take(torch, model, values: bool = True) -> tuple[tuple, dict | None]:
    """(the module's structure, the sums of its tensors' bit patterns by tensor, or None when
    `values` is false: the structure alone reads no tensor's data, so it leaves the caches as they
    were). Each class's functions are read once a fingerprint, however many submodules share it."""
    if not _BITS:
        _BITS.update({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64})
    tensors: list = []
    structure = []
    classes: dict = {}  # id(class) -> its functions, within this fingerprint
    for name, module in model.named_modules(remove_duplicate=False):
        cls = type(module)
        functions = classes.get(id(cls))
        if functions is None:
            functions = classes[id(cls)] = _class_functions(torch, cls)
        attributes = tuple((key, _describe(torch, value, tensors)) for key, value in vars(module).items())
        structure.append((name, id(cls), functions, attributes))
    if not values:
        return tuple(structure), None
    by_device: dict = {}  # device -> ([keys], [sums]): a model may keep tensors on several (a CPU h0 beside CUDA weights)
    seen = set()
    for t in tensors:
        if t.layout != torch.strided or t.numel() == 0:
            continue
        key = (t.data_ptr(), tuple(t.shape), t.stride(), str(t.dtype), str(t.device))
        if key in seen:
            continue
        seen.add(key)
        d = t.detach()
        d = d.view(torch.uint8) if d.dtype == torch.bool else torch.view_as_real(d) if d.element_size() > 8 else d
        keys, sums = by_device.setdefault(t.device, ([], []))
        keys.append(key)
        sums.append(d.view(_BITS[d.element_size()]).sum(dtype=torch.int64))  # wraps around: still exact
    found: dict = {}
    for keys, sums in by_device.values():  # one transfer per device
        found.update(zip(keys, torch.stack(sums).tolist()))
    return tuple(structure), found


def unchanged(values: dict, now: dict) -> dict:
    """The entries of `values` that `now` holds with the same sum."""
    return {key: value for key, value in values.items() if now.get(key) == value}


def changed(before: tuple[tuple, dict | None], after: tuple[tuple, dict | None]) -> str:
    """What differs between two fingerprints of one module, one line; "" when nothing does."""
    if before[0] != after[0]:
        for old, new in zip(before[0], after[0]):
            if old != new:
                what = "class" if old[1:3] != new[1:3] else "attributes"
                keys = sorted(
                    {k for k, v in old[3]} ^ {k for k, v in new[3]}
                    | {k for (k, v), (k2, v2) in zip(old[3], new[3]) if k == k2 and v != v2}
                )
                name = old[0] or "the model"
                return f"{name}: its {what} changed" + (f" ({', '.join(map(str, keys[:4]))})" if keys else "")
        return "its submodules changed"
    if before[1] is None or after[1] is None:  # a structure alone
        return ""
    return moved(before[1], after[1])


def moved(values: dict, now: dict) -> str:
    """ "the values of its tensor i changed" for the first tensor of `values` that `now` holds
    with another sum, "" for none (a tensor `now` lacks left the structure, which says so)."""
    for i, (key, value) in enumerate(values.items()):
        if key in now and now[key] != value:
            return f"the values of its tensor {i} changed"
    return ""
