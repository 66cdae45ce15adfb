"""The exit handler of every pipeline: a failure report in the store when the run failed."""

from kfp import dsl

from speedforge.kubeflow.components import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def run_report(config: str, store: str, run_id: str, status: dsl.PipelineTaskFinalStatus) -> dict:
    """For a failed run, write pipeline-runs/<run_id>/failure.md and .json to `store`: the step that
    failed, its error, and every step's status."""
    from speedforge.config import loads_config
    from speedforge.kubeflow.run_steps import RunStatus, write_run_report

    report = write_run_report(
        loads_config(config, where="the config parameter"),
        store,
        run_id,
        RunStatus(status.state, status.error_message or "", status.pipeline_task_name or ""),
    )
    if report.state != "SUCCEEDED":
        print(
            f"run {run_id} {report.state}: step {report.failed_step or '?'}: {report.error}; "
            f"failure report: {report.report_uri}"
        )
    return report.to_dict()
