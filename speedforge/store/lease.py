"""A lease in a store: one writer at a time for a table (one sweep per results table).

    with Lease.acquire(store, "results", ttl_s=60.0) as lease:   # LeaseHeldError if taken
        ...                                                       # renewed in the background

A lease is a chain of small JSON objects, `leases/<name>/<generation>.json`; the highest
generation is the current one. Taking a lease writes the next generation with if_absent (S3
If-None-Match, a hard link locally), so of two runs that race for it exactly one wins. Only its
owner rewrites a generation: to renew it (a new `expires_at`) and to release it at the end.

- A live lease (not released, `expires_at` still ahead) is never taken, not even with force:
  two writers would skew each other's timings and write every pair twice.
- An expired one (its owner died, or lost the store for longer than the lease) is taken only
  with force, so a person decides that its owner is really gone.
- A lease whose owner is known to be gone is taken at once, live or not, with a line on stderr:
  its owner was a process of this host that no longer exists, or this very process, which could
  not release it (the store was down) and has no use for it any more.
- An owner that finds a later generation than its own has lost the lease (it was taken after it
  expired); `lost` says so, and the owner stops writing.

Times are wall-clock seconds (time.time()), so the hosts that share a store need clocks that
agree to within a small part of the lease (NTP does).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
import threading
import time
import uuid
from typing import Any

from speedforge.store.base import ObjectExistsError, Store, StoreError

PREFIX = "leases"
_UNRELEASED: set[str] = set()  # tokens of leases this process gave up but could not write as released
GENERATION = re.compile(r"^(\d{12})\.json$")


class LeaseHeldError(StoreError):
    """Another run holds the lease (or held it and its lease expired without a release)."""


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """One generation of a lease, as stored."""

    owner: str  # host:pid
    token: str  # unique per acquisition
    started_at: float  # wall-clock seconds
    expires_at: float
    released: bool = False

    def live(self, now: float) -> bool:
        return not self.released and self.expires_at > now

    def owner_gone(self) -> bool:
        """Its owner is known to be gone: a process of this host that no longer exists, or a
        lease this process held and could not release."""
        if self.token in _UNRELEASED:
            return True
        host, _, pid = self.owner.rpartition(":")
        if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except OSError:  # alive, someone else's
            return False
        return False

    def describe(self, now: float) -> str:
        expiry = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.expires_at))
        started = time.strftime("%H:%M:%S", time.localtime(self.started_at))
        if self.expires_at > now:
            return f"{self.owner} (since {started}); its lease expires at {expiry} (in {self.expires_at - now:.0f} s)"
        return f"{self.owner} (since {started}); its lease expired at {expiry} ({now - self.expires_at:.0f} s ago)"


class Lease:
    """A held lease; renew() keeps it, release() gives it back. See the module docstring."""

    def __init__(self, store: Store, name: str, generation: int, record: LeaseRecord, ttl_s: float) -> None:
        self.store = store
        self.name = name
        self.generation = generation
        self.record = record
        self.ttl_s = ttl_s
        self.lost: str | None = None  # why the lease was lost, once it is
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def key(self) -> str:
        return _key(self.name, self.generation)

    # -- taking it --------------------------------------------------------------------------

    @classmethod
    def acquire(cls, store: Store, name: str, ttl_s: float, force: bool = False) -> "Lease":
        """Take the lease `name` of `store`, or raise LeaseHeldError naming its holder."""
        now = time.time()
        generation, current = current_lease(store, name)
        where = f"{store.uri} ({name})"
        if current is not None and not current.released and current.owner_gone():
            print(
                f"speedforge: taking over the lease of {current.owner} on {where}: that process is gone",
                file=sys.stderr,
                flush=True,
            )
            current = dataclasses.replace(current, released=True)
        if current is not None and current.live(now):
            raise LeaseHeldError(
                f"another run is writing to {where}: {current.describe(now)}; wait for it to end "
                "(--force does not take a live lease)"
            )
        if current is not None and not current.released and not force:
            raise LeaseHeldError(
                f"a run that writes to {where} stopped without releasing its lease: "
                f"{current.describe(now)}; if that run is gone, rerun with --force to take "
                "the lease over"
            )
        if current is not None and not current.released:
            print(
                f"speedforge: taking over the expired lease of {current.owner} on {where}", file=sys.stderr, flush=True
            )
        record = LeaseRecord(
            owner=f"{socket.gethostname()}:{os.getpid()}",
            token=uuid.uuid4().hex,
            started_at=now,
            expires_at=now + ttl_s,
        )
        lease = cls(store, name, generation + 1, record, ttl_s)
        try:
            store.put_bytes(lease.key, _encode(record), if_absent=True)
        except ObjectExistsError:
            _, winner = current_lease(store, name)
            if winner is None or winner.token != record.token:  # not our own write answered twice
                holder = winner.describe(time.time()) if winner else "another run"
                raise LeaseHeldError(f"another run took the lease on {where} first: {holder}") from None
        for old in range(max(1, generation - 2), generation):  # keep the chain short; best effort
            try:
                store.delete(_key(name, old))
            except StoreError:
                break
        return lease

    # -- keeping it -------------------------------------------------------------------------

    def renew(self) -> bool:
        """Push the expiry ttl_s ahead (one try, no waiting); False when it could not be written."""
        if self.lost:
            return False
        try:
            generation, current = current_lease(self.store, self.name)
            if generation != self.generation or current is None or current.token != self.record.token:
                self.lost = f"{current.owner if current else 'another run'} took it over after it expired"
                return False
            record = dataclasses.replace(self.record, expires_at=time.time() + self.ttl_s)
            self.store.put_bytes(self.key, _encode(record), retry_s=0)
            self.record = record
            return True
        except StoreError:
            return False

    def start_heartbeat(self) -> "Lease":
        """Renew every ttl_s / 4 on a background thread until release()."""

        def beat() -> None:
            while not self._stop.wait(self.ttl_s / 4):
                self.renew()

        self._thread = threading.Thread(target=beat, name=f"lease-{self.name}", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        """Give the lease back (one try: a store that is down leaves it to expire, said on stderr)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self.lost:
            return
        try:
            self.store.put_bytes(self.key, _encode(dataclasses.replace(self.record, released=True)), retry_s=0)
        except StoreError as exc:
            _UNRELEASED.add(self.record.token)
            expiry = time.strftime("%H:%M:%S", time.localtime(self.record.expires_at))
            print(
                f"speedforge: could not release the lease on {self.store.uri} ({exc}); it expires at {expiry}; "
                "a rerun from this host takes it over, from another host with --force after that",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> "Lease":
        return self.start_heartbeat()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def current_lease(store: Store, name: str) -> tuple[int, LeaseRecord | None]:
    """The highest generation of lease `name` and its record (0, None when there is none)."""
    prefix = f"{PREFIX}/{name}/"
    generations = [int(m.group(1)) for k in store.list(prefix) if (m := GENERATION.match(k[len(prefix) :]))]
    if not generations:
        return 0, None
    generation = max(generations)
    data = store.get_bytes(_key(name, generation))
    try:
        fields = json.loads(data)
        return generation, LeaseRecord(**fields)
    except (ValueError, TypeError) as exc:
        raise StoreError(
            f"{store.describe(_key(name, generation))}: not a lease record ({exc}); delete it "
            "if no run is writing there"
        ) from None


def _key(name: str, generation: int) -> str:
    return f"{PREFIX}/{name}/{generation:012d}.json"


def _encode(record: LeaseRecord) -> bytes:
    return json.dumps(dataclasses.asdict(record), sort_keys=True).encode()
