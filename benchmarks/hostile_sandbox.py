"""Hostile candidates against the sandbox's shared memory and disk, at full size, through `speedforge eval` as a user runs it, with the
default config (its own cache folder only): what status each gets and whether the host is left clean.

    python benchmarks/hostile_sandbox.py            # about a minute and 3 GiB of disk, briefly

- shm_1g: writes 1 GiB to /dev/shm at import, then is an honest candidate.
- disk_5x1g: writes 5 files of 1 GiB to its folder, then is an honest candidate.
- kill_during_1g: writes a 1 GiB file without end; `eval` is SIGKILLed once 256 MiB are written.

"Host clean" means: no file of the candidate's in the host's /dev/shm, no job-* folder left in
the cache's tmp/, and no process of the run left. Shmem (from /proc/meminfo) before and after is
printed too; other work on the host moves it, so it is shown, not judged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

SPEEDFORGE = str(Path(sys.executable).with_name("speedforge"))
HONEST = """

class ModelNew(nn.Module):
    def __init__(self, beta):
        super().__init__()
        self.beta = beta

    def forward(self, x):
        return x * torch.sigmoid(self.beta * x)
"""
CASES = {
    "shm_1g": """import torch
import torch.nn as nn

with open('/dev/shm/{name}', 'wb') as f:
    for _ in range(64):
        f.write(b'x' * (16 << 20))
"""
    + HONEST,
    "disk_5x1g": """import torch
import torch.nn as nn

for i in range(5):
    with open(f'fill{{i}}.bin', 'wb') as f:
        for _ in range(64):
            f.write(b'x' * (16 << 20))
"""
    + HONEST,
    "kill_during_1g": """import torch
import torch.nn as nn

with open('big.bin', 'wb') as f:
    while True:
        for _ in range(64):
            f.write(b'x' * (16 << 20))
        f.seek(0)
"""
    + HONEST,
}


def shmem_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) // 1024
    return -1


def run_case(case: str, root: Path) -> dict:
    name = f"speedforge-hostile-{uuid.uuid4().hex[:8]}"
    candidate = root / f"{case}.py"
    candidate.write_text(CASES[case].format(name=name))
    config = root / "config.yaml"
    config.write_text(json.dumps({"evaluator": {"cache_dir": str(root / "cache")}}))
    command = [
        SPEEDFORGE,
        "--config",
        str(config),
        "eval",
        "--task",
        "cpp/silu_scale",
        "--candidate",
        str(candidate),
        "--json",
    ]
    shm_before = shmem_mib()
    start = time.monotonic()
    cli = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tree: list[psutil.Process] = []
    if case == "kill_during_1g":
        scratch = root / "cache" / "tmp"
        while cli.poll() is None and not any(p.stat().st_size > 256 << 20 for p in scratch.glob("*/big.bin")):
            time.sleep(0.05)
        tree = psutil.Process(cli.pid).children(recursive=True)
        cli.send_signal(signal.SIGKILL)
        cli.communicate()
        status, reason = "(eval killed)", f"SIGKILL while writing; exit {cli.returncode}"
    else:
        out, err = cli.communicate(timeout=900)
        result = json.loads(out) if out.strip() else {"status": "?", "reason": err.strip()[-200:]}
        status, reason = result["status"], result["reason"]
    wall_s = time.monotonic() - start
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        any((root / "cache" / "tmp").glob("job-*"))
        or any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree)
    ):
        time.sleep(0.1)
    left = sorted(p.name for p in (root / "cache" / "tmp").glob("job-*"))
    alive = [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    on_host = os.path.exists(f"/dev/shm/{name}")
    return {
        "case": case,
        "status": status,
        "reason": reason,
        "wall_s": round(wall_s, 1),
        "shm_file_on_host": on_host,
        "scratch_left": left,
        "processes_left": alive,
        "host_clean": not (on_host or left or alive),
        "shmem_mib_before": shm_before,
        "shmem_mib_after": shmem_mib(),
    }


def main() -> int:
    rows = []
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix=f"hostile-{case}-") as folder:
            rows.append(run_case(case, Path(folder)))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'case':16} {'status':14} {'host clean':10} {'Shmem MiB before/after':22} reason")
    for r in rows:
        print(
            f"{r['case']:16} {r['status']:14} {str(r['host_clean']):10} "
            f"{r['shmem_mib_before']:>6} / {r['shmem_mib_after']:<13} {r['reason'][:90]}"
        )
    return 0 if all(r["host_clean"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
