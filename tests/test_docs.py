"""The documentation: a short README, and a site that builds strictly (a broken link or anchor, or
a page left out of the navigation, fails), whose reference pages are generated from the code."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import subprocess
import sys
import typing
from functools import cache
from pathlib import Path

import pytest
import yaml

from speedforge.evaluator.checks import checks_table
from speedforge.evaluator.screen import rules_table

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README_MAX_WORDS = 2600


@cache
def hooks():
    spec = importlib.util.spec_from_file_location("speedforge_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered(page: str) -> str:
    """docs/<page> as the site shows it: its placeholders replaced by the generated text."""
    return hooks().render((DOCS / page).read_text())


def nav_pages() -> list[str]:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)

    def walk(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, dict):
            return [page for value in entry.values() for page in walk(value)]
        return [page for item in entry for page in walk(item)]

    return walk(config["nav"])


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    child = subprocess.run(build, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout + child.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def test_every_page_is_in_the_navigation_and_every_nav_entry_exists():
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    nav = nav_pages()
    assert sorted(nav) == pages
    assert len(nav) == len(set(nav)), "a page listed twice"


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.split()) <= README_MAX_WORDS
    for command in ("make run", "make test"):
        assert command in text
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "the README links to no documentation page"
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"the README links to files that do not exist: {missing}"
    docs_linked = {link.removeprefix("docs/") for link in links if link.startswith("docs/")}
    measures = {page for page in nav_pages() if page.startswith("benchmarks/")} - {"benchmarks/index.md"}
    unlinked = set(nav_pages()) - {"index.md"} - measures - docs_linked
    assert not unlinked, f"pages the README does not link to: {sorted(unlinked)}"


def test_the_benchmarks_index_links_every_benchmark_page_and_results_md_points_to_the_site():
    """One page per measure, each listed on the benchmarks index (the README links the index);
    benchmarks/RESULTS.md, where people look first, names every page too."""
    index = (DOCS / "benchmarks" / "index.md").read_text()
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    pages = sorted(p.name for p in (DOCS / "benchmarks").glob("*.md") if p.name != "index.md")
    assert pages
    assert not [p for p in pages if f"]({p})" not in index], "benchmark pages the index does not link"
    assert not [p for p in pages if f"docs/benchmarks/{p}" not in results], "benchmark pages RESULTS.md does not name"


@pytest.mark.parametrize(
    "page, placeholder, made_by",
    [
        ("reference/cli.md", "cli", lambda: "usage: speedforge tasks"),
        ("reference/config.md", "config", lambda: "`evaluator.screen`"),
        ("reference/statuses-and-checks.md", "statuses", lambda: "`infra_error` | yes"),
        ("reference/statuses-and-checks.md", "checks", lambda: checks_table()),
        ("reference/statuses-and-checks.md", "screen-rules", lambda: rules_table()),
    ],
)
def test_each_generated_placeholder_is_replaced_on_its_page(page, placeholder, made_by):
    source = (DOCS / page).read_text()
    assert f"<!-- generated:{placeholder} -->" in source
    text = rendered(page)
    assert "<!-- generated:" not in text
    assert made_by() in text


def test_the_cli_reference_has_every_command_and_the_config_reference_every_section():
    from speedforge.cli import build_parser
    from speedforge.config import Config

    cli = rendered("reference/cli.md")
    (commands,) = [a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction"]
    missing = [name for name in commands.choices if f"`speedforge {name}`" not in cli]
    assert not missing, f"commands missing from the CLI reference: {missing}"
    config = rendered("reference/config.md")
    for field in dataclasses.fields(Config):
        assert f"`{field.name}." in config, f"config section {field.name} missing from the reference"


def test_an_unknown_placeholder_fails_the_build():
    with pytest.raises(ValueError, match="unknown placeholder"):
        hooks().render("<!-- generated:nothing-of-the-kind -->")


def config_classes() -> list[type]:
    """The root config and every dataclass under it."""
    from speedforge.config import Config

    found, todo = [], [Config]
    while todo:
        cls = todo.pop()
        found.append(cls)
        hints = typing.get_type_hints(cls)
        todo += [hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])]
    return found


def test_each_config_field_has_at_most_one_line_of_comment():
    """A field's comment says what it is in one line; why it is so belongs in the documentation."""
    long = []
    for cls in config_classes():
        above = 0
        for line in inspect.getsource(cls).splitlines()[1:]:
            if line.strip().startswith("#"):
                above += 1
                continue
            if re.match(r"\s{4}\w+\s*:", line) and not line.startswith(" " * 5) and above > 1:
                long.append(f"{cls.__name__}.{line.split(':')[0].strip()} ({above} lines)")
            above = 0
    assert not long, f"config fields with more than one comment line: {long}"


def test_the_config_reference_reads_a_comment_above_a_field_and_after_a_wrapped_value(monkeypatch):
    source = '''class Example:
    """An example."""

    # what a is
    a: int = 1
    b: int = setting(
        2, CHECK
    )  # what b is
    c: int = 3
'''
    monkeypatch.setattr(inspect, "getsource", lambda obj: source)
    assert hooks()._field_comments(object) == {"a": "what a is", "b": "what b is", "c": ""}


def test_the_example_configs_of_the_bring_your_own_model_guide_load_strictly():
    from speedforge.config import loads_config

    text = (DOCS / "guides" / "bring-your-own-model.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    configs = [loads_config(block, where="bring-your-own-model.md") for block in blocks]
    assert [c.train.strategy for c in configs] == ["lora", "fsdp"]
