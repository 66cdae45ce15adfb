"""The report of a run's portability results: HTML with its plots, Markdown and JSON."""

from kfp import dsl
from kfp.dsl import Artifact, Output

from components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def report(config: str, portability: list, store: str, run_id: str, report_dir: Output[Artifact]) -> dict:
    """Write the report of the pools' portability results (`portability`: each pool's summary, with its
    results_uri) into the `report_dir` artifact; returns the paths of its html, markdown and json."""
    from speedforge.config import loads_config
    from speedforge.recipes.report import write_report
    from speedforge.recipes.run_steps import run_step

    settings = loads_config(config, where="the config parameter")
    return run_step(settings, store, run_id, "report", write_report, settings,
                    [summary["results_uri"] for summary in portability], report_dir.path)
