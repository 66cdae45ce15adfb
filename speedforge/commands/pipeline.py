"""`speedforge pipeline`: the Kubeflow pipelines: compile, submit, schedule nightly, status, and a
local run on this machine.

    speedforge pipeline compile                                  # speedforge/kubeflow/pipelines/*.yaml, checked in
    speedforge pipeline submit --host http://localhost:8080 --image registry.example.com/speedforge:0.1.0 \
        --param pools=A100,H100
    speedforge pipeline schedule --host http://localhost:8080 --image registry.example.com/speedforge:0.1.0
    speedforge pipeline status RUN_ID --host http://localhost:8080
    speedforge pipeline run-local                                # kfp.local, embedded defaults
"""

from __future__ import annotations

import argparse
import os
import tempfile

from speedforge.config import load_config
from speedforge.errors import read_text
from speedforge.reports.text import print_table

PIPELINE_NAMES = ("training", "cross-arch")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pipeline",
        help="Kubeflow pipelines: compile, submit, schedule, status, run locally",
        description="The Kubeflow pipelines (training; cross-architecture evaluation): compile them to YAML, "
        "submit a run or a nightly recurring run to Kubeflow Pipelines, read a run's status, or run "
        "the training pipeline on this machine with kfp.local.",
    )
    commands = parser.add_subparsers(dest="pipeline_command", metavar="SUBCOMMAND", required=True)

    compile_parser = commands.add_parser(
        "compile",
        help="compile the pipelines to YAML",
        description="Compile the pipelines to YAML packages (by default the "
        "checked-in speedforge/kubeflow/pipelines/<name>.yaml). The same source gives the "
        "same bytes.",
    )
    compile_parser.add_argument("--name", choices=[*PIPELINE_NAMES, "all"], default="all")
    compile_parser.add_argument(
        "--out", help="output folder (default: speedforge/kubeflow/pipelines/ of this checkout)"
    )
    compile_parser.add_argument(
        "--image",
        help="image the components run in, fully qualified (default: "
        "$SPEEDFORGE_IMAGE, else registry.example.com/speedforge:<version>, "
        "the checked-in YAML's placeholder)",
    )
    compile_parser.set_defaults(func=_compile)

    submit = commands.add_parser(
        "submit",
        help="create a run (what `kfp run create` does)",
        description="Create a run of a compiled pipeline on Kubeflow Pipelines.",
    )
    _connection_options(submit)
    _package_options(submit)
    submit.add_argument("--experiment", default="speedforge")
    submit.add_argument("--run-name", help="run name (default: KFP's)")
    submit.add_argument("--service-account", help="Kubernetes service account of the run's pods")
    submit.set_defaults(func=_submit)

    schedule = commands.add_parser(
        "schedule",
        help="create a recurring run (nightly by default)",
        description="Create a recurring run of a compiled pipeline with the KFP client: one run at a time, no "
        "catch-up. The cron is read as KFP reads it, in UTC: six fields, seconds first "
        "('0 0 2 * * *'), or a descriptor ('@daily', '@hourly', '@every 6h'); a five-field "
        "crontab expression is refused (KFP would read it seconds first).",
    )
    _connection_options(schedule)
    _package_options(schedule)
    schedule.add_argument(
        "--cron",
        default=None,
        help="six-field cron, seconds first, in UTC, or @daily, @every 6h, ... "
        "(default: '0 0 2 * * *', 02:00 UTC every day)",
    )
    schedule.add_argument("--job-name", default="speedforge-nightly")
    schedule.add_argument("--experiment", default="speedforge")
    schedule.add_argument(
        "--service-account",
        default="",
        help="service account of the runs' pods (default: KFP's, pipeline-runner in standalone KFP, "
        "default-editor in a profile's namespace; k8s/kfp/ lets either create RayJobs)",
    )
    schedule.add_argument("--disabled", action="store_true", help="create it paused")
    schedule.set_defaults(func=_schedule)

    status = commands.add_parser("status", help="a run's state", description="Print a run's state, times and error.")
    status.add_argument("run_id")
    _connection_options(status)
    status.set_defaults(func=_status)

    run_local = commands.add_parser(
        "run-local",
        help="run the training pipeline on this machine (kfp.local)",
        description="Run the training pipeline with kfp.local, keeping a cluster's boundaries: every step a "
        "subprocess of this Python with a HOME, cache, temp and working folder of its own (steps share "
        "only the store and KFP's values), the store on an embedded S3 server, a local Ray per "
        "evaluating step, the train step submitted to a Ray head of its own through the Job "
        "Submission API (as KubeRay's submitter does); the cpp family and the default small model "
        "on a tiny budget. --config names the run's one config, which every step reads (its train: "
        "section the train step's; default: the embedded defaults). Prints a line per step as it ends "
        "(name, state, seconds, its main figure) and where the report is; each step's own output goes to a log file (<cache>/pipeline-root/<run>/"
        "logs/), whose path is printed when the step fails.",
    )
    run_local.add_argument("--source", default="builtin:cpp", help="task source (default: builtin:cpp)")
    run_local.add_argument("--pools", default="cpu", help="comma-separated pools (default: cpu)")
    run_local.add_argument("--train-stage", default="grpo", help="training stage (default: grpo)")
    run_local.add_argument("--model", default="", help="policy model of the search (default: the trained checkpoint)")
    run_local.add_argument(
        "--baseline-candidates", type=int, default=2, help="candidates measured per pool (default: 2)"
    )
    run_local.add_argument("--search-tasks", type=int, default=1, help="tasks searched (default: 1)")
    run_local.add_argument("--search-rounds", type=int, default=1, help="(default: 1)")
    run_local.add_argument("--search-samples", type=int, default=2, help="(default: 2)")
    run_local.add_argument("--search-tokens", type=int, default=256, help="max new tokens per sample (default: 256)")
    run_local.add_argument(
        "--verbose", action="store_true", help="print everything kfp.local and the steps print (no log files)"
    )
    run_local.set_defaults(func=_run_local)


def _connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="Kubeflow Pipelines endpoint (default: $KF_PIPELINES_ENDPOINT)")
    parser.add_argument("--namespace", help="KFP namespace (multi-user deployments; default: kubeflow)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the endpoint (default: 10)")
    parser.add_argument(
        "--token",
        help="bearer token of a multi-user KFP (default: $KF_PIPELINES_TOKEN), e.g. "
        "$(kubectl create token default-editor -n NAMESPACE --audience ...)",
    )


def _package_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", choices=PIPELINE_NAMES, default="training")
    parser.add_argument(
        "--package", help="compiled YAML (default: the checked-in speedforge/kubeflow/pipelines/<name>.yaml)"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a pipeline parameter (repeatable), e.g. --param pools=A100,H100",
    )
    parser.add_argument(
        "--image",
        help="the image the run's steps and its RayJob run in, fully qualified "
        "(REGISTRY/speedforge:TAG; default: $SPEEDFORGE_IMAGE; one is required)",
    )


def _entry(name: str):
    from speedforge.kubeflow.pipelines import PIPELINES

    return PIPELINES[name]


def _compile(args: argparse.Namespace) -> int:
    from pathlib import Path

    from speedforge.kubeflow.kfp_runs import IMAGE_ENV, check_image, compile_pipeline

    if args.image:
        os.environ[IMAGE_ENV] = check_image(args.image)  # read when the components are imported, just below
    elif os.environ.get(IMAGE_ENV):
        check_image(os.environ[IMAGE_ENV], f"${IMAGE_ENV}")

    for name in PIPELINE_NAMES if args.name == "all" else (args.name,):
        entry = _entry(name)
        out = Path(args.out) / entry.package.name if args.out else entry.package
        print(f"{name}: {compile_pipeline(entry.func, out)}")
    return 0


def _arguments(args: argparse.Namespace, folder: str):
    """The package to send (a copy in `folder` whose steps run in the run's image) and the arguments."""
    from speedforge.config import loads_config
    from speedforge.kubeflow.kfp_runs import image_from, parse_params, with_image
    from speedforge.kubeflow.placement import pipeline_pools

    package = args.package or str(_entry(args.name).package)
    arguments = parse_params(package, args.param)
    image = image_from(args.image)  # a bare or missing image fails before any endpoint is tried
    if "pools" in arguments:  # an unknown pool is refused here, before a run is made (the run's first step checks too)
        pipeline_pools(loads_config(arguments.get("config", ""), where="--param config"), arguments["pools"])
    return str(with_image(package, image, os.path.join(folder, os.path.basename(package)))), arguments


def _submit(args: argparse.Namespace) -> int:
    from speedforge.kubeflow.kfp_runs import connect_kfp, submit_run

    with tempfile.TemporaryDirectory(prefix="speedforge-package-") as folder:
        package, arguments = _arguments(args, folder)
        client = connect_kfp(args.host, args.namespace, args.timeout, args.token)
        run = submit_run(
            client,
            package,
            arguments,
            experiment=args.experiment,
            run_name=args.run_name,
            service_account=args.service_account,
        )
    print(f"run {run.run_id} ({run.name}): {run.state or 'submitted'}" + (f"  {run.url}" if run.url else ""))
    return 0


def _schedule(args: argparse.Namespace) -> int:
    import datetime

    from speedforge.kubeflow.kfp_runs import DEFAULT_CRON, check_cron, connect_kfp, next_runs, schedule_run

    cron = check_cron(args.cron or DEFAULT_CRON)  # a bad cron fails before the endpoint is tried
    with tempfile.TemporaryDirectory(prefix="speedforge-package-") as folder:
        package, arguments = _arguments(args, folder)
        client = connect_kfp(args.host, args.namespace, args.timeout, args.token)
        job = schedule_run(
            client,
            package,
            arguments,
            cron=cron,
            name=args.job_name,
            experiment=args.experiment,
            service_account=args.service_account or None,
            enabled=not args.disabled,
        )
    print(
        f"recurring run {job.recurring_run_id} ({job.name}): cron {job.cron!r}, service account "
        f"{job.service_account or '-'}, {'enabled' if job.enabled else 'disabled'}"
    )
    first = next_runs(job.cron, datetime.datetime.now(datetime.timezone.utc))[0]
    print(
        f"KFP reads the cron in UTC (unless its scheduler's CRON_SCHEDULE_TIMEZONE is set): next run "
        f"{first:%Y-%m-%d %H:%M:%S} UTC"
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    from speedforge.kubeflow.kfp_runs import connect_kfp, run_status

    run = run_status(connect_kfp(args.host, args.namespace, args.timeout, args.token), args.run_id)
    print_table(
        ["run", "name", "state", "created", "finished", "error"],
        [[run.run_id, run.name, run.state, run.created_at, run.finished_at, run.error]],
    )
    return 0 if run.state not in ("FAILED", "CANCELED") else 1


def _run_local(args: argparse.Namespace) -> int:
    from speedforge.kubeflow.local_pipeline import run_pipeline_locally

    config = load_config(args.config)
    arguments = {
        "source": args.source,
        "pools": args.pools,
        "search_pool": "cpu",
        "model": args.model,
        "ray_address": "",
        "train_stage": args.train_stage,
        "baseline_candidates": args.baseline_candidates,
        "search_tasks": args.search_tasks,
        "search_rounds": args.search_rounds,
        "search_samples": args.search_samples,
        "max_new_tokens": args.search_tokens,
    }
    config_text = read_text(args.config, "config file") if args.config else ""
    run = run_pipeline_locally(
        _entry("training").func, arguments, config, config_text, ray_head=True, verbose=args.verbose
    )
    if args.verbose:  # quiet, each step said its line as it ended
        print_table(["step", "status", "seconds"], [[s.step, s.status, f"{s.seconds:.0f}"] for s in run.steps])
    print(
        f"run {run.run_id}: tables in {run.store_uri} (embedded S3, data under {config.evaluator.cache_dir}/pipeline-s3)"
    )
    for kind in ("html", "markdown", "json"):
        if run.report.get(kind):
            print(f"report ({kind}): {run.report[kind]}")
    if run.logs:
        print(f"logs: {run.logs}")
    return 0
