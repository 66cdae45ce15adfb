"""On a GPU machine: the service evaluates the built-in CUDA candidates end to end, on a local
Ray whose GPU pool is the accelerator type Ray detects (H100, A100, ...)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")


def test_service_evaluates_the_builtin_cuda_candidates_end_to_end(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from speedforge.cluster import EvaluationService, connect_ray
    from speedforge.config import Config, EvaluatorConfig
    from speedforge.records import EvalResult
    from speedforge.store import open_store
    from speedforge.tasks import builtin_candidates, builtin_tasks

    config = Config(evaluator=EvaluatorConfig(cache_dir=str(tmp_path / "cache")))
    candidates = builtin_candidates("cuda")
    assert candidates, "the built-in suite has no cuda candidates"
    connect_ray(None, config.service)
    try:
        detected = [k.split(":", 1)[1] for k in ray.cluster_resources() if k.startswith("accelerator_type:")]
        pools = [p for p in detected if p in config.service.pools]
        assert pools, f"Ray detected accelerator types {detected}, none of them a configured pool"
        store = open_store(tmp_path / "out")
        with EvaluationService(config) as service:
            results = service.submit(candidates, pools[:1], builtin_tasks("cuda"), store=store)
    finally:
        ray.shutdown()
    failures = [(r.task_id, r.status, r.reason) for r in results if not r.ok]
    assert not failures, failures
    assert len(results) == len(candidates) and all(r.pool == pools[0] and r.speedup > 0 for r in results)
    assert len(store.read_records("results", EvalResult)) == len(candidates)
    print({r.task_id: round(r.speedup, 2) for r in results})
