"""Every subcommand turns bad input (a missing or binary file, a bad config) into one line on
stderr and exit code 2, before any real work; SIGTERM is one "interrupted" line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from speedforge import cli

BINARY = b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x81" * 16

# One run of each leaf command that would work with a good config (none gets to real work here).
COMMANDS = [
    ["tasks", "list"],
    ["tasks", "show", "cpp/rmsnorm"],
    ["eval", "--task", "cpp/rmsnorm", "--candidate", "{good}"],
    ["run", "--family", "cpp"],
    ["evaluate", "--tasks", "builtin:cpp", "--candidates", "builtin:cpp", "--pools", "cpu", "--out", "{tmp}/out"],
    ["stage", "--source", "builtin:cpp", "--dest", "{tmp}/store"],
    ["s3", "serve", "--dir", "{tmp}/s3"],
    ["optimize", "--task", "cpp/rmsnorm"],
    ["serve-policy"],
    ["ann", "tasks"],
    ["ann", "reference", "ann/sift-search"],
    ["ann", "sweep", "--n", "100", "--nq", "10"],
    ["models", "list", "--registry", "{tmp}/store"],
]
BAD_CONFIGS = {
    "missing": None,
    "binary": BINARY,
    "unknown key": b"evaluator:\n  scren: report\n",
    "bad value": b"evaluator:\n  screen: off\n",
    "bad range": b"evaluator:\n  run_timeout_s: -1\n",
    # YAML's "billion laughs" inside one value: lists of nine aliases to the list before, 9**9 strings expanded
    "alias bomb": (
        "evaluator:\n  screen: [&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"
        + "".join(f",\n    &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9))
        + "]\n"
    ).encode(),
    "deep nesting": b"[" * 100_000,
    "NUL in a path": b'evaluator:\n  cache_dir: "/tmp/cache\\0x"\n',
}


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "good.py"
    good.write_text("import torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n")
    binary = tmp_path / "binary.py"
    binary.write_bytes(BINARY)
    return {"tmp": str(tmp_path), "good": str(good), "binary": str(binary), "missing": str(tmp_path / "absent.py")}


@pytest.fixture
def run_cli(capsys):
    """Run `speedforge ARGS` in this process: (exit code, stderr lines, stdout)."""

    def run(args: list[str]) -> tuple[int, list[str], str]:
        saved = signal.getsignal(signal.SIGTERM)
        code = cli.main(args)
        assert signal.getsignal(signal.SIGTERM) is saved  # main leaves no handler behind
        out, err = capsys.readouterr()
        return code, err.splitlines(), out

    return run


def assert_one_line_error(code: int, err: list[str], command: str, *words: str) -> None:
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith(f"speedforge {command}: error: ") and "Traceback" not in err[0]
    for word in words:
        assert word in err[0]


@pytest.mark.parametrize("kind", BAD_CONFIGS)
@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[:2]) for c in COMMANDS])
def test_every_command_refuses_a_bad_config_in_one_line(run_cli, files, tmp_path, command, kind):
    config = tmp_path / "speedforge.yaml"
    if BAD_CONFIGS[kind] is not None:
        config.write_bytes(BAD_CONFIGS[kind])
    args = [a.format(**files) for a in command]
    code, err, out = run_cli(["--config", str(config), *args])
    assert_one_line_error(code, err, command[0], str(config))
    assert out == ""
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists() and not (tmp_path / "s3").exists()


def test_config_may_follow_the_subcommand(run_cli, tmp_path):
    config = tmp_path / "speedforge.yaml"
    config.write_text("policy:\n  device: gpu\n")
    code, err, _ = run_cli(["tasks", "list", "--config", str(config)])
    assert_one_line_error(code, err, "tasks", "policy.device: expected auto, cpu, cuda or cuda:N, got 'gpu'")


@pytest.mark.parametrize(
    "command, words",
    [
        (["eval", "--task", "cpp/rmsnorm", "--candidate", "{binary}"], ["is not UTF-8 text"]),
        (["eval", "--task", "cpp/rmsnorm", "--candidate", "{missing}"], ["candidate file not found"]),
        (["eval", "--task", "cpp/rmsnorm", "--candidate", "{tmp}"], ["is not a file"]),
        (["eval", "--task", "{binary}", "--candidate", "{good}"], ["task file", "is not UTF-8 text"]),
        (["eval", "--task", "{missing}", "--candidate", "{good}"], ["task file not found"]),
        (["eval", "--task", "cpp/no_such_task", "--candidate", "{good}"], ["unknown task id"]),
        (["stage", "--source", "{missing}", "--dest", "{tmp}/store"], ["not found"]),
        (["stage", "--source", "{binary}", "--dest", "{tmp}/store", "--kind", "cuda-l1-jsonl"], ["cannot read"]),
        (
            ["evaluate", "--tasks", "builtin", "--candidates", "builtin", "--pools", "Z99", "--out", "{tmp}/out"],
            ["unknown pool(s) Z99"],
        ),
        (
            ["evaluate", "--tasks", "{binary}", "--candidates", "builtin", "--pools", "cpu", "--out", "{tmp}/out"],
            ["is not a folder"],
        ),
        (["tasks", "show", "cpp/no_such_task"], ["unknown task id"]),
        (["optimize", "--task", "cpp/no_such_task"], ["unknown task id"]),
        (["optimize", "--task", "cpp/rmsnorm", "--samples", "0"], ["--samples must be at least 1"]),
        (["optimize", "--task", "cpp/rmsnorm", "--backend", "vllm"], ["unknown generation backend 'vllm'"]),
        (["optimize", "--task", "cpp/rmsnorm", "--model", "{missing}.gguf"], ["does not exist"]),
        (["run", "--family", "cpp", "--tasks", "cpp/no_such_task"], ["not cpp tasks: cpp/no_such_task"]),
        (["run", "--family", "cpp", "--search-samples", "0"], ["--search-samples must be at least 1"]),
        (["serve-policy", "--model", "{missing}.gguf"], ["does not exist"]),
        (["s3", "serve", "--dir", "{binary}"], ["is a file, not a folder"]),
        (["ann", "reference", "ann/no_such_task"], ["unknown ann task"]),
        (["ann", "sweep", "--base", "{missing}.fvecs", "--queries", "{missing}.fvecs"], ["not found"]),
        (["ann", "sweep", "--base", "{binary}", "--queries", "{binary}"], ["unknown vector file type"]),
    ],
)
def test_bad_input_files_and_values_are_one_line(run_cli, files, command, words):
    code, err, _ = run_cli([a.format(**files) for a in command])
    assert_one_line_error(code, err, command[0], *words)


def test_run_checks_the_policy_model_before_evaluating_anything(run_cli, files, tmp_path, monkeypatch):
    import speedforge.evaluator

    monkeypatch.setattr(
        speedforge.evaluator, "evaluate", lambda *a, **k: pytest.fail("evaluated before the model check")
    )
    config = tmp_path / "speedforge.yaml"
    config.write_text(f"policy:\n  model: {files['missing']}.gguf\n")
    code, err, out = run_cli(["--config", str(config), "run", "--family", "cpp"])
    assert_one_line_error(code, err, "run", "model path", "does not exist")
    assert out == ""


def test_eval_of_a_cuda_task_without_a_gpu_fails_before_building(run_cli, files, monkeypatch):
    import torch

    import speedforge.commands.eval as eval_command

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(eval_command, "evaluate", lambda *a, **k: pytest.fail("built without a GPU"))
    code, err, _ = run_cli(["eval", "--task", "cuda/rmsnorm", "--candidate", files["good"]])
    assert_one_line_error(code, err, "eval", "cuda/rmsnorm runs on a CUDA GPU and torch sees none")


def test_tasks_show_prints_the_source_byte_exact(run_cli):
    from speedforge.tasks import builtin_candidates, find_task

    candidate = next(c for c in builtin_candidates("cpp") if c.task_id == "cpp/rmsnorm")
    assert run_cli(["tasks", "show", "cpp/rmsnorm", "--candidate"])[2] == candidate.source
    assert run_cli(["tasks", "show", "cpp/rmsnorm"])[2] == find_task("cpp/rmsnorm").source


def test_sigterm_is_one_interrupted_line_and_exit_143(run_cli, monkeypatch):
    import speedforge.commands.tasks as tasks_command

    def terminated(args):
        os.kill(os.getpid(), signal.SIGTERM)
        pytest.fail("SIGTERM did not interrupt the command")

    monkeypatch.setattr(tasks_command, "_list", terminated)
    code, err, _ = run_cli(["tasks", "list"])
    assert (code, err) == (143, ["interrupted"])


def test_the_installed_command_prints_one_line_without_a_traceback(tmp_path):
    config = tmp_path / "speedforge.yaml"
    config.write_text("evaluator:\n  screen: bogus\n")
    proc = subprocess.run(
        [sys.executable, "-m", "speedforge.cli", "--config", str(config), "tasks", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"speedforge tasks: error: {config}: evaluator.screen: expected one of enforce, report, got 'bogus'"
    ]


LONG = "n" * 300


@pytest.mark.parametrize(
    "command, words",
    [
        (
            ["stage", "--source", "builtin:cpp", "--dest", "{tmp}/store", "--name", LONG],
            ["--name: expected at most 100 characters, got 300"],
        ),
        (
            ["stage", "--source", "builtin:cpp", "--dest", "{tmp}/store", "--name", "../escape"],
            ["--name: expected 1 to 100"],
        ),
        (["stage", "--source", "builtin:cpp", "--dest", "{tmp}/store", "--name", "a b"], ["--name: expected 1 to 100"]),
        (["stage", "--source", "builtin:cpp", "--dest", "{tmp}/store", "--name", ""], ["--name: expected 1 to 100"]),
        (
            ["stage", "--source", "{tmp}/" + LONG + ".jsonl", "--dest", "{tmp}/store"],
            ["cannot read", "File name too long"],
        ),
        (["--config", "{tmp}/" + LONG + ".yaml", "tasks", "list"], ["cannot read config file", "File name too long"]),
        (["eval", "--task", "cpp/rmsnorm", "--candidate", "{tmp}/" + LONG], ["cannot read candidate file", "too long"]),
        (["models", "list", "--registry", "{tmp}/store", "--name", LONG], ["--name: expected at most 100 characters"]),
        (["train", "status", LONG], ["run: not a run name: expected at most 100 characters, got 300"]),
        (["train", "tensorboard", "../../etc"], ["run: not a run name: expected 1 to 100 letters"]),
    ],
)
def test_an_over_long_or_unsafe_name_or_path_is_one_line(run_cli, files, tmp_path, command, words):
    code, err, out = run_cli([a.format(**files) for a in command])
    assert_one_line_error(code, err, command[2] if command[0] == "--config" else command[0], *words)
    assert out == "" and not (tmp_path / "store").exists()
    assert all(len(line) < 400 for line in err)  # the value is cut short, not repeated in full


def test_a_name_of_the_longest_allowed_length_stages(run_cli, tmp_path):
    code, err, out = run_cli(
        ["stage", "--source", "builtin:cpp", "--dest", str(tmp_path / "store"), "--name", "n" * 100]
    )
    assert code == 0, err
    assert out.startswith(f"staged {'n' * 100} v1")


def test_the_installed_command_refuses_an_alias_bomb_at_once(tmp_path):
    config = tmp_path / "speedforge.yaml"
    config.write_bytes(BAD_CONFIGS["alias bomb"])
    proc = subprocess.run(
        [sys.executable, "-m", "speedforge.cli", "--config", str(config), "tasks", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"speedforge tasks: error: {config}: line 6: more than 10000 values, each "
        "use of an alias counting its anchor's values again; a config needs far "
        "fewer: write fewer values or aliases"
    ]
