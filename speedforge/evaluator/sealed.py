"""Typed records of the sandboxed harness that the candidate's code cannot rewrite.

The harness shares its process with the candidate, so a record read by attribute is only as
trustworthy as its class: a candidate that reached the class (sys.modules, which torch hands on as
torch.sys) could put a property over a field, a `__getattribute__` over all of them, or a
`to_dict` of its own, and the timer would read, or send, the candidate's figures. A plain dict is
immune to that, a record class is not unless it is built so:

- `Sealed`: the metaclass of such a record. Once `seal`ed, setting or deleting any attribute of the
  class raises, as on the evaluator's sealed modules (speedforge.evaluator.guards.seal_harness).
  What is left (type.__setattr__ called on the class) the screen names, and the guards compare
  every entry of a sealed class, its fields' descriptors included, after every phase;
- `readers` / `values`: a record into a plain dict through its slots' own descriptors, taken when
  the record's module is imported, before any candidate code: nothing a candidate rebinds later
  (dataclasses.asdict or fields, a method or a field of the class, a builtin) takes part.

A sealed record is a frozen dataclass with slots (no instance dict to read around its fields):

    @sealed.seal
    @dataclasses.dataclass(frozen=True, slots=True)
    class Round(metaclass=sealed.Sealed): ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

SEAL = "__sealed__"  # the entry that marks a class sealed; set once, by `seal`
_type_setattr, _type_delattr, _vars = type.__setattr__, type.__delattr__, vars  # taken before any candidate code


class Sealed(type):
    """A class that refuses changes to itself once sealed (`seal`)."""

    def __setattr__(cls, name: str, value) -> None:
        if SEAL in _vars(cls):
            raise AttributeError(f"{cls.__qualname__}.{name} is the evaluator's and cannot be set")
        _type_setattr(cls, name, value)

    def __delattr__(cls, name: str) -> None:
        if SEAL in _vars(cls):
            raise AttributeError(f"{cls.__qualname__}.{name} is the evaluator's and cannot be deleted")
        _type_delattr(cls, name)


def seal(cls: type) -> type:
    """Seal `cls`, a frozen dataclass with slots made with metaclass Sealed: from now on its
    attributes can be neither set nor deleted."""
    if not isinstance(cls, Sealed) or "__slots__" not in vars(cls) or not cls.__dataclass_params__.frozen:
        raise TypeError(f"{cls.__qualname__}: a sealed record is a frozen dataclass with slots, metaclass Sealed")
    _type_setattr(cls, SEAL, True)
    return cls


Readers = tuple[tuple[str, Callable[[object], object]], ...]


def readers(cls: type) -> Readers:
    """(name, reader) of every field of the sealed record class `cls`, in order: each reader is the
    `__get__` of the field's slot descriptor, bound now, so a later change to the class (a
    property put over the field) does not change what it reads."""
    return tuple((field.name, vars(cls)[field.name].__get__) for field in dataclasses.fields(cls))


def values(record: object, taken: Readers) -> dict[str, object]:
    """`record`'s fields as a plain dict, read through readers `taken` (`readers`). A record of
    another class raises TypeError (a slot's descriptor reads only its own class's instances)."""
    return {name: read(record) for name, read in taken}
