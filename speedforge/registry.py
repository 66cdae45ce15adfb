"""Plug-ins registered by name: one small helper for every registry (reward functions, batch
evaluations, training stages, generation backends, task importers), one error for a name
nobody registered.

    REWARDS = Registry("reward")

    @REWARDS.register("cudal1")
    def cudal1_reward(samples, config): ...

    REWARDS.get("cudal1")       # the function; UnknownName naming the known ones otherwise
    REWARDS.names()             # sorted

A registry lives in the module of what it registers; only this helper is shared, so it sits at
the bottom of the layers (it imports nothing but the errors).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from speedforge.errors import UserError

T = TypeVar("T")


class UnknownName(UserError, KeyError):
    """A name no plug-in registered: one line naming the known ones."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Named plug-ins of one kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # in the error: "unknown <kind> 'x'; known: ..."
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator that registers what it decorates under `name` (a name is registered once)."""

        def decorate(item: T) -> T:
            if name in self._items and self._items[name] is not item:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = item
            return item

        return decorate

    def get(self, name: str) -> T:
        if name not in self._items:
            raise UnknownName(f"unknown {self.kind} {name!r}; known: {', '.join(self.names()) or '(none)'}")
        return self._items[name]

    def check(self, names, where: str = "") -> None:
        """UnknownName for the first of `names` that is not registered (prefixed with `where`)."""
        for name in names:
            if name not in self._items:
                prefix = f"{where}: " if where else ""
                raise UnknownName(f"{prefix}unknown {self.kind} {name!r}; known: {', '.join(self.names()) or '(none)'}")

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
