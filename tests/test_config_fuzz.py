"""Random and hostile YAML into the config loader: every text either loads or is refused with the
loader's own one-line ConfigError, quickly, and the message stays short whatever the text holds.

A seeded fuzzer (no extra dependency), bounded in time so that it runs in every test run:
SPEEDFORGE_FUZZ_SECONDS (default 3) and SPEEDFORGE_FUZZ_SEED (default 0) widen or move it.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from speedforge.config import Config, ConfigError, load_config, loads_config

SECONDS = float(os.environ.get("SPEEDFORGE_FUZZ_SECONDS", "3"))
SEED = int(os.environ.get("SPEEDFORGE_FUZZ_SEED", "0"))
CASE_SECONDS = 2.0  # one case, on a loaded 2-core machine; the bounds make each take milliseconds
MESSAGE_CHARS = 1200  # a refusal names the file, a key path and a few bounded values: never more

VALID = [
    "evaluator:\n  screen: report\n  cache_dir: /tmp/sf\n  run_timeout_s: 60\n",
    "service:\n  pools:\n    T4: {workers: 0, cuda_arch: '7.5', resources: {gpu_t4: 1}}\n",
    "base: &base {workers: 1}\n",  # an unknown key: refused, but by the loader
    "service:\n  pools:\n    A: &p {workers: 1, device: cpu}\n    B: *p\n    C:\n      <<: *p\n      workers: 2\n",
    "train:\n  run: r1\n  tasks: [cpp/softmax, cpp/rmsnorm]\n  rewards:\n    weights: {cudal1: 1.0}\n",
    "policy: {device: 'cuda:1', top_p: 0.5}\nsearch: {rounds: 2}\nmodels: {name: m.1}\n",
]
# Pieces of YAML syntax, config keys and values that checks and constructors treat specially.
TOKENS = [
    "evaluator",
    "screen",
    "cache_dir",
    "service",
    "pools",
    "resources",
    "train",
    "run",
    "tasks",
    "store",
    "uri",
    "policy",
    "device",
    "models",
    "name",
    "weights",
    "node_selector",
    ":",
    ": ",
    " ",
    "\n",
    "  ",
    "    ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "?",
    "? ",
    "|",
    ">",
    "'",
    '"',
    "#",
    "---",
    "...",
    "%YAML 1.1\n",
    "%TAG ! tag:x,2000:\n",
    "&a ",
    "*a",
    "&b ",
    "*b",
    "&a [*a]",
    "<<: ",
    "<<: *a",
    "!!map ",
    "!!seq ",
    "!!str ",
    "!!int ",
    "!!float ",
    "!!bool ",
    "!!null ",
    "!!timestamp ",
    "!!binary ",
    "!!set ",
    "!!omap ",
    "!!pairs ",
    "!!python/object/apply:os.system ",
    "!!python/name:os.getcwd ",
    "!x ",
    "!<tag:yaml.org,2002:int> ",
    "\\0",
    '"\\0"',
    '"\\x07"',
    '"\\u2028"',
    "\t",
    "\r",
    "\x85",
    "\ufeff",
    "\u2028",
    "\x00",
    "\x1b",
    "é",
    "😀",
    "\ud800",
    "1e999",
    ".inf",
    "-.inf",
    ".nan",
    "0x",
    "0x1F",
    "0o17",
    "0b101",
    "1_000",
    "2001-13-45",
    "2001-12-14t21:59:43.10-05:00",
    "yes",
    "off",
    "null",
    "~",
    "123",
    "-1",
    "1.5",
    "9" * 5000,
    "x" * 3000,
    "=",
    "@",
    "`",
    "%",
]


def token_soup(rng: random.Random) -> str:
    """Tokens strung together at random: mostly bad YAML, now and then a config."""
    return "".join(rng.choice(TOKENS) for _ in range(rng.randint(1, 60)))


def mutated(rng: random.Random) -> str:
    """A valid config with a few random edits: cut, insert a token, repeat a stretch, swap a character."""
    text = rng.choice(VALID)
    for _ in range(rng.randint(1, 6)):
        at = rng.randint(0, len(text))
        edit = rng.randrange(4)
        if edit == 0:
            text = text[:at] + text[at + rng.randint(1, 8) :]
        elif edit == 1:
            text = text[:at] + rng.choice(TOKENS) + text[at:]
        elif edit == 2:
            text = text[:at] + text[at : at + rng.randint(1, 20)] * rng.randint(2, 50) + text[at:]
        else:
            text = text[:at] + chr(rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0x10FFFF)])) + text[at + 1 :]
    return text


def nested(rng: random.Random) -> str:
    """Lists and mappings nested a random depth, flow or block style, under a config key."""
    depth = rng.randint(1, 400)
    if rng.random() < 0.5:
        opener, closer = rng.choice([("[", "]"), ("{a: ", "}")])
        return f"evaluator:\n  screen: {opener * depth}1{closer * depth}\n"
    return "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)) + f"{'  ' * depth}v\n"


def aliases(rng: random.Random) -> str:
    """An alias chain inside one value, where checks and messages walk it: each level a list of
    `fanout` aliases to the one before (an alias bomb when large)."""
    fanout, levels = rng.randint(1, 12), rng.randint(1, 12)
    items = ["&l0 [lol, lol]"] + [f"&l{i} [{', '.join([f'*l{i - 1}'] * fanout)}]" for i in range(1, levels)]
    target = rng.choice(
        [
            "evaluator:\n  screen",
            "evaluator:\n  cache_dir",
            "service:\n  pools",
            "train:\n  tasks",
            "train:\n  rewards:\n    weights",
            "service:\n  pools:\n    T4:\n      node_selector",
        ]
    )
    return f"{target}: [{', '.join(items)}]\n"


def wide(rng: random.Random) -> str:
    """Many keys or items, some long: what a refusal must not repeat in full."""
    count = rng.choice([rng.randint(1, 200), rng.randint(1, 12_000)])  # past the loader's bound on values, at times
    width = rng.randint(1, max(1, 15_000 // count))  # the text stays small enough to scan in milliseconds
    if rng.random() < 0.5:
        return "evaluator:\n" + "".join(f"  k{i}{'x' * width}: {i}\n" for i in range(count))
    return f"evaluator:\n  cache_dir: [{', '.join(['y' * width] * count)}]\n"


GENERATORS = [token_soup, mutated, nested, aliases, wide]


def check_one(text: str, where: str) -> None:
    """Load `text`: a Config, or a short one-line ConfigError; anything else fails with the case."""
    started = time.monotonic()
    try:
        loaded: Config | str = loads_config(text, where)
    except ConfigError as exc:
        loaded = str(exc)
    except Exception as exc:  # noqa: BLE001 (what the test is looking for)
        pytest.fail(f"{where}: {type(exc).__name__} instead of ConfigError for {text[:300]!r}: {exc!s:.300}")
    took = time.monotonic() - started
    if isinstance(loaded, str):
        assert "\n" not in loaded and len(loaded) <= MESSAGE_CHARS, (where, text[:300], loaded[:300])
    assert took < CASE_SECONDS, f"{where}: {took:.1f}s for {text[:300]!r}"


def test_random_and_hostile_yaml_loads_or_is_refused_in_one_line():
    rng = random.Random(SEED)
    deadline = time.monotonic() + SECONDS
    cases = 0
    while time.monotonic() < deadline:
        generate = GENERATORS[cases % len(GENERATORS)]
        check_one(generate(rng), f"seed {SEED} case {cases} ({generate.__name__})")
        cases += 1
    assert cases >= len(GENERATORS)  # every generator ran at least once


def test_random_bytes_in_a_config_file_are_refused_in_one_line(tmp_path):
    rng = random.Random(SEED)
    path = tmp_path / "speedforge.yaml"
    for case in range(50):
        data = rng.choice(VALID).encode() + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        path.write_bytes(data)
        try:
            load_config(path)
        except ConfigError as exc:
            assert "\n" not in str(exc) and len(str(exc)) <= MESSAGE_CHARS, (case, data)
