"""The sandbox's heap reuses freed tensor memory, so a timed call does not pay for page faults
that only some processes would see (with glibc's defaults the same cpp kernel measured
0.42x-1.43x over 6 sandboxes, glibc faulting fresh pages in on every large allocation)."""

from __future__ import annotations

import subprocess
import sys

from sandbox_probes import probe

from speedforge.evaluator import sandbox

FAULT_PROBE = """
import resource, torch
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for size_mib in (8, 64, 200):
    numel = (size_mib << 20) // 4
    for _ in range(3):
        x = torch.empty(numel); x.fill_(1.0); y = torch.empty(16); del x, y
    before = faults()
    for _ in range(10):
        x = torch.empty(numel); x.fill_(1.0); y = torch.empty(16); del x, y
    print(size_mib, (faults() - before) / 10, numel // 1024)
"""


def test_a_freed_tensor_block_is_reused_without_page_faults_in_the_sandbox_environment():
    env = sandbox.scrubbed_env()
    assert env["GLIBC_TUNABLES"] == sandbox.MALLOC_TUNABLES
    out = subprocess.run([sys.executable, "-c", FAULT_PROBE], env=env, capture_output=True, text=True, check=True)
    for line in out.stdout.split("\n"):
        if line:
            size_mib, faults_per_alloc, pages = line.split()
            # a block faulted in afresh costs one fault per 4 KiB page; a reused one, none
            assert float(faults_per_alloc) < 0.01 * int(pages), (
                f"{size_mib} MiB: {faults_per_alloc} faults per allocation"
            )


# ten 64 MiB tensors, each freed before the next, fault in (almost) no fresh pages
HEAP_REUSE = """\
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            block = torch.empty(16 << 20)
            block.fill_(1.0)
            small = torch.empty(16)
            del block, small
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        return torch.ones(1) if faults < 0.01 * 10 * (64 << 20) / 4096 else torch.zeros(1)"""


def test_inside_the_sandbox_a_freed_block_is_reused_without_page_faults(tmp_path):
    result = probe("heap_reuse", HEAP_REUSE, str(tmp_path))
    assert result.status == "ok", result.reason
