"""Ray evaluation service: CPU build workers, one bench worker per GPU of each pool.

    from speedforge.cluster import EvaluationService, connect_ray
    connect_ray(None, config.service)                  # or an address to join a cluster
    with EvaluationService(config) as service:
        results = service.submit(candidates, ["H100", "L40"], tasks, store=store)

Ray is imported only when a service starts, so the rest of speedforge does not need it.
"""

from speedforge.cluster.service import EvaluationService, ResultsTable, connect_ray

__all__ = ["EvaluationService", "ResultsTable", "connect_ray"]
