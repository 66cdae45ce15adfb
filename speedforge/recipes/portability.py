"""A portability run: every variant of a set and its reference measured again on every pool.

    outcome = run_portability(config, "a100.jsonl", ["H100", "L40"], "s3://b/port/2026-11-23")
    outcome.summary["H100"].geomean

What `speedforge portability` and the portability component do, in the order that keeps a bad
run from recording anything: the pools are resolved and the variant set read and checked (every
variant's task known, every pool able to run their family) before the store is touched; then,
holding the lease of `out_uri`'s results table, the run

1. records the variant set (`variant_set` table: each variant with the score and pool it was
   first measured on, which the report puts beside the new measurements);
2. measures on the Ray evaluation service, one architecture at a time: pools are grouped by
   compute capability (`cuda_arch`), and each group's builds target its architecture alone, so
   each candidate is built once per architecture and pools of the same one (H100 and H200)
   share the build; a kernel that does not compile for one architecture fails there only. With
   `evaluator.cuda_arch_list` set, one fat build serves every pool instead;
3. probes each pool's environment on the pool itself (device, driver, torch) into the `pools`
   table, so runs on other machines and days merge with this one keyed by pool.

Results are appended as they arrive; the same command again skips the pairs already measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from speedforge.config import Config, EvaluatorConfig, PoolConfig
from speedforge.errors import UserError
from speedforge.extras import require
from speedforge.records import EvalResult, PoolInfo
from speedforge.recipes.variant_set import VariantSet, read_variant_set
from speedforge.reports.portability import PoolSummary, PortabilityRun, merge_runs

VARIANT_SET_TABLE = "variant_set"  # speedforge.records.TABLES
POOLS_TABLE = "pools"


@dataclasses.dataclass(frozen=True)
class PortabilityOutcome:
    results_uri: str  # the store whose results, variant_set and pools tables `speedforge report` reads
    run_id: str
    pools: tuple[PoolInfo, ...]  # each pool's environment, in the order given
    tasks: int  # distinct tasks of the variant set
    variants: int
    results: list[EvalResult]  # one per (variant, pool), this run's and those an earlier run recorded
    summary: dict[str, PoolSummary]  # per pool
    notes: tuple[str, ...] = ()  # what the variant set passed over
    kept_parts: int = 0  # parts of results the store did not take, kept in the local spill for the next run

    def to_dict(self) -> dict[str, Any]:
        return {
            "results_uri": self.results_uri,
            "run_id": self.run_id,
            "pools": [dataclasses.asdict(p) for p in self.pools],
            "tasks": self.tasks,
            "variants": self.variants,
            "results": len(self.results),
            "summary": {p: s.to_dict() for p, s in self.summary.items()},
            "notes": list(self.notes),
            "kept_parts": self.kept_parts,
        }


ServiceFactory = Callable[[Config], contextlib.AbstractContextManager]


def run_portability(
    config: Config,
    variants_uri: str,
    pools: list[str],
    out_uri: str,
    *,
    view=None,
    tasks_uri: str | None = None,
    select: str = "best",
    levels: tuple[int, ...] = (),
    limit: int = 0,
    skip_bad: bool = False,
    address: str | None = None,
    endpoint: str | None = None,
    force: bool = False,
    service_factory: ServiceFactory | None = None,
) -> PortabilityOutcome:
    """Measure the variant set `variants_uri` (speedforge.recipes.variant_set) on `pools`, into
    the store `out_uri`. `view`: entered once the measuring starts, its `update(SweepProgress)`
    called as results arrive (a SweepProgress names only the pools of the architecture being
    measured); its `measuring(variant_set, pools)` first, once the inputs are checked.
    `service_factory(config)`: the evaluation service (tests inject cheap stand-ins)."""
    from speedforge.cluster.environment import probe_pools
    from speedforge.cluster.pools import resolve_pools
    from speedforge.cluster.service import EvaluationService, ResultsTable
    from speedforge.cluster.session import ray_session
    from speedforge.cluster.sweep import check_inputs
    from speedforge.store import open_store

    require("cluster", "ray", purpose="the Ray evaluation service")  # before anything is read or written
    if not pools:
        raise UserError("no pool given: name one or more pools, e.g. --pools H100,L40 (or cpu)")
    pool_configs = resolve_pools(pools, config.service)
    chosen = read_variant_set(
        config,
        variants_uri,
        tasks_uri=tasks_uri,
        select=select,
        levels=levels,
        limit=limit,
        skip_bad=skip_bad,
        endpoint=endpoint,
    )
    candidates = chosen.candidates()
    check_inputs(candidates, chosen.tasks, pool_configs)
    out = open_store(out_uri, endpoint_url=endpoint, config=config.store)
    run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"
    factory = service_factory or EvaluationService
    results: list[EvalResult] = []
    with ResultsTable.open(out, config, force=force) as table:  # before Ray: a second run refuses at once
        out.append_records(VARIANT_SET_TABLE, chosen.variants)
        with ray_session(address, config.service), view or _Silent() as shown:
            shown.measuring(chosen, list(pool_configs))
            for evaluator, group in architecture_groups(pool_configs, config.evaluator):
                with factory(dataclasses.replace(config, evaluator=evaluator)) as service:
                    results += service.submit(candidates, group, chosen.tasks, store=table, on_progress=shown.update)
            infos = probe_pools(pool_configs, run_id, config.service.worker_start_timeout_s)
        out.append_records(POOLS_TABLE, list(infos.values()))
    merged = merge_runs([PortabilityRun(out.uri, results, chosen.variants, list(infos.values()))])
    return PortabilityOutcome(
        out.uri,
        run_id,
        tuple(infos.values()),
        len({v.task_id for v in chosen.variants}),
        len(chosen.variants),
        results,
        {p: merged.summary(p) for p in pool_configs},
        chosen.notes,
        table.kept_parts,
    )


def architecture_groups(
    pools: Mapping[str, PoolConfig], evaluator: EvaluatorConfig
) -> list[tuple[EvaluatorConfig, list[str]]]:
    """The pools grouped by the architecture their builds target, each with the evaluator config
    its builds use, in the order the pools are first named. `evaluator.cuda_arch_list` set: one
    group, every pool on that (fat) build. A pool without a `cuda_arch` (a CPU pool) builds as
    configured."""
    if evaluator.cuda_arch_list:
        return [(evaluator, list(pools))]
    groups: dict[str, list[str]] = {}
    for name, pool in pools.items():
        groups.setdefault(pool.cuda_arch, []).append(name)
    return [(dataclasses.replace(evaluator, cuda_arch_list=arch), names) for arch, names in groups.items()]


class _Silent(contextlib.AbstractContextManager):
    """A view that shows nothing."""

    def __exit__(self, *exc: Any) -> None:
        return None

    def measuring(self, chosen: VariantSet, pools: list[str]) -> None:
        pass

    def update(self, progress: Any) -> None:
        pass
