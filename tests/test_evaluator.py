"""The evaluator's behaviour on honest and bad input: statuses, the build cache, the CLI."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from speedforge.config import EvaluatorConfig
from speedforge.evaluator import build_candidate, evaluate, run_candidate
from speedforge.evaluator.correctness import trial_count
from speedforge.evaluator.screen import screen, screen_cpp
from speedforge.records import STATUSES, Candidate, EvalResult, Task

DATA = Path(__file__).parent / "data"
ADVERSARIAL = Path(__file__).parent / "adversarial"


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> EvaluatorConfig:
    return EvaluatorConfig(
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        run_timeout_s=60.0,
        correctness_trials=2,
        cpu_timed_calls=5,
        min_timed_s=0.0,
        max_timed_calls=5,
        warmup_calls=1,
    )


@pytest.fixture(scope="module")
def add_task() -> Task:
    return Task(task_id="test/add", family="cpp", name="add", source=(DATA / "cpp_add_task.py").read_text())


@pytest.fixture(scope="module")
def relu_task() -> Task:
    return Task(task_id="test/relu", family="cpp", name="relu", source=(ADVERSARIAL / "task.py").read_text())


def _cand(task: Task, source: str) -> Candidate:
    return Candidate.make(task.task_id, source)


# -- statuses for bad input ---------------------------------------------------------------------


def test_unparsable_source_is_screen_rejected(relu_task, config):
    result = evaluate(relu_task, _cand(relu_task, "class ModelNew(:\n  pass"), config)
    assert result.status == "screen_rejected"
    assert "not valid Python" in result.reason


def test_missing_model_new_is_rejected_or_a_runtime_error(relu_task, config):
    source = "import torch\nclass Other(torch.nn.Module):\n    pass\n"
    assert evaluate(relu_task, _cand(relu_task, source), config).status == "screen_rejected"
    reported = evaluate(relu_task, _cand(relu_task, source), dataclasses.replace(config, screen="report"))
    assert reported.status == "runtime_error"
    assert "no ModelNew" in reported.reason


def test_wrong_forward_signature_is_a_runtime_error(relu_task, config):
    source = (
        "import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self, scale):\n        super().__init__()\n"
        "    def forward(self, x, y):\n        return x\n"
    )
    result = evaluate(relu_task, _cand(relu_task, source), config)
    assert result.status == "runtime_error"
    assert "forward" in result.reason and "TypeError" in result.reason


@pytest.mark.parametrize(
    "where, raised",
    [
        ("import", "SystemExit(0)"),
        ("forward", "KeyboardInterrupt()"),
        ("forward", "type('Out', (BaseException,), {})()"),
    ],
)
def test_a_candidate_that_raises_a_base_exception_fails_itself_not_the_host(relu_task, config, where, raised):
    """SystemExit, KeyboardInterrupt or any other BaseException from the candidate is its own
    runtime_error: an infra_error would be measured again, and could stop a training step."""
    source = (ADVERSARIAL / "good.py").read_text()
    if where == "import":
        source += f"\nraise {raised}\n"
    else:
        source = source.replace(
            "    def forward(self, x):\n", f"    def forward(self, x):\n        raise {raised}\n", 1
        )
        assert f"raise {raised}" in source
    result = evaluate(relu_task, _cand(relu_task, source), config)
    assert result.status == "runtime_error", (result.status, result.reason)
    assert "the candidate ended the run by raising" in result.reason


def test_candidate_for_another_task_is_refused(relu_task, add_task, config):
    result = evaluate(relu_task, _cand(add_task, (ADVERSARIAL / "good.py").read_text()), config)
    assert result.status == "runtime_error"
    assert "test/add" in result.reason


def test_cuda_family_on_cpu_is_refused_with_a_clear_reason(relu_task, config):
    task = dataclasses.replace(relu_task, family="cuda")
    result = evaluate(task, _cand(task, (ADVERSARIAL / "good.py").read_text()), config, device="cpu")
    assert result.status == "runtime_error" and "needs device cuda" in result.reason


def test_a_broken_reference_is_an_infra_error_not_the_candidates_fault(config):
    task = Task(
        task_id="test/broken",
        family="cpp",
        name="broken",
        source="import torch\nclass Model(torch.nn.Module):\n    def __init__(self):\n        raise ValueError('bad task')\n"
        "def get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n",
    )
    result = evaluate(task, _cand(task, (ADVERSARIAL / "good.py").read_text()), config)
    assert result.status == "infra_error"
    assert "reference" in result.reason


def test_every_result_is_json_safe_and_round_trips(relu_task, config):
    result = evaluate(relu_task, _cand(relu_task, (ADVERSARIAL / "good.py").read_text()), config)
    assert result.status == "ok" and result.correct
    assert result.ref_us > 0 and result.cand_us > 0 and result.speedup == pytest.approx(result.ref_us / result.cand_us)
    assert result.timed_calls == 5 and result.trials == trial_count(2)  # 2 asked: the reused-storage trials too
    text = result.to_json()
    assert EvalResult.from_json(text) == result
    table = EvalResult.to_table([result])
    assert EvalResult.from_table(table) == [result]


def test_unknown_status_cannot_be_recorded():
    with pytest.raises(ValueError):
        EvalResult(candidate_id="x", task_id="t", pool="cpu", status="fine")
    assert "infra_error" in STATUSES


# -- screen -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, reason",
    [
        ("cudaStream_t s; cudaStreamCreate(&s);", "side CUDA streams"),
        ("auto s = at::cuda::getStreamFromPool();", "side CUDA streams"),
        ("std::thread t([]{}); t.join();", "threads"),
        ("#pragma omp parallel for\nfor (int i = 0; i < n; ++i) {}", "threads"),
        ("static torch::Tensor cached;", "static tensors"),
        ('FILE* f = fopen("/etc/passwd", "r");', "file access"),
        ('const char* k = getenv("AWS_SECRET_ACCESS_KEY");', "environment"),
        ("usleep(100);", "sleeps"),
        ("cudaEventRecord(e);", "CUDA events"),
    ],
)
def test_screen_flags_tricks_in_embedded_cpp(code, reason):
    findings = screen_cpp(code)
    assert any(reason in f for f in findings), findings


def test_screen_ignores_tricks_named_only_in_comments():
    assert screen_cpp("// we never call std::thread here\n/* nor cudaStreamCreate */\nint x = 1;") == []


def test_screen_passes_an_ordinary_cuda_candidate():
    source = (
        (DATA / "cpp_add_fast.py")
        .read_text()
        .replace("torch::Tensor axpb", "// at::cuda::getCurrentCUDAStream() is the current stream\ntorch::Tensor axpb")
    )
    assert screen(source, "cuda").passed


# -- build cache (one real compile, plus one compile error) -------------------------------------


@pytest.mark.slow  # one C++ build (~40 s on 2 shared cores); the quick suite's build-once checks are in
# test_extensions_prebuilt.py (the same build cached, nothing compiled again) and test_cluster_service.py
def test_build_is_cached_by_content_and_rebuild_costs_nothing(add_task, config):
    candidate = _cand(add_task, (DATA / "cpp_add_fast.py").read_text())
    first = build_candidate(add_task, candidate, config)
    assert first.ok, first.failure
    assert not first.cached
    built = {p: p.stat().st_mtime_ns for p in Path(first.build_dir).rglob("*")}
    again = build_candidate(add_task, candidate, config)
    assert again.ok and again.cached and again.build_dir == first.build_dir
    assert {p: p.stat().st_mtime_ns for p in Path(again.build_dir).rglob("*")} == built  # nothing compiled again
    result = run_candidate(add_task, candidate, again, config)
    assert result.status == "ok", (result.reason, result.log[-2000:])
    assert result.build_cached


def test_compile_error_is_reported_with_the_compiler_log_and_cached(add_task, config):
    candidate = _cand(add_task, (DATA / "cpp_add_broken.py").read_text())
    result = evaluate(add_task, candidate, config)
    assert result.status == "compile_error"
    assert "undefined_name" in result.log
    again = evaluate(add_task, candidate, config)
    assert again.status == "compile_error" and again.build_cached


# -- CLI ----------------------------------------------------------------------------------------


def _cli(*args: str, env_cache: str) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "SPEEDFORGE_CACHE": env_cache}
    return subprocess.run(
        [sys.executable, "-m", "speedforge.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_cli_eval_prints_a_readable_result_and_json(tmp_path, config):
    out = _cli(
        "eval",
        "--task",
        str(ADVERSARIAL / "task.py"),
        "--candidate",
        str(ADVERSARIAL / "good.py"),
        env_cache=config.cache_dir,
    )
    assert out.returncode == 0, out.stderr
    assert "status      ok" in out.stdout and "speedup" in out.stdout
    out = _cli(
        "eval",
        "--task",
        str(ADVERSARIAL / "task.py"),
        "--candidate",
        str(ADVERSARIAL / "uninitialised_output.py"),
        "--json",
        env_cache=config.cache_dir,
    )
    assert out.returncode == 1
    assert json.loads(out.stdout)["status"] == "incorrect"


def test_cli_unknown_task_id_and_bad_task_file_are_one_line_errors(tmp_path, config):
    out = _cli(
        "eval", "--task", "cpp/no-such-task", "--candidate", str(ADVERSARIAL / "good.py"), env_cache=config.cache_dir
    )
    assert out.returncode == 2
    assert "unknown task id 'cpp/no-such-task'" in out.stderr and "Traceback" not in out.stderr
    bad = tmp_path / "no_inputs.py"
    bad.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\ndef get_init_inputs():\n    return []\n")
    out = _cli("eval", "--task", str(bad), "--candidate", str(ADVERSARIAL / "good.py"), env_cache=config.cache_dir)
    assert out.returncode == 2
    assert "missing get_inputs" in out.stderr and "Traceback" not in out.stderr
    out = _cli(
        "eval",
        "--task",
        str(ADVERSARIAL / "task.py"),
        "--candidate",
        str(tmp_path / "absent.py"),
        env_cache=config.cache_dir,
    )
    assert out.returncode == 2 and "candidate file not found" in out.stderr


@pytest.mark.parametrize("command", [[], ["tasks"], ["eval"], ["run"]])
def test_cli_help_works_everywhere(command):
    out = subprocess.run(
        [sys.executable, "-m", "speedforge.cli", *command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "usage:" in out.stdout


class _ReplayedGraphOutput:
    """Stands in for a CUDA graph's output after the next replay overwrote it: torch raises on
    any access to its storage (the real one needs a GPU: tests/test_evaluator_gpu.py)."""

    device = "cuda:0"

    def untyped_storage(self):
        raise RuntimeError(
            "Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run."
        )


def test_an_output_overwritten_by_a_graph_replay_counts_as_aliasing() -> None:
    import torch

    from speedforge.evaluator.checks import overlaps as _overlaps

    fresh = types.SimpleNamespace(device="cuda:0", untyped_storage=lambda: torch.empty(4).untyped_storage())
    assert _overlaps(fresh, _ReplayedGraphOutput())
    broken = types.SimpleNamespace(
        device="cuda:0", untyped_storage=lambda: (_ for _ in ()).throw(RuntimeError("other"))
    )
    with pytest.raises(RuntimeError, match="other"):
        _overlaps(fresh, broken)


def test_eval_and_a_sweep_share_one_build_of_a_candidate(add_task, config):
    """`speedforge eval` passes the configured evaluator (no architecture list); a sweep's build
    workers get the pools' list (sweep_evaluator_config). A CPU family's build does not depend
    on it: a build through the sweep's config is the one eval finds."""
    from speedforge.cluster.pools import sweep_evaluator_config
    from speedforge.config import default_pools

    eval_config = config  # its cache may hold this build already (test_build_is_cached_...): one build either way
    sweep_config = sweep_evaluator_config(eval_config, {name: default_pools()[name] for name in ("cpu", "H100")})
    assert sweep_config.cuda_arch_list == "9.0"
    candidate = _cand(add_task, (DATA / "cpp_add_fast.py").read_text())
    swept = build_candidate(add_task, candidate, sweep_config)
    assert swept.ok, swept.failure
    again = build_candidate(add_task, candidate, eval_config)
    assert again.ok and again.cached and again.key == swept.key


def test_a_gpu_build_key_names_the_visible_gpu_when_no_list_is_configured(monkeypatch):
    from speedforge.evaluator import buildcache

    monkeypatch.setattr(buildcache, "visible_cuda_arch", lambda: "9.0")
    assert buildcache.build_arch("cuda", "") == "9.0"  # speedforge eval on an H100
    assert buildcache.build_arch("cuda", "8.0;9.0") == "8.0;9.0"  # a sweep over A100 and H100: a fat build
    assert buildcache.build_arch("cpu", "9.0") == ""
