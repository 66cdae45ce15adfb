"""The report of a run's portability results: HTML with its plots, Markdown and JSON; the HTML and
the Markdown also as KFP's HTML and Markdown artifacts, which its UI shows."""

from typing import List

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Markdown, Output

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def report(
    config: str,
    portability: Input[List[Dataset]],
    store: str,
    run_id: str,
    report_dir: Output[Artifact],
    report_html: Output[HTML],
    report_markdown: Output[Markdown],
) -> dict:
    """Write the report of the pools' portability results (`portability`: each pool's results artifact)
    into the `report_dir` artifact, and its HTML (figures inlined) and Markdown as the
    `report_html` and `report_markdown` artifacts; returns the paths of its html, markdown and json."""
    import shutil

    from speedforge.config import loads_config
    from speedforge.recipes.report import write_report
    from speedforge.kubeflow.run_steps import run_step
    from speedforge.kubeflow.store_artifacts import store_uri

    settings = loads_config(config, where="the config parameter")
    outcome = run_step(
        settings,
        store,
        run_id,
        "report",
        write_report,
        settings,
        [store_uri(results) for results in portability],
        report_dir.path,
    )
    shutil.copyfile(outcome["html"], report_html.path)
    shutil.copyfile(outcome["markdown"], report_markdown.path)
    return outcome
