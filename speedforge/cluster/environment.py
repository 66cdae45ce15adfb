"""What a pool runs on: device name, driver, torch and CUDA versions, probed on the pool itself.

    infos = probe_pools({"H100": pool_config}, run_id="r1", timeout_s=120)   # inside a Ray session

`probe_environment` is a plain function (tested without Ray); `probe_pools` runs it as a Ray
task holding the same resources as one of the pool's bench workers, so it lands on a node of
that pool. It reads versions and asks nvidia-smi; it never runs candidate code and makes no
CUDA context. A pool whose probe cannot run in time gets a record that says so in `note`.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping

from speedforge.cluster.pools import actor_options, worker_need
from speedforge.config import PoolConfig
from speedforge.errors import first_line
from speedforge.records import PoolInfo


def probe_environment(pool: str, device: str, cuda_arch: str = "", run_id: str = "") -> PoolInfo:
    """This process's view of the machine it runs on, as pool `pool` with `device`."""
    import torch

    info = dict(
        pool=pool,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda or "",
        cuda_arch=cuda_arch,
        host=socket.gethostname(),
        run_id=run_id,
        measured_at=time.time(),
    )
    if device == "cpu":
        return PoolInfo(device_name=cpu_model(), **info)
    name, driver, note = nvidia_smi_gpu()
    return PoolInfo(device_name=name, driver=driver, note=note, **info)


def cpu_model() -> str:
    """The CPU's model name (`/proc/cpuinfo`), else what `platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_smi_gpu() -> tuple[str, str, str]:
    """(name, driver version, note) of the first GPU this process may use (CUDA_VISIBLE_DEVICES)."""
    if not shutil.which("nvidia-smi"):
        return "", "", "nvidia-smi not found: GPU name and driver unknown"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    command = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    if visible:
        command += ["-i", visible]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", "", f"nvidia-smi failed: {first_line(exc)}"
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not lines:
        return "", "", f"nvidia-smi failed: {first_line(out.stderr or out.stdout) or f'exit {out.returncode}'}"
    name, _, driver = lines[0].rpartition(",")
    return name.strip(), driver.strip(), ""


def probe_pools(pools: Mapping[str, PoolConfig], run_id: str, timeout_s: float) -> dict[str, PoolInfo]:
    """probe_environment on a node of each pool, as a Ray task with a bench worker's resources
    (call it while no bench worker holds them). Ray must be running."""
    import ray

    remote = ray.remote(probe_environment)
    refs = {
        name: remote.options(**actor_options(worker_need(pool)), max_retries=0).remote(
            name, pool.device, pool.cuda_arch, run_id
        )
        for name, pool in pools.items()
    }
    infos = {}
    for name, ref in refs.items():
        try:
            infos[name] = ray.get(ref, timeout=timeout_s)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            ray.cancel(ref, force=True)
            infos[name] = PoolInfo(
                pool=name,
                cuda_arch=pools[name].cuda_arch,
                run_id=run_id,
                measured_at=time.time(),
                note=f"the environment probe did not run on this pool: {first_line(exc, 200)}",
            )
    return infos
