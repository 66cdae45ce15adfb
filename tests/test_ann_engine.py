"""The native engine: recall against exact search, SIMD kernels, save/load, bad input."""

import numpy as np
import pytest

from speedforge.ann.datasets import synthetic
from speedforge.ann.groundtruth import exact_knn, recall_at_k
from speedforge.ann.engine import baseline

eng = baseline()


@pytest.fixture(scope="module")
def sift():
    return synthetic("sift", 4000, 200, seed=7)


@pytest.mark.parametrize(
    "shape_name,quantization", [("sift", "sq8"), ("sift", "none"), ("glove", "sq8"), ("glove", "none")]
)
def test_recall_at_high_ef_matches_exact_search(shape_name, quantization):
    ds = synthetic(shape_name, 4000, 200, seed=3)
    index = eng.Index(ds.dim, ds.metric, M=12, ef_construction=80, quantization=quantization)
    index.build(ds.base, threads=2)
    truth = exact_knn(ds.base, ds.queries, 10, ds.metric)
    labels, dists = index.search(ds.queries, k=10, ef=128)
    assert recall_at_k(labels, truth) >= 0.97
    assert (np.diff(dists, axis=1) >= -1e-5).all()  # ascending exact distances
    low, _ = index.search(ds.queries, k=10, ef=10)
    assert recall_at_k(low, truth) < recall_at_k(labels, truth)


def test_inner_product_metric_finds_largest_dot_products():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(3000, 24)).astype(np.float32)
    queries = rng.normal(size=(100, 24)).astype(np.float32)
    index = eng.Index(24, "ip", M=16, ef_construction=100)
    index.build(base, threads=1)
    labels, dists = index.search(queries, k=5, ef=200)
    truth = exact_knn(base, queries, 5, "ip")
    assert recall_at_k(labels, truth, 5) >= 0.9
    np.testing.assert_allclose(dists[:, 0], 1.0 - (base[labels[:, 0]] * queries).sum(1), rtol=1e-4, atol=1e-4)


def test_graph_degree_is_bounded_and_entry_is_on_top_level(sift):
    index = eng.Index(sift.dim, "l2", M=8, ef_construction=40)
    index.build(sift.base, threads=2)
    degrees = [len(index.neighbors(i)) for i in range(index.size)]
    assert max(degrees) <= 16 and min(degrees) >= 1
    assert index.level(index.entry) == index.max_level
    assert index.memory_bytes > sift.base.nbytes


def test_every_simd_level_agrees_with_numpy():
    rng = np.random.default_rng(1)
    levels = ["scalar", "avx2", "avx512"]
    for dim in (3, 25, 128, 960):
        a, b = rng.normal(size=(2, dim)).astype(np.float32)
        for level in levels:
            try:
                l2 = eng.distance(a, b, "l2", level)
            except ValueError:  # this CPU lacks the level
                continue
            assert l2 == pytest.approx(float(((a - b) ** 2).sum()), rel=1e-4)
            assert eng.distance(a, b, "ip", level) == pytest.approx(1.0 - float(a @ b), rel=1e-4, abs=1e-4)
    assert eng.simd_level() in levels


def test_every_simd_level_computes_the_integer_code_distances_exactly():
    rng = np.random.default_rng(4)
    for dim in (5, 25, 48, 128, 960):
        q = rng.integers(-255, 511, size=dim).astype(np.int16)
        c = rng.integers(0, 256, size=dim).astype(np.uint8)
        want_l2 = float(((q.astype(np.int64) - c) ** 2).sum())
        for level in ("scalar", "avx2", "avx512"):
            try:
                got = eng.sq8_distance(q, c, "l2", level)
            except ValueError:
                continue
            assert got == pytest.approx(want_l2, rel=1e-6)
            assert eng.sq8_distance(q // 8, c, "ip", level) == pytest.approx(
                -float(((q // 8).astype(np.int64) * c).sum()), rel=1e-6
            )


def test_save_load_round_trip_gives_identical_results(sift, tmp_path):
    index = eng.Index(sift.dim, "l2", M=8, ef_construction=40, quantization="sq8")
    index.build(sift.base, threads=2)
    path = tmp_path / "index.sfann"
    index.save(str(path))
    loaded = eng.Index.load(str(path))
    assert (loaded.size, loaded.dim, loaded.M, loaded.metric, loaded.quantization) == (4000, 128, 8, "l2", "sq8")
    a = index.search(sift.queries, 10, 32)
    b = loaded.search(sift.queries, 10, 32)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_load_rejects_a_file_that_is_not_an_index(tmp_path):
    bad = tmp_path / "bad.sfann"
    bad.write_bytes(b"not an index at all")
    with pytest.raises(RuntimeError, match="not a speedforge ANN index"):
        eng.Index.load(str(bad))
    truncated = tmp_path / "short.sfann"
    index = eng.Index(4, "l2")
    index.build(np.eye(4, dtype=np.float32) + np.arange(4, dtype=np.float32)[:, None], threads=1)
    index.save(str(truncated))
    truncated.write_bytes(truncated.read_bytes()[:80])
    with pytest.raises(RuntimeError, match="truncated"):
        eng.Index.load(str(truncated))


def test_bad_input_is_rejected_with_a_clear_message(sift):
    index = eng.Index(sift.dim, "l2", M=8, ef_construction=40)
    bad = sift.base[:100].copy()
    bad[17, 3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite values .*row 17"):
        index.build(bad)
    with pytest.raises(ValueError, match=r"shape \(n, 128\), got shape \(100, 64\)"):
        index.build(sift.base[:100, :64])
    with pytest.raises(RuntimeError, match="not built"):
        index.search(sift.queries, 10, 32)
    index.build(sift.base[:100], threads=1)
    with pytest.raises(ValueError, match="k=101 is larger than the index"):
        index.search(sift.queries, 101, 200)
    with pytest.raises(ValueError, match="queries contain NaN"):
        index.search(np.full((2, 128), np.inf, dtype=np.float32), 5, 20)
    with pytest.raises(RuntimeError, match="already built"):
        index.build(sift.base[:100])
    with pytest.raises(ValueError, match="unknown metric"):
        eng.Index(8, "hamming")


@pytest.mark.parametrize("module", ["construction", "search", "refinement"])
def test_a_module_rebuilt_from_its_own_source_behaves_exactly_like_the_engine(module, tmp_path, sift):
    from speedforge.ann.engine import build_candidate, load_extension, module_source

    source = module_source(module)
    marker = {"construction": "hnsw-heuristic", "search": "beam-prefetch", "refinement": "exact-rerank"}[module]
    built = build_candidate(source.replace(f'"{marker}"', '"rebuilt"'), module, tmp_path)
    cand = load_extension(built.path)
    results = []
    for mod in (eng, cand):
        index = mod.Index(sift.dim, "l2", M=8, ef_construction=40)
        index.build(sift.base[:1500], threads=1)
        results.append((index.modules, index.search(sift.queries, 10, 32)))
    assert results[1][0][module] == "rebuilt" and results[0][0][module] == marker
    np.testing.assert_array_equal(results[0][1][0], results[1][1][0])
