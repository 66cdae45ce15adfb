"""Config values are checked at load and when built in code: each mistake is one line naming the
file, the key and what is allowed."""

from __future__ import annotations

import dataclasses

import pytest

from speedforge.config import (
    Config,
    ConfigError,
    EvaluatorConfig,
    PoolConfig,
    SearchConfig,
    ServiceConfig,
    StoreConfig,
    load_config,
)
from speedforge.errors import UserError

TYPOS = [  # (YAML, what the one-line error must say after "<file>: ")
    ("evaluator:\n  screen: bogus\n", "evaluator.screen: expected one of enforce, report, got 'bogus'"),
    ("evaluator:\n  screen: off\n", "evaluator.screen: expected one of enforce, report, got false (YAML reads"),
    ("evaluator:\n  screen: yes\n", "evaluator.screen: expected one of enforce, report, got true (YAML reads"),
    ("policy:\n  model: no\n", "policy.model: expected a string, got false (YAML reads"),
    ("evaluator:\n  cache_dir: ''\n", "evaluator.cache_dir: expected a non-empty string, got ''"),
    ("evaluator:\n  run_timeout_s: -1\n", "evaluator.run_timeout_s: expected a number > 0, got -1"),
    ("evaluator:\n  build_timeout_s: 0\n", "evaluator.build_timeout_s: expected a number > 0, got 0"),
    ("evaluator:\n  correctness_trials: 0\n", "evaluator.correctness_trials: expected a number >= 1, got 0"),
    ("evaluator:\n  timed_calls: 0\n", "evaluator.timed_calls: expected a number >= 1, got 0"),
    ("evaluator:\n  build_jobs: -2\n", "evaluator.build_jobs: expected a number >= 0, got -2"),
    ("evaluator:\n  build_spare_cpus: -2\n", "evaluator.build_spare_cpus: expected a number >= -1, got -2"),
    ("evaluator:\n  atol: -0.1\n", "evaluator.atol: expected a number >= 0, got -0.1"),
    ("evaluator:\n  correctness_trials: three\n", "evaluator.correctness_trials: expected int, got 'three'"),
    ("evaluator:\n  scren: report\n", "evaluator: unknown key(s) 'scren'; known: screen, cache_dir"),
    ("policy:\n  device: gpu\n", "policy.device: expected auto, cpu, cuda or cuda:N, got 'gpu'"),
    ("policy:\n  top_p: 1.5\n", "policy.top_p: expected a number > 0 and <= 1, got 1.5"),
    ("policy:\n  max_new_tokens: 0\n", "policy.max_new_tokens: expected a number >= 1, got 0"),
    ("search:\n  samples: 0\n", "search.samples: expected a number >= 1, got 0"),
    ("store:\n  upload_threads: 0\n", "store.upload_threads: expected a number >= 1, got 0"),
    ("service:\n  build_nice_last: 20\n", "service.build_nice_last: 20 is not a niceness step from 0 to 19"),
    ("service:\n  retries: -1\n", "service.retries: expected a number >= 0, got -1"),
    (
        "service:\n  pools:\n    T4:\n      device: gpu\n",
        "service.pools.T4.device: expected one of cuda, cpu, got 'gpu'",
    ),
    ("service:\n  pools:\n    T4:\n      cuda_arch: sm75\n", 'service.pools.T4.cuda_arch: expected "" or a compute'),
    ("- evaluator\n", "expected a mapping, got ['evaluator']"),
    ("evaluator: [1, 2\n", "not valid YAML at line 2, column 1"),
]


@pytest.mark.parametrize("text, message", TYPOS, ids=[t.split("\n")[0] + t.split("\n")[1].strip() for t, _ in TYPOS])
def test_a_config_mistake_is_one_line_naming_the_file_the_key_and_what_is_allowed(tmp_path, text, message):
    path = tmp_path / "speedforge.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    line = str(caught.value)
    assert line.startswith(f"{path}: ") and message in line
    assert "\n" not in line


@pytest.mark.parametrize(
    "write, message",
    [
        (None, "config file not found"),
        (lambda p: p.mkdir(), "is not a file"),
        (lambda p: p.write_bytes(b"\xff\xfe\x00\x81 binary"), "is not UTF-8 text"),
    ],
)
def test_a_missing_folder_or_binary_config_file_is_one_line(tmp_path, write, message):
    path = tmp_path / "speedforge.yaml"
    if write:
        write(path)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path)
    assert "\n" not in str(caught.value)


def test_config_errors_are_user_errors():
    assert issubclass(ConfigError, UserError)


def test_documented_special_values_and_quoted_words_are_accepted(tmp_path):
    path = tmp_path / "speedforge.yaml"
    path.write_text(
        'evaluator:\n  screen: "report"\n  build_jobs: 0\n  seed: null\n  l2_flush_mb: 0\n'
        "service:\n  build_workers: 0\n  pools:\n    T4: {workers: 0, cuda_arch: '7.5'}\n"
        "policy:\n  backend: openai\n  device: cuda:1\n  cpu_threads: 0\n  tau: 0\n"
    )
    config = load_config(path)
    assert config.evaluator.screen == "report" and config.evaluator.build_jobs == 0
    assert config.service.pools["T4"].workers == 0 and config.policy.device == "cuda:1"


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: EvaluatorConfig(screen="bogus"), "EvaluatorConfig.screen: expected one of enforce, report"),
        (lambda: EvaluatorConfig(run_timeout_s=-1.0), "EvaluatorConfig.run_timeout_s: expected a number > 0"),
        (lambda: PoolConfig(device="tpu"), "PoolConfig.device: expected one of cuda, cpu"),
        (lambda: ServiceConfig(max_in_flight=0), "ServiceConfig.max_in_flight: expected a number >= 1"),
        (lambda: SearchConfig(rounds=0), "SearchConfig.rounds: expected a number >= 1"),
        (lambda: StoreConfig(read_timeout_s=0.0), "StoreConfig.read_timeout_s: expected a number > 0"),
        (
            lambda: dataclasses.replace(EvaluatorConfig(), correctness_trials=0),
            "correctness_trials: expected a number >= 1",
        ),
    ],
)
def test_dataclasses_built_in_code_are_checked_too(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_valid_dataclasses_built_in_code_keep_working(tmp_path):
    config = EvaluatorConfig(screen="report", cache_dir=str(tmp_path), run_timeout_s=60.0)
    assert dataclasses.replace(config, screen="enforce").screen == "enforce"
    assert Config().policy.backend == "hf"


OUT_OF_RANGE = [  # (YAML, what the one-line error must say after "<file>: ")
    ("evaluator:\n  run_timeout_s: .inf\n", "evaluator.run_timeout_s: expected a finite number, got inf"),
    ("evaluator:\n  build_timeout_s: -.inf\n", "evaluator.build_timeout_s: expected a number > 0, got -inf"),
    ("evaluator:\n  atol: .nan\n", "evaluator.atol: expected a number >= 0, got nan"),
    ("evaluator:\n  run_timeout_s: 2592001\n", "evaluator.run_timeout_s: expected at most 2592000 (30 days"),
    ("evaluator:\n  memory_limit_mb: 99999999999999999999999\n", "evaluator.memory_limit_mb: expected at most"),
    ("evaluator:\n  disk_limit_mb: 2000000\n", "evaluator.disk_limit_mb: expected at most 1048576 (1 TiB in MiB)"),
    ("evaluator:\n  seed: 99999999999999999999999\n", "evaluator.seed: expected at most 2**63 - 1"),
    ("store:\n  retry_s: .inf\n", "store.retry_s: expected a finite number, got inf"),
    ("service:\n  pools:\n    T4:\n      resources: {gpu_t4: .inf}\n", "service.pools.T4.resources: expected a finite"),
    ("train:\n  rewards:\n    weights: {cudal1: .inf}\n", "train.rewards.weights: expected a finite number, got inf"),
    ("evaluator:\n  run_timeout_s: 5\n  run_timeout_s: 6\n", "key 'run_timeout_s' is given twice (lines 2 and 3)"),
    ("evaluator:\n  screen: report\nevaluator:\n  screen: enforce\n", "key 'evaluator' is given twice (lines 1 and 3)"),
    ("", "the file holds no settings (it is empty, or only comments); leave out --config"),
    ("# nothing set here\n", "the file holds no settings (it is empty, or only comments); leave out --config"),
]


@pytest.mark.parametrize(
    "text, message", OUT_OF_RANGE, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(OUT_OF_RANGE)]
)
def test_a_non_finite_huge_repeated_or_missing_value_is_one_line(tmp_path, text, message):
    path = tmp_path / "speedforge.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    line = str(caught.value)
    assert line.startswith(f"{path}: ") and message in line and "\n" not in line


def test_memory_up_to_the_hosts_and_days_long_timeouts_are_accepted(tmp_path):
    from speedforge.config import host_memory_mb

    path = tmp_path / "speedforge.yaml"
    path.write_text(f"evaluator:\n  memory_limit_mb: {host_memory_mb()}\n  run_timeout_s: 259200\n")
    config = load_config(path)
    assert config.evaluator.memory_limit_mb == host_memory_mb() and config.evaluator.run_timeout_s == 259200.0
    with pytest.raises(ConfigError, match="expected a finite number"):
        dataclasses.replace(config.evaluator, build_timeout_s=float("inf"))


def alias_bomb(levels: int = 9, target: str = "evaluator:\n  screen") -> str:
    """YAML's "billion laughs" as the value of `target`: a list of `levels` lists, each of nine
    aliases to the one before, so that the last, expanded, holds 9**levels strings."""
    items = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    items += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"{target}: [\n" + ",\n".join(f"  {item}" for item in items) + "\n]\n"


HOSTILE = [  # (YAML, what the one-line error must say after "<file>: ")
    (alias_bomb(), "line 7: more than 10000 values, each use of an alias counting its anchor's values again"),
    (alias_bomb(target="service:\n  pools"), "more than 10000 values"),
    ("[" * 100_000, "line 1: lists and mappings nested more than 64 deep"),
    ("{a: " * 100_000, "line 1: lists and mappings nested more than 64 deep"),
    ("".join(f"{'  ' * i}k{i}:\n" for i in range(200)), "line 64: lists and mappings nested more than 64 deep"),
    (
        "a: &a [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n"
        "b: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[*a]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n",
        "nested more than 64 deep (aliases expanded)",
    ),
    ("evaluator: &a [*a]\n", "line 1: alias *a is inside its own anchor, a value that contains itself"),
    (
        'evaluator:\n  cache_dir: "/tmp/cache\\0x"\n',
        "evaluator.cache_dir: holds the control character U+0000 at position 10",
    ),
    ('store:\n  spill_dir: "/tmp/spill\\tx"\n', "store.spill_dir: holds the control character U+0009"),
    ('train:\n  work_dir: "/tmp/w\\nx"\n', "train.work_dir: holds the control character U+000A"),
    ('models:\n  cache_dir: "/tmp/\\x1b[31m"\n', "models.cache_dir: holds the control character U+001B"),
    ('store:\n  uri: "s3://b/p\\x85"\n', "store.uri: holds the control character U+0085"),
    ('train:\n  tasks: ["cpp/softmax\\0"]\n', "train.tasks: holds the control character U+0000"),
    (
        'service:\n  pools:\n    T4:\n      node_selector: {"gpu\\0": x}\n',
        "service.pools.T4.node_selector: holds the control",
    ),
    ('train:\n  run: "r\\0"\n', "train.run: not a run name: expected 1 to 100 letters, digits"),
    (f"train:\n  run: {'r' * 101}\n", "train.run: not a run name: expected at most 100 characters, got 101"),
    (f"models:\n  name: {'m' * 300}\n", "models.name: not a model name: expected at most 100 characters, got 300"),
    ("a: 2001-13-01\n", "not valid YAML at line 1, column 4: cannot read '2001-13-01' as tag:yaml.org,2002:timestamp"),
    ("a: !!timestamp abc\n", "not valid YAML at line 1, column 4: cannot read 'abc' as tag:yaml.org,2002:timestamp"),
    ("a: !!int 0x\n", "not valid YAML at line 1, column 4: cannot read '0x' as tag:yaml.org,2002:int"),
    ("a: !!bool maybe\n", "not valid YAML at line 1, column 4: cannot read 'maybe' as tag:yaml.org,2002:bool"),
    (f"evaluator:\n  seed: {'9' * 5000}\n", "not valid YAML at line 2, column 9: cannot read '999"),
    ("a: !!map [1]\n", "not valid YAML at line 1, column 4: expected a mapping, found a sequence"),
    ("a: &x 1\nb: &x 2\n", "not valid YAML at line 2, column 4: second occurrence (found duplicate anchor 'x'"),
    ("# " + "x" * (1 << 20) + "\n", "characters, more than the 1048576 a config may have"),
]


@pytest.mark.parametrize(
    "text, message", HOSTILE, ids=[m.split(":")[0][:40] + f"-{i}" for i, (_, m) in enumerate(HOSTILE)]
)
def test_hostile_yaml_is_refused_in_one_short_line_before_it_costs_time(tmp_path, text, message):
    import time

    path = tmp_path / "speedforge.yaml"
    path.write_text(text)
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    line = str(caught.value)
    assert line.startswith(f"{path}: ") and message in line, line
    assert "\n" not in line and len(line) < len(str(path)) + 400
    assert time.monotonic() - started < 5  # the alias bomb took 40 s and 1 GB before


@pytest.mark.parametrize(
    "text, message",
    [
        (f"evaluator:\n  screen: [{', '.join(['x' * 50] * 5000)}]\n", "got a list of 5000 items: "),
        (f"evaluator:\n  screen: {'x' * 100_000}\n", "expected one of enforce, report, got 'xxxx"),
        (f"policy:\n  device: {'g' * 100_000}\n", "policy.device: expected auto, cpu, cuda or cuda:N, got 'ggg"),
        (f"evaluator:\n  screen: {{{', '.join(f'k{i}: {i}' for i in range(3000))}}}\n", "got a dict of 3000 items: "),
        ("evaluator:\n" + "".join(f"  {'k' * 200}{i}: 1\n" for i in range(500)), "(and 495 more); known: screen"),
        (
            f"service:\n  pools:\n    {'p' * 1000}:\n      device: gpu\n",
            f"service.pools.{'p' * 37}....device: expected",
        ),
        (f"train:\n  sft:\n    sources: [{', '.join(['y' * 100] * 2000)}]\n", "unknown source(s) a list of 2000 items"),
    ],
)
def test_error_messages_show_a_bounded_part_of_a_huge_value(tmp_path, text, message):
    path = tmp_path / "speedforge.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    line = str(caught.value)
    assert message in line and "\n" not in line
    assert len(line) < len(str(path)) + 1000, line  # evaluator's known keys (39 of them) included


def test_control_characters_are_refused_in_dataclasses_built_in_code_too():
    with pytest.raises(ConfigError, match=r"EvaluatorConfig.cache_dir: holds the control character U\+0000"):
        EvaluatorConfig(cache_dir="/tmp/a\0b")
    with pytest.raises(ConfigError, match="StoreConfig.uri: holds the control character"):
        dataclasses.replace(StoreConfig(), uri="s3://bucket/\n")


def test_anchors_aliases_merge_keys_and_long_names_within_the_bounds_still_load(tmp_path):
    path = tmp_path / "speedforge.yaml"
    path.write_text(
        "service:\n  pools:\n    A: &pool {workers: 1, device: cpu, resources: {slot: 1}}\n    B: *pool\n"
        "    C:\n      <<: *pool\n      workers: 2\n"
        f"train:\n  run: {'r' * 100}\n  tasks: [{', '.join(f'cpp/t{i}' for i in range(2000))}]\n"
        "evaluator:\n  cache_dir: /tmp/caché dir/ünïcode\n"
    )
    config = load_config(path)
    assert config.service.pools["B"] == config.service.pools["A"] and config.service.pools["C"].workers == 2
    assert len(config.train.run) == 100 and len(config.train.tasks) == 2000
    assert config.evaluator.cache_dir == "/tmp/caché dir/ünïcode"
    path.write_text("a: " + "[" * 30 + "1" + "]" * 30 + "\n")
    with pytest.raises(ConfigError, match="unknown key"):  # 30 levels are within the bound: only the key is wrong
        load_config(path)
