"""A Ray session: joined or started on entry, shut down on exit when this session started it.

    with ray_session(args.address, config.service):
        with EvaluationService(config) as service:
            ...

Every flow that evaluates on the service opens Ray the same way: `connect_ray` (probe the
address first, so a cluster that does not answer fails within connect_timeout_s in one line;
SIGTERM raises again after ray.init took it over), and Ray is shut down on the way out, also on
an error or an interrupt, unless it was already running in this process (a caller's own Ray is
left as it was).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from speedforge.cluster.pools import local_ray_resources
from speedforge.config import ServiceConfig
from speedforge.errors import Terminated, UserError, first_line, interrupt_on_sigterm
from speedforge.extras import require


_JOINED = ""  # the address of the cluster this process joined ("" for a Ray it started itself)


def joined_address() -> str:
    """The address of the Ray cluster this process joined by address or $RAY_ADDRESS; "" when it
    started Ray itself (or has not connected)."""
    return _JOINED


@contextlib.contextmanager
def ray_session(address: str | None, config: ServiceConfig) -> Iterator[None]:
    """Join the Ray cluster at `address` (None: start a local one) for the body of the `with`.

    A local Ray's processes (its GCS, raylet, dashboard and agents, and the workers) do not
    outlive the session: a guard process watches them, and when the session ends, or this
    process dies without ending it (SIGKILL), it kills those still running after GUARD_GRACE_S.
    """
    # the guard starts before Ray does, so that it has seen each process Ray starts by the time
    # this process can die (Ray's agents outlive a killed driver by a minute or more)
    guard = _start_guard() if _starts_local_ray(address) else None
    started = False
    try:
        started = connect_ray(address, config)
        yield
    finally:
        if started:
            import ray

            ray.shutdown()
        if guard is not None:
            guard.stdin.close()  # the guard's cue (the kernel gives the same one if this process dies)
            try:
                guard.wait(timeout=GUARD_GRACE_S + 30)
            except subprocess.TimeoutExpired:
                guard.kill()


def _address_to_join(address: str | None) -> str | None:
    """`address`, else $RAY_ADDRESS (a job's driver: join the cluster that started it); None or ""
    when this process starts a Ray of its own."""
    return address or os.environ.get(RAY_ADDRESS_ENV) or address


def _starts_local_ray(address: str | None) -> bool:
    """Whether connect_ray(address, ...) starts a Ray of this process's own."""
    if _address_to_join(address):
        return False
    try:
        import ray
    except ImportError:
        return False  # connect_ray says what is missing
    return not ray.is_initialized()


def connect_ray(address: str | None, config: ServiceConfig) -> bool:
    """Join the Ray cluster at `address`, or start a local one with the CPU bench slots.

    With no `address` under $RAY_ADDRESS (a driver that Ray's job submission started: KubeRay's
    submitter, `ray job submit`, the `ray` train mode), the cluster that started it is joined as
    it is: Ray refuses `resources` for a cluster that exists, and that cluster declares its own.
    True when this call started or joined Ray (the caller shuts it down), False when Ray was
    already initialized in this process.
    """
    require("cluster", "ray", purpose="the Ray evaluation service")
    import ray

    if ray.is_initialized():
        return False
    options = dict(logging_level="WARNING", log_to_driver=False)
    address = _address_to_join(address)
    if address:
        probe_ray(address, config.connect_timeout_s)
    global _JOINED
    _JOINED = address or ""
    try:
        if address:
            ray.init(address=address, **options)
        else:
            # workers at niceness 0 (Ray's default is 15), so the build workers' steps below the
            # bench workers have room (see ServiceConfig.build_nice_first)
            # address="local": a new Ray of this process's own, never one that `ray start` left
            # running on this machine (ray.init() with no address joins that, and refuses resources)
            ray.init(
                address="local",
                resources=local_ray_resources(config),
                include_dashboard=False,
                _system_config={"worker_niceness": 0},
                **options,
            )
    except (ConnectionError, SystemExit) as exc:  # Ray exits (SystemExit) when the GCS never answers
        if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:  # ray.init's own SIGTERM handler
            ray.shutdown()  # what it had started
            raise Terminated() from None
        raise UserError(
            f"cannot join the Ray cluster at {address}: {first_line(exc) or type(exc).__name__} (a "
            "cluster with token authentication needs its token in RAY_AUTH_TOKEN or "
            "RAY_AUTH_TOKEN_PATH)"
        ) from None
    interrupt_on_sigterm()  # ray.init replaced SIGTERM's handler with one that dumps a C++ stack
    return True


GUARD_GRACE_S = 5.0  # what a local Ray's processes get to end by themselves before the guard kills them
# The guard of a local Ray: it notes the Ray processes below this one (by command line: Ray's
# executables and scripts, and its workers, "ray::..."), every 0.1 s while new ones appear and
# every second once none have for a while; at the end of its stdin (the session ended, or this
# process died) it notes those still below this one or below a Ray process it saw, and the
# workers of a raylet it saw (by their RAY_RAYLET_PID: a worker started just before this process
# died is no longer below it), waits GUARD_GRACE_S for them to end, then kills the rest.
GUARD = """
import os, select, sys
import psutil
owner, grace = psutil.Process(int(sys.argv[1])), float(sys.argv[2])
def is_ray(p):
    try:
        return p.pid != os.getpid() and (p.name().startswith("ray::") or "/ray/" in " ".join(p.cmdline()))
    except psutil.Error:
        return False
def ray_below(roots):
    found = []
    for root in roots:
        try:
            found += root.children(recursive=True)
        except psutil.Error:
            pass
    return {p.pid: p for p in found if is_ray(p)}
seen, interval = {}, 0.1
while True:
    new = {pid: p for pid, p in ray_below([owner]).items() if pid not in seen}
    seen.update(new)
    interval = 0.1 if new else min(1.0, interval * 1.25)
    ready, _, _ = select.select([0], [], [], interval)
    if ready and not os.read(0, 4096):
        break
seen.update(ray_below([owner, *seen.values()]))
raylets = {}
for p in list(seen.values()):
    try:
        if p.name() == "raylet":
            raylets[p.pid] = p.create_time()
    except psutil.Error:
        pass
for p in psutil.process_iter(["environ", "create_time"]):
    try:
        raylet = int((p.info["environ"] or {}).get("RAY_RAYLET_PID", 0))
        if raylet in raylets and p.info["create_time"] >= raylets[raylet]:
            seen[p.pid] = p
    except ValueError:
        pass
_, alive = psutil.wait_procs(list(seen.values()), timeout=grace)
for p in alive:
    try:
        p.kill()  # psutil checks it is still the process it saw (not a reused id)
    except psutil.Error:
        pass
"""


def _start_guard() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-I", "-c", GUARD, str(os.getpid()), str(GUARD_GRACE_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # Ctrl-C on the terminal is not for it


RAY_ADDRESS_ENV = "RAY_ADDRESS"  # set by Ray for a job's driver, and by users for `ray.init()`
RAY_ADDRESS_HELP = "give the GCS address host:6379, or ray://head:10001 for the Ray Client"
PROBE = """
import sys, ray
try:
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
except BaseException as exc:
    print(f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300], flush=True)
    sys.exit(1)
ray.shutdown()
"""


def probe_ray(address: str, timeout_s: float) -> None:
    """Fail within `timeout_s`, with one line, unless a Ray cluster answers at `address`.

    Ray itself waits minutes on an address that does not answer, printing warnings, so the
    port is tried first and then a whole join, in a child process that is killed at the deadline.
    """
    import subprocess

    deadline = time.monotonic() + timeout_s
    client = address.startswith("ray://")
    if client:
        try:
            import grpc  # noqa: F401  (the Ray Client's transport, from the ray[client] extra)
        except ImportError:
            import ray

            raise UserError(
                f"{address}: ray:// addresses need the Ray Client: pip install "
                f"'ray[client]=={ray.__version__}'; or give the GCS address host:6379"
            ) from None
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if address != "auto" and not (sep and host and port.isdigit()):
        raise UserError(f"invalid Ray address {address!r}: {RAY_ADDRESS_HELP}, or auto")
    if sep:
        import socket

        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
        except OSError as exc:
            raise UserError(
                f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} (within "
                f"{timeout_s:g} s, service.connect_timeout_s); is it up? {RAY_ADDRESS_HELP}"
            ) from None
    try:
        child = subprocess.run(
            [sys.executable, "-c", PROBE, address],
            capture_output=True,
            text=True,
            timeout=max(1.0, deadline - time.monotonic()),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"the Ray cluster at {address} did not answer within {timeout_s:g} s "
            f"(service.connect_timeout_s): is a Ray cluster listening there? {RAY_ADDRESS_HELP}"
        ) from None
    if child.returncode != 0:
        reason = (child.stdout.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
        raise UserError(
            f"cannot join the Ray cluster at {address}: {reason} (a cluster with token authentication "
            "needs its token in RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH)"
        )
