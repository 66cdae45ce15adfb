"""A Ray head of its own on this machine, as KubeRay runs one: `ray start --head` on 127.0.0.1, its
own ports (every one of them, so other Ray users of the machine never meet it) and its own temp
dir, with the dashboard whose Job Submission API KubeRay's submitter calls. `speedforge pipeline
run-local` submits the train step to one, so the driver runs as on the cluster (RAY_ADDRESS set,
nothing but the store and the job's runtime env reaching it); the tests do too.

    with RayHead(env={...}, resources={"speedforge_cpu_bench": 1}) as head:
        JobSubmissionClient(head.dashboard).submit_job(entrypoint="python -m ...")

The head runs with `--block` in a process group of its own; stopping it ends that group, then any
process left that names this head's temp dir (never `ray stop`, which stops every Ray on the
machine). Its processes get `env` on top of this one's (a pod's secret, a HOME of its own), and
no token authentication unless `env` sets RAY_AUTH_MODE (clients of it: RAY_AUTH_MODE=disabled).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from speedforge.errors import UserError
from speedforge.store.s3server import free_ports

HOST = "127.0.0.1"


WORKER_PORTS = 200  # the head's worker port range: [low, low + WORKER_PORTS]


def worker_range(seed: int, taken: list[int]) -> int:
    """The low end of a worker port range in 20000-39999 that holds none of the `taken` ports (Ray
    refuses to start when a component's port lies in the workers' range)."""
    low = 20000 + seed % 20000
    while any(low <= port <= low + WORKER_PORTS for port in taken):
        low = 20000 + (low - 20000 + WORKER_PORTS + 1) % 20000
    return low


class RayHead:
    """`ray start --head` for the body of a `with` (see the module docstring)."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        resources: dict[str, float] | None = None,
        num_cpus: int = 2,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.env, self.resources, self.num_cpus, self.start_timeout_s = (
            env or {},
            resources or {},
            num_cpus,
            start_timeout_s,
        )
        self.process: subprocess.Popen | None = None
        self.temp_dir = ""  # short: Ray's socket paths must stay under 108 characters

    def __enter__(self) -> "RayHead":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        gcs, dashboard, client, node, objects, metrics, agent, agent_grpc, runtime_env, workers = free_ports(10)
        self.gcs, self.dashboard = f"{HOST}:{gcs}", f"http://{HOST}:{dashboard}"
        self.temp_dir = tempfile.mkdtemp(prefix="sfray-", dir="/tmp")
        low = worker_range(workers, [gcs, dashboard, client, node, objects, metrics, agent, agent_grpc, runtime_env])
        ray = Path(sys.executable).parent / "ray"
        ray = str(ray) if ray.exists() else (shutil.which("ray") or "ray")
        command = [
            ray,
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            f"--node-ip-address={HOST}",
            f"--port={gcs}",
            "--include-dashboard=true",
            f"--dashboard-host={HOST}",
            f"--dashboard-port={dashboard}",
            f"--ray-client-server-port={client}",
            f"--node-manager-port={node}",
            f"--object-manager-port={objects}",
            f"--metrics-export-port={metrics}",
            f"--dashboard-agent-listen-port={agent}",
            f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--runtime-env-agent-port={runtime_env}",
            f"--min-worker-port={low}",
            f"--max-worker-port={low + WORKER_PORTS}",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={self.num_cpus}",
            f"--resources={json.dumps(self.resources)}",
        ]
        # no token authentication unless `env` asks for it: Ray turns it on by itself when it finds a token in
        # ~/.ray/auth_token (left there by any earlier Ray use of this account), and a KubeRay cluster has none
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", **self.env, "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        # the head's PATH finds this environment's python first, as the image's does
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        self.log = open(Path(self.temp_dir) / "ray-start.log", "w")
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.dashboard}/api/version", timeout=2) as reply:
                    reply.read()
                with urllib.request.urlopen(f"{self.dashboard}/api/jobs/", timeout=2) as reply:
                    reply.read()
                return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = " | ".join(self.output().strip().splitlines()[-3:])[-600:]
                self.stop()
                raise UserError(f"the local Ray head did not answer within {self.start_timeout_s:g} s: {tail}")
            time.sleep(0.5)

    def output(self) -> str:
        log = Path(self.temp_dir) / "ray-start.log"
        return log.read_text(errors="replace") if log.is_file() else ""

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        for pid in self._leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process = None
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _leftovers(self) -> list[int]:
        """Processes still alive that name this head's temp dir (Ray's own, started in other groups)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if self.temp_dir.encode() in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found
