"""The in-context search over the first tasks of a staged data set, with one policy.

    found = search_dataset(config, "s3://b/runs/n1/datasets/kb", "s3://b/runs/n1", tasks=2, view=printer)

Each task is searched as `speedforge optimize --store` does (speedforge.recipes.task_search):
exemplars from the run's variants table, new variants appended to it round by round. `model`
replaces config.policy.model when given (a checkpoint that training wrote, say); `rounds`,
`samples` and `max_new_tokens` are the budget (0: the config's own). The backend is made once,
before any evaluation, so a bad model fails first.
"""

from __future__ import annotations

import dataclasses

from speedforge.config import Config
from speedforge.errors import UserError


@dataclasses.dataclass(frozen=True)
class DatasetSearch:
    store_uri: str
    best: dict[str, float | None]  # task id: best speedup after the search (None: nothing passed)
    samples: int
    valid: int  # samples that measured ok

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def search_dataset(
    config: Config,
    tasks_uri: str,
    store_uri: str,
    view,
    tasks: int = 1,
    model: str = "",
    rounds: int = 0,
    samples: int = 0,
    max_new_tokens: int = 0,
    pool: str = "",
    address: str | None = None,
    service: bool = False,
) -> DatasetSearch:
    """Search the first `tasks` tasks (in task id order) of `tasks_uri`, recording in `store_uri`."""
    from speedforge.policy.backends import make_backend
    from speedforge.recipes.models import with_registered_model
    from speedforge.record_sources import read_records
    from speedforge.recipes.task_search import search_task

    if tasks < 1:
        raise UserError(f"the search needs at least 1 task, got {tasks}")
    config = with_registered_model(budget_config(config, model, rounds, samples, max_new_tokens, pool), store_uri)
    task_ids = sorted(t.task_id for t in read_records(tasks_uri, "tasks", config))[:tasks]
    backend = make_backend(config.policy)
    results = [
        search_task(
            config,
            task_id,
            view,
            tasks_uri=tasks_uri,
            store_uri=store_uri,
            service=service,
            address=address or None,
            backend=backend,
        )
        for task_id in task_ids
    ]
    return DatasetSearch(
        store_uri,
        {r.task_id: r.best.score if r.best else None for r in results},
        sum(len(r.samples) for r in results),
        sum(s.status == "ok" for r in results for s in r.samples),
    )


def budget_config(
    config: Config, model: str = "", rounds: int = 0, samples: int = 0, max_new_tokens: int = 0, pool: str = ""
) -> Config:
    """`config` with the given budget in place of its own (0 or "": keep the config's)."""
    search = dataclasses.replace(
        config.search, **{k: v for k, v in (("rounds", rounds), ("samples", samples), ("pool", pool)) if v}
    )
    policy = dataclasses.replace(
        config.policy, **{k: v for k, v in (("model", model), ("max_new_tokens", max_new_tokens)) if v}
    )
    return dataclasses.replace(config, search=search, policy=policy)
