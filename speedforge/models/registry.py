"""The model registry in a store: versions of a model line, its `champion` alias, gate decisions.

    registry = ModelRegistry(open_store("s3://speedforge/runs/training"), "policy")
    version = registry.register("s3://.../runs/pipeline-7/grpo/final", run_id="pipeline-7", stage="grpo")
    registry.promote(version.version, reason="first model")
    registry.champion()            # -> ModelVersion or None

Everything is an append-only JSON object under `models/<name>/`, never rewritten:

    versions/000001.json             a ModelVersion
    aliases/champion/000001.json     an AliasChange; the highest sequence number is the alias now
    decisions/<time_ns>-<id>.json    a GateDecision (promoted or not, with its figures)
    splits/<data set id>.json        a HeldoutSplit: the held-out tasks fixed for that data set version

Concurrency: a version number or an alias's sequence number is taken by writing its object only
if it is absent (S3 If-None-Match, a hard link locally), so of two writers exactly one gets it and
the other takes the next: no record is lost. An alias change can also name the version it
expects the alias to hold (`expect`): it fails with AliasChanged instead of overwriting a change
it did not see (the gate promotes only over the champion it compared with).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid

from speedforge.errors import UserError
from speedforge.models.records import ALIAS_ACTIONS, AliasChange, GateDecision, HeldoutSplit, ModelVersion
from speedforge.store.base import MissingObjectError, ObjectExistsError, Store

PREFIX = "models"
CHAMPION = "champion"
NUMBER_WIDTH = 6
ATTEMPTS = 20  # taking the next number while other writers take theirs


class RegistryError(UserError):
    """A registry request that cannot be met: an unknown version, alias or model name."""


class AliasChanged(RegistryError):
    """The alias moved since the caller read it; nothing was written."""


def who() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def model_names(store: Store) -> list[str]:
    """The model lines with a version in this store."""
    return sorted(
        {
            key.split("/")[1]
            for key in store.list(f"{PREFIX}/")
            if key.count("/") >= 3 and key.split("/")[2] == "versions"
        }
    )


class ModelRegistry:
    """One model line's versions, aliases and gate decisions in `store` (see the module docstring)."""

    def __init__(self, store: Store, name: str):
        self.store, self.name = store, name
        self.prefix = f"{PREFIX}/{name}"

    def __repr__(self) -> str:
        return f"ModelRegistry({self.where!r})"

    @property
    def where(self) -> str:
        return self.store.describe(self.prefix)

    # -- versions ------------------------------------------------------------------------------

    def register(self, checkpoint: str, files: dict[str, str], **lineage) -> ModelVersion:
        """Register a checkpoint as the next version; `lineage`: the other ModelVersion fields."""
        for _ in range(ATTEMPTS):
            number = max(self._numbers("versions"), default=0) + 1
            version = ModelVersion(
                name=self.name,
                version=number,
                checkpoint=checkpoint,
                files_json=json.dumps(files, sort_keys=True),
                registered_at=time.time(),
                registered_by=who(),
                **lineage,
            )
            try:
                self.store.put_bytes(self._key("versions", number), version.to_json().encode(), if_absent=True)
                return version
            except ObjectExistsError:  # another writer took this number: take the next
                continue
        raise RegistryError(f"could not take a version number in {self.where} after {ATTEMPTS} tries")

    def versions(self) -> list[ModelVersion]:
        """Every version, oldest first."""
        return [self._read(ModelVersion, self._key("versions", n)) for n in sorted(self._numbers("versions"))]

    def version(self, number: int) -> ModelVersion:
        try:
            return self._read(ModelVersion, self._key("versions", number))
        except MissingObjectError:
            known = sorted(self._numbers("versions"))
            raise RegistryError(
                f"model {self.name!r} has no version {number} in {self.store.uri}; versions: "
                f"{', '.join(map(str, known)) or '(none)'}"
            ) from None

    def get(self, selector: str | int) -> ModelVersion:
        """A version by number (3, "3", "v3") or by alias ("champion")."""
        text = str(selector)
        if text.lstrip("v").isdigit():
            return self.version(int(text.lstrip("v")))
        number = self.alias(text)
        if number is None:
            raise RegistryError(
                f"model {self.name!r} has no {text} in {self.store.uri} yet (register a version and "
                "promote it: `speedforge models promote VERSION`)"
            )
        return self.version(number)

    # -- aliases -------------------------------------------------------------------------------

    def history(self, alias: str = CHAMPION) -> list[AliasChange]:
        """Every change of `alias`, oldest first."""
        return [
            self._read(AliasChange, self._key(f"aliases/{alias}", n)) for n in sorted(self._numbers(f"aliases/{alias}"))
        ]

    def alias(self, alias: str = CHAMPION) -> int | None:
        """The version `alias` points at now (None: never set)."""
        numbers = self._numbers(f"aliases/{alias}")
        if not numbers:
            return None
        return self._read(AliasChange, self._key(f"aliases/{alias}", max(numbers))).version

    def champion(self) -> ModelVersion | None:
        number = self.alias(CHAMPION)
        return None if number is None else self.version(number)

    def move(
        self,
        version: int,
        action: str,
        reason: str,
        *,
        alias: str = CHAMPION,
        decision_id: str = "",
        expect: int | None | str = "any",
    ) -> AliasChange:
        """Point `alias` at `version` with a new change record. `expect`: the version the caller saw
        the alias at (None: unset); if it moved since, AliasChanged and nothing is written."""
        if action not in ALIAS_ACTIONS:
            raise ValueError(f"unknown alias action {action!r}")
        self.version(version)  # a RegistryError for a version that does not exist
        for _ in range(ATTEMPTS):
            numbers = self._numbers(f"aliases/{alias}")
            seq = max(numbers, default=0)
            current = self._read(AliasChange, self._key(f"aliases/{alias}", seq)).version if seq else None
            if expect != "any" and current != expect:
                raise AliasChanged(
                    f"{alias} of {self.name!r} is now {_show(current)}, not {_show(expect)} as read: nothing changed"
                )
            change = AliasChange(
                name=self.name,
                alias=alias,
                seq=seq + 1,
                version=version,
                previous=current or 0,
                action=action,
                reason=reason,
                decision_id=decision_id,
                changed_at=time.time(),
                changed_by=who(),
            )
            try:
                self.store.put_bytes(self._key(f"aliases/{alias}", seq + 1), change.to_json().encode(), if_absent=True)
                return change
            except ObjectExistsError:  # a change landed in between: read it and decide again
                continue
        raise RegistryError(f"could not change {alias} in {self.where} after {ATTEMPTS} tries")

    def promote(self, version: int, reason: str, **kwargs) -> AliasChange:
        return self.move(version, "promote", reason, **kwargs)

    def rollback(self, reason: str, to: int | None = None) -> AliasChange:
        """Point the champion back at `to`, or at the champion before the current one (see lineup)."""
        changes = self.history(CHAMPION)
        if not changes:
            raise RegistryError(f"model {self.name!r} has no champion in {self.store.uri}: nothing to roll back")
        current = changes[-1].version
        if to is None:
            lineup = champion_lineup(changes)
            if len(lineup) < 2:
                raise RegistryError(
                    f"champion v{current} of {self.name!r} replaced no earlier champion: name the "
                    "version to roll back to (--to VERSION)"
                )
            to = lineup[-2]
        if to == current:
            raise RegistryError(f"v{to} is the champion already")
        return self.move(to, "rollback", reason, expect=current)

    # -- held-out splits -----------------------------------------------------------------------

    def fix_split(self, dataset_id: str, split_id: str, tasks: tuple[str, ...]) -> HeldoutSplit:
        """The split recorded for data set version `dataset_id`: this one if none was (written only
        if absent, so the first writer's stands), else the recorded one."""
        key = f"{self.prefix}/splits/{dataset_id}.json"
        split = HeldoutSplit(self.name, dataset_id, split_id, tuple(tasks), time.time(), who())
        try:
            self.store.put_bytes(key, split.to_json().encode(), if_absent=True)
            return split
        except ObjectExistsError:
            return self._read(HeldoutSplit, key)

    # -- gate decisions ------------------------------------------------------------------------

    def record_decision(self, decision: GateDecision) -> str:
        key = f"{self.prefix}/decisions/{time.time_ns():020d}-{decision.decision_id}.json"
        self.store.put_bytes(key, decision.to_json().encode(), if_absent=True)
        return key

    def decisions(self) -> list[GateDecision]:
        """Every gate decision, oldest first."""
        return [
            self._read(GateDecision, key)
            for key in self.store.list(f"{self.prefix}/decisions/")
            if key.endswith(".json")
        ]

    @staticmethod
    def new_decision_id() -> str:
        return uuid.uuid4().hex[:12]

    # -- plumbing ------------------------------------------------------------------------------

    def _key(self, folder: str, number: int) -> str:
        return f"{self.prefix}/{folder}/{number:0{NUMBER_WIDTH}d}.json"

    def _numbers(self, folder: str) -> list[int]:
        start = f"{self.prefix}/{folder}/"
        names = (key[len(start) :] for key in self.store.list(start))
        return [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]

    def _read(self, cls, key: str):
        data = self.store.get_bytes(key)
        try:
            return cls.from_json(data.decode())
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise RegistryError(f"{self.store.describe(key)}: not a {cls.__name__} record: {exc}") from None


def champion_lineup(changes: list[AliasChange]) -> list[int]:
    """The champions that a rollback goes back through, oldest first: a promotion adds one, a
    rollback to one of them drops those after it (a rollback to any other version adds it)."""
    lineup: list[int] = []
    for change in changes:
        if change.action == "rollback" and change.version in lineup:
            del lineup[lineup.index(change.version) + 1 :]
        else:
            lineup.append(change.version)
    return lineup


def _show(version: int | None | str) -> str:
    return "unset" if version is None else f"v{version}"
