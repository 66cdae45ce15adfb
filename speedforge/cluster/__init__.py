"""Ray evaluation service: CPU build workers, one bench worker per GPU of each pool.

    from speedforge.cluster import EvaluationService, ray_session
    with ray_session(None, config.service):            # or an address to join a cluster
        with EvaluationService(config) as service:
            results = service.submit(candidates, ["H100", "L40"], tasks, store=store)

Ray is imported only when a service starts, so the rest of speedforge does not need it.
"""

from speedforge.cluster.service import EvaluationService, ResultsTable
from speedforge.cluster.session import connect_ray, ray_session

__all__ = ["EvaluationService", "ResultsTable", "connect_ray", "ray_session"]
