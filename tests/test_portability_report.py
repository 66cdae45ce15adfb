"""The portability table's arithmetic on crafted results, merging separate runs, and the report
files: HTML that parses with its figures inlined, Markdown, and JSON valid against its schema."""

from __future__ import annotations

import base64
import html.parser
import json
import math

import pytest

from speedforge.ann.sweep import SweepPoint, format_curves, parse_curves
from speedforge.config import Config
from speedforge.errors import UserError
from speedforge.records import EvalResult, PoolInfo, Variant
from speedforge.reports.portability import (
    PortabilityRun,
    merge_runs,
    spearman,
    speedup_stats,
    task_order,
)
from speedforge.store import open_store

pytest.importorskip("matplotlib", reason="the report needs the 'reports' extra")
jsonschema = pytest.importorskip("jsonschema", reason="the report needs the 'reports' extra")

from speedforge.recipes.report import write_report  # noqa: E402
from speedforge.reports.portability_report import report_schema  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def variant(n: int, score: float | None = None, pool: str = "A100", origin: str = "import:cuda-l1") -> Variant:
    return Variant(
        variant_id=f"v{n}",
        task_id=f"cuda-l1/level1/{n}",
        pool=pool if score else "",
        source="src",
        status="ok" if score else "unmeasured",
        score=score,
        origin=origin,
    )


def result(
    n: int, pool: str, speedup: float | None = None, status: str = "ok", reason: str = "", log: str = ""
) -> EvalResult:
    return EvalResult(
        candidate_id=f"v{n}",
        task_id=f"cuda-l1/level1/{n}",
        pool=pool,
        status=status,
        correct=status == "ok",
        speedup=speedup if status == "ok" else None,
        reason=reason,
        device_name=f"{pool} device",
        log=log,
    )


def info(pool: str, driver: str = "550.54", torch: str = "2.5.1", at: float = 1000.0) -> PoolInfo:
    return PoolInfo(
        pool=pool, device_name=f"NVIDIA {pool}", driver=driver, torch_version=torch, cuda_version="12.4", measured_at=at
    )


# -- arithmetic ---------------------------------------------------------------------------------


def test_pool_figures_count_tasks_and_correct_results_and_average_the_correct_speedups():
    run = PortabilityRun(
        "run",
        [
            result(1, "H100", 2.0),
            result(2, "H100", 8.0),
            result(3, "H100", 1.005),
            result(4, "H100", status="incorrect", reason="max abs err 3.1"),
        ],
        [variant(n) for n in range(1, 5)],
        [info("H100")],
    )
    summary = merge_runs([run]).summary("H100")
    assert (summary.tasks, summary.evaluated, summary.correct, summary.not_run) == (4, 4, 3, 0)
    assert summary.mean == pytest.approx((2.0 + 8.0 + 1.005) / 3)
    assert summary.median == 2.0 and summary.max == 8.0
    assert summary.geomean == pytest.approx((2.0 * 8.0 * 1.005) ** (1 / 3))
    assert summary.above == 2  # 1.005x is not above 1.01x
    assert summary.statuses == {"incorrect": 1, "ok": 3}


def test_speedup_stats_of_nothing_are_empty_not_zero():
    assert speedup_stats([]) == {"mean": None, "median": None, "max": None, "geomean": None, "above": 0}


def test_regressions_are_failures_or_slowdowns_on_one_pool_that_are_fast_on_another_or_at_their_source():
    variants = [variant(1, 3.0), variant(2, 0.9), variant(3, 1.5), variant(4, 2.0)]
    results = [
        result(1, "H100", 2.5),
        result(1, "L40", status="compile_error", reason="ptxas: sm_90 only"),
        result(2, "H100", 1.4),
        result(2, "L40", 0.8),  # slow on L40, fast on H100 (its source was slow too)
        result(3, "H100", 0.95),
        result(3, "L40", 0.97),  # slow on both pools, fast only where published
        result(4, "H100", 1.0),
        result(4, "L40", 1.005),  # never slow (1.0 is not below 1.0), never fast on a pool
    ]
    table = merge_runs([PortabilityRun("run", results, variants, [info("H100"), info("L40")])])
    l40 = {r.variant_id: r for r in table.regressions("L40")}
    assert sorted(l40) == ["v1", "v2", "v3"]
    assert l40["v1"].status == "compile_error" and l40["v1"].speedup is None and "sm_90" in l40["v1"].reason
    assert l40["v1"].fast_on == (("published on A100 (cuda-l1)", 3.0), ("H100", 2.5))  # fastest first
    assert l40["v2"].speedup == 0.8 and l40["v2"].fast_on == (("H100", 1.4),)
    assert l40["v3"].fast_on == (("published on A100 (cuda-l1)", 1.5),)
    h100 = table.regressions("H100")
    assert [r.variant_id for r in h100] == ["v3"]
    assert table.summary("L40").regressions == tuple(table.regressions("L40"))


def test_published_scores_are_a_row_of_their_own_over_the_variants_measured():
    variants = [variant(1, 4.0), variant(2, 2.0), variant(3, 9.0)]  # v3 was not measured here
    table = merge_runs(
        [PortabilityRun("run", [result(1, "H100", 3.0), result(2, "H100", 1.0)], variants, [info("H100")])]
    )
    (published,) = table.source_summaries()
    assert published.pool == "published on A100 (cuda-l1)" and published.kind == "published"
    assert (published.tasks, published.mean, published.max) == (2, 3.0, 4.0)
    own = variant(5, 1.7, pool="cpu", origin="model:x@1")
    assert merge_runs([PortabilityRun("r", [result(5, "cpu", 1.6)], [own], [])]).source_summaries()[0].pool == (
        "recorded on cpu"
    )


def test_spearman_is_the_rank_correlation_with_ties_and_none_when_undefined():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks x: 1,2,3,4; y with a tie: 1, 2.5, 2.5, 4 -> r = 4.5 / sqrt(5 * 4.5)
    assert spearman([1, 2, 3, 4], [1, 5, 5, 9]) == pytest.approx(4.5 / math.sqrt(5 * 4.5))
    assert spearman([1, 2], [1, 2]) is None
    assert spearman([1, 1, 1], [1, 2, 3]) is None


def test_correlations_pair_each_source_with_each_pool_and_the_pools_with_each_other():
    variants = [variant(n, float(n)) for n in range(1, 5)]
    results = [result(n, "H100", float(n)) for n in range(1, 5)] + [result(n, "L40", 5.0 - n) for n in range(1, 5)]
    table = merge_runs([PortabilityRun("r", results, variants, [])])
    correlations = {(c.source, c.target): c for c in table.correlations()}
    assert set(correlations) == {
        ("published on A100 (cuda-l1)", "H100"),
        ("published on A100 (cuda-l1)", "L40"),
        ("H100", "L40"),
    }
    assert correlations[("published on A100 (cuda-l1)", "H100")].spearman == pytest.approx(1.0)
    assert correlations[("H100", "L40")].spearman == pytest.approx(-1.0)
    assert len(correlations[("H100", "L40")].pairs) == 4


def test_task_ids_sort_with_their_numbers_in_numeric_order():
    ids = ["cuda-l1/level1/10", "cuda-l1/level1/2", "cuda-l1/level2/1", "cpp/rmsnorm"]
    assert sorted(ids, key=task_order) == ["cpp/rmsnorm", "cuda-l1/level1/2", "cuda-l1/level1/10", "cuda-l1/level2/1"]


# -- merging runs -------------------------------------------------------------------------------


def test_runs_on_separate_machines_merge_into_one_table_keyed_by_pool_with_each_environment():
    variants = [variant(1, 2.0), variant(2, 3.0)]
    h100 = PortabilityRun(
        "s3://b/h100",
        [result(1, "H100", 2.2), result(2, "H100", 2.9)],
        variants,
        [info("H100", driver="550.54", torch="2.5.1")],
    )
    h200 = PortabilityRun(
        "s3://b/h200", [result(1, "H200", 2.4)], variants, [info("H200", driver="560.28", torch="2.6.0")]
    )
    table = merge_runs([h100, h200])
    assert list(table.pools) == ["H100", "H200"]
    assert (table.pools["H100"].driver, table.pools["H200"].driver) == ("550.54", "560.28")
    assert (table.pools["H100"].torch_version, table.pools["H200"].torch_version) == ("2.5.1", "2.6.0")
    assert table.summary("H200").not_run == 1 and table.summary("H200").evaluated == 1
    assert table.inputs == ("s3://b/h100", "s3://b/h200") and table.notes == ()


def test_a_later_run_replaces_the_same_pairs_and_a_changed_environment_is_noted():
    first = PortabilityRun(
        "a",
        [result(1, "H100", 1.5), result(2, "H100", 2.0)],
        [variant(1), variant(2)],
        [info("H100", driver="550.54", at=1000.0)],
    )
    second = PortabilityRun("b", [result(1, "H100", 1.8)], [variant(1)], [info("H100", driver="560.28", at=2000.0)])
    table = merge_runs([first, second])
    assert table.speedups("H100") == {"v1": 1.8, "v2": 2.0}
    assert table.pools["H100"].driver == "560.28"
    assert any("1 result(s)" in note for note in table.notes)
    assert any("driver 550.54 vs 560.28" in note for note in table.notes)


def test_results_of_a_plain_sweep_merge_with_the_device_their_results_name():
    table = merge_runs([PortabilityRun("sweep", [result(7, "cpu", 1.2)], [], [])])
    assert table.pools["cpu"].device_name == "cpu device" and "driver and torch unknown" in table.pools["cpu"].note
    assert table.variants["v7"].task_id == "cuda-l1/level1/7" and table.variants["v7"].score is None


def test_a_pool_with_no_results_is_a_row_marked_no_results():
    table = merge_runs([PortabilityRun("r", [result(1, "H100", 1.3)], [variant(1)], [info("H100"), info("L40")])])
    summary = table.summary("L40")
    assert summary.state == "no results" and summary.evaluated == 0 and summary.mean is None
    assert table.summary("H100").state == "ok"


# -- ann curves ---------------------------------------------------------------------------------


def test_the_curve_table_of_an_ann_log_reads_back():
    base = [SweepPoint(10, 0.8125, 12000.0), SweepPoint(40, 0.9375, 5000.0)]
    cand = [SweepPoint(10, 0.8250, 15000.0), SweepPoint(40, 0.9500, 6000.0)]
    log = "modules: x\nbuild seconds: 1\n" + "\n".join(format_curves(base, cand)) + "\n"
    assert parse_curves(log) == {"base": base, "cand": cand}
    assert parse_curves("compiler said no") is None


# -- the report files ---------------------------------------------------------------------------


class _Html(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.tables = 0
        self.text: list[str] = []
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag not in ("meta", "br"):
            self.open.append(tag)
        self.tables += tag == "table"

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, f"</{tag}> closes <{self.open[-1] if self.open else None}>"
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


def write_runs(tmp_path) -> list[str]:
    """Two results stores as two portability runs leave them: H100 with an ann result, H200 and a
    pool (L40) that recorded nothing."""
    variants = [variant(n, 1.0 + n / 2) for n in range(1, 6)]
    base = [SweepPoint(ef, 0.80 + ef / 1000, 20000.0 / ef) for ef in (10, 40, 160)]
    cand = [SweepPoint(ef, 0.81 + ef / 1000, 26000.0 / ef) for ef in (10, 40, 160)]
    ann = EvalResult(
        candidate_id="a1",
        task_id="ann/sift-search",
        pool="H100",
        status="ok",
        correct=True,
        speedup=1.3,
        log="\n".join(format_curves(base, cand)),
    )
    h100 = [result(n, "H100", 1.2 * n) for n in range(1, 5)] + [
        result(5, "H100", status="compile_error", reason="nvcc | exit 1"),
        ann,
    ]
    h200 = [result(n, "H200", 1.1 * n) for n in range(1, 6)]
    uris = []
    for name, results, pools in (("h100", h100, [info("H100")]), ("h200", h200, [info("H200"), info("L40")])):
        store = open_store(tmp_path / name)
        store.append_records("results", results)
        store.append_records("variant_set", variants)
        store.append_records("pools", pools)
        uris.append(str(tmp_path / name))
    return uris


def test_report_files_are_well_formed_with_figures_inlined_and_json_valid_against_the_schema(tmp_path):
    outcome = write_report(Config(), write_runs(tmp_path), str(tmp_path / "report"))

    data = json.loads(open(outcome.json).read())
    jsonschema.validate(data, report_schema(), cls=jsonschema.Draft202012Validator)
    assert [p["pool"] for p in data["pools"]] == ["H100", "H200", "L40"]
    assert [p["summary"]["state"] for p in data["pools"]] == ["ok", "ok", "no results"]
    assert data["pools"][0]["driver"] == "550.54" and data["pools"][0]["summary"]["correct"] == 5
    assert data["sources"][0]["pool"] == "published on A100 (cuda-l1)"
    assert data["failures"] == [
        {
            "pool": "H100",
            "task_id": "cuda-l1/level1/5",
            "variant_id": "v5",
            "status": "compile_error",
            "reason": "nvcc | exit 1",
        }
    ]
    assert data["ann_curves"][0]["task_id"] == "ann/sift-search" and len(data["ann_curves"][0]["candidate"]) == 3
    assert set(data["images"]) == {"heatmap", "distribution", "scatter", "ann_curves"}

    page = _Html()
    page.feed(open(outcome.html).read())
    page.close()
    assert page.open == [] and page.tables >= 4
    assert len(page.images) == 4
    for src in page.images:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        assert base64.b64decode(src[len(prefix) :]).startswith(PNG_SIGNATURE)
    text = " ".join(page.text)
    assert "NVIDIA H100" in text and "no results" in text and "compile_error" in text

    markdown = open(outcome.markdown).read()
    assert "| H200 | NVIDIA H200 | 550.54 | 2.5.1 | 5 | 5 |" in markdown
    assert "nvcc \\| exit 1" in markdown  # a pipe in a reason does not break the table
    for name in data["images"].values():
        assert f"]({name})" in markdown
        assert (tmp_path / "report" / name).read_bytes().startswith(PNG_SIGNATURE)


def test_the_schema_refuses_a_report_that_lost_a_section(tmp_path):
    outcome = write_report(Config(), write_runs(tmp_path), str(tmp_path / "report"))
    data = json.loads(open(outcome.json).read())
    del data["pools"][0]["summary"]["geomean"]
    with pytest.raises(jsonschema.ValidationError, match="geomean"):
        jsonschema.validate(data, report_schema(), cls=jsonschema.Draft202012Validator)


def test_a_results_store_with_nothing_in_it_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no results in .*empty.*speedforge portability"):
        write_report(Config(), [str(tmp_path / "empty")], str(tmp_path / "report"))
    assert not (tmp_path / "report").exists()
