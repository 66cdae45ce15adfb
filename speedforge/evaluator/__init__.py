"""The hardened evaluator: every reward passes through `evaluate`.

    evaluate(task, candidate, config=None, device="cpu", pool=None) -> EvalResult

Stages: screen (static) -> build (sandboxed, cached by content hash) -> run (sandboxed:
correctness over fresh seeded inputs, paired timing, runtime guards). Total: every input gets
an EvalResult with a status; it never raises because a candidate is bad.
"""

from speedforge.evaluator.evaluate import Build, build_candidate, evaluate, run_candidate

__all__ = ["Build", "build_candidate", "evaluate", "run_candidate"]
