"""Vector data sets: readers for the usual file formats and seeded synthetic generators.

Formats: `.fvecs` / `.ivecs` / `.bvecs` (the TEXMEX layout of SIFT1M and GIST1M: each row is a
little-endian int32 dimension followed by that many float32 / int32 / uint8 values),
ann-benchmarks `.hdf5` (datasets `train`, `test`, optional `neighbors`; attribute `distance`),
and `.npy`. No data can be downloaded here, so `synthetic()` makes sets shaped like SIFT-128
(L2, non-negative integers), GloVe-25 (angular) and GIST-960 (L2, values in [0, 1]), drawn in
one of two ways (`DISTRIBUTIONS`):

- `clustered` (the default): 512 clusters of very uneven size (log-normal weights, the
  largest ~50x the median), their centres grouped around 32 super-centres, each cluster a
  low-dimensional (16-32) subspace with a decaying spectrum plus a little isotropic noise. As
  in real descriptors and embeddings, the local intrinsic dimension is low (`intrinsic_dimension`:
  about 9-11 at 20k vectors, 15 at 200k) and dense and sparse regions sit side by side.
- `uniform`: 32 wide, evenly weighted clusters whose
  isotropic noise dominates, so at the scale of nearest neighbours the points fill the space
  nearly uniformly (intrinsic dimension 18-57 at 20k vectors): the hard case for a graph and
  for codes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from speedforge.errors import UserError

METRICS = ("l2", "ip", "angular")


class DatasetError(UserError):
    """A data file or array that cannot be used as vectors (wrong shape, dtype, values)."""


@dataclasses.dataclass(frozen=True)
class Dataset:
    """Base vectors, queries and (when known) the true neighbours of the queries."""

    name: str
    metric: str
    base: np.ndarray  # [N x D] float32
    queries: np.ndarray  # [Q x D] float32
    neighbors: np.ndarray | None = None  # [Q x K] int64, exact nearest first

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])


def check_vectors(array: np.ndarray, what: str, dim: int | None = None) -> np.ndarray:
    """`array` as C-contiguous float32 [n x dim]; DatasetError naming what is wrong."""
    array = np.asarray(array)
    if array.ndim != 2:
        raise DatasetError(f"{what}: expected a 2-D array of vectors, got shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise DatasetError(f"{what}: empty array of shape {array.shape}")
    if dim is not None and array.shape[1] != dim:
        raise DatasetError(f"{what}: vectors have {array.shape[1]} dimensions, expected {dim}")
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise DatasetError(f"{what}: dtype {array.dtype} is not numeric")
    array = np.ascontiguousarray(array, dtype=np.float32)
    bad = ~np.isfinite(array).all(axis=1)
    if bad.any():
        raise DatasetError(
            f"{what}: {int(bad.sum())} vector(s) contain NaN or infinity (first: row {int(np.argmax(bad))})"
        )
    return array


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise DatasetError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    return metric


# ---- readers ----

_VECS_DTYPES = {".fvecs": np.float32, ".ivecs": np.int32, ".bvecs": np.uint8}


def read_vecs(path: str | Path) -> np.ndarray:
    """A TEXMEX .fvecs / .ivecs / .bvecs file as an [n x d] array of its own dtype."""
    path = Path(path)
    dtype = _VECS_DTYPES.get(path.suffix)
    if dtype is None:
        raise DatasetError(f"{path}: not a .fvecs, .ivecs or .bvecs file")
    if not path.is_file():
        raise DatasetError(f"data file not found: {path}")
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size < 4:
        raise DatasetError(f"{path}: file too short to hold a vector")
    dim = int(raw[:4].view("<i4")[0])
    width = np.dtype(dtype).itemsize
    row_bytes = 4 + dim * width
    if dim <= 0 or raw.size % row_bytes:
        raise DatasetError(
            f"{path}: size {raw.size} bytes is not a whole number of rows of dimension {dim} "
            f"({row_bytes} bytes each); wrong file type or truncated"
        )
    rows = raw.reshape(-1, row_bytes)
    dims = rows[:, :4].copy().view("<i4").ravel()
    if (dims != dim).any():
        raise DatasetError(
            f"{path}: row {int(np.argmax(dims != dim))} has dimension {int(dims[dims != dim][0])}, not {dim}"
        )
    return rows[:, 4:].copy().view(np.dtype(dtype).newbyteorder("<")).astype(dtype)


def write_vecs(path: str | Path, array: np.ndarray) -> None:
    """Write [n x d] rows in the .fvecs / .ivecs / .bvecs layout chosen by the suffix."""
    path = Path(path)
    dtype = _VECS_DTYPES.get(path.suffix)
    if dtype is None:
        raise DatasetError(f"{path}: not a .fvecs, .ivecs or .bvecs file")
    array = np.ascontiguousarray(array, dtype=dtype)
    n, d = array.shape
    rows = np.empty((n, 4 + d * array.itemsize), dtype=np.uint8)
    rows[:, :4] = np.full((n, 1), d, dtype="<i4").view(np.uint8)
    rows[:, 4:] = array.view(np.uint8).reshape(n, -1)
    rows.tofile(path)


def read_hdf5(path: str | Path) -> Dataset:
    """An ann-benchmarks HDF5 file (train, test, neighbors; attribute distance)."""
    import h5py

    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"data file not found: {path}")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise DatasetError(f"{path}: not an HDF5 file ({exc})") from None
    with f:
        missing = [k for k in ("train", "test") if k not in f]
        if missing:
            raise DatasetError(f"{path}: not an ann-benchmarks file: missing dataset(s) {missing}")
        distance = f.attrs.get("distance", "euclidean")
        distance = distance.decode() if isinstance(distance, bytes) else str(distance)
        metric = {"euclidean": "l2", "angular": "angular", "dot": "ip", "ip": "ip"}.get(distance)
        if metric is None:
            raise DatasetError(f"{path}: unsupported distance {distance!r} (euclidean, angular or dot)")
        base = check_vectors(f["train"][:], f"{path}:train")
        queries = check_vectors(f["test"][:], f"{path}:test", dim=base.shape[1])
        neighbors = np.asarray(f["neighbors"][:], dtype=np.int64) if "neighbors" in f else None
    return Dataset(name=path.stem, metric=metric, base=base, queries=queries, neighbors=neighbors)


def read_vectors(path: str | Path, dim: int | None = None) -> np.ndarray:
    """Vectors from .fvecs / .bvecs / .ivecs / .npy as checked float32 [n x d]."""
    path = Path(path)
    if path.suffix in _VECS_DTYPES:
        array = read_vecs(path)
    elif path.suffix == ".npy":
        if not path.is_file():
            raise DatasetError(f"data file not found: {path}")
        try:
            array = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise DatasetError(f"{path}: not a plain .npy array ({exc})") from None
    else:
        raise DatasetError(f"{path}: unknown vector file type (expected .fvecs, .bvecs, .ivecs, .npy or .hdf5)")
    return check_vectors(array, str(path), dim=dim)


def load_dataset(
    base: str | Path, queries: str | Path | None = None, metric: str = "l2", neighbors: str | Path | None = None
) -> Dataset:
    """A data set from an .hdf5 file, or from separate base / query (/ ground-truth) files."""
    base = Path(base)
    if base.suffix in (".hdf5", ".h5"):
        return read_hdf5(base)
    if queries is None:
        raise DatasetError(f"{base}: a query file is needed with {base.suffix} base vectors")
    check_metric(metric)
    base_vectors = read_vectors(base)
    query_vectors = read_vectors(queries, dim=base_vectors.shape[1])
    truth = None
    if neighbors is not None:
        truth = read_vecs(neighbors) if Path(neighbors).suffix == ".ivecs" else np.load(neighbors)
        truth = np.asarray(truth, dtype=np.int64)
        if truth.ndim != 2 or truth.shape[0] != query_vectors.shape[0]:
            raise DatasetError(f"{neighbors}: expected [{query_vectors.shape[0]} x k] neighbour ids, got {truth.shape}")
    return Dataset(name=base.stem, metric=metric, base=base_vectors, queries=query_vectors, neighbors=truth)


# ---- synthetic sets ----

DISTRIBUTIONS = ("clustered", "uniform")


@dataclasses.dataclass(frozen=True)
class Shape:
    """How a synthetic set imitates a real one.

    Dimensions, metric and post-processing are the real set's; the rest shape the `uniform`
    distribution, and the `clustered_*` fields the `clustered` one."""

    name: str
    dim: int
    metric: str
    latent_dim: int  # dimension of the subspace around each cluster centre
    clusters: int
    spread: float  # within-cluster spread relative to the spread of the centres
    noise: float  # isotropic noise relative to the within-cluster spread
    kind: str  # post-processing: "counts" (SIFT), "plain" (GloVe), "unit" (GIST)
    clustered_latent_dim: int = 24  # clustered: dimension of each cluster's subspace
    clustered_spread: float = 0.7  # clustered: cluster radius relative to the distance between centres


SHAPES = {
    "sift": Shape(
        "sift", 128, "l2", latent_dim=48, clusters=32, spread=1.0, noise=0.4, kind="counts", clustered_latent_dim=24
    ),
    "glove": Shape(
        "glove", 25, "angular", latent_dim=25, clusters=32, spread=1.5, noise=0.8, kind="plain", clustered_latent_dim=16
    ),
    "gist": Shape(
        "gist", 960, "l2", latent_dim=64, clusters=32, spread=1.0, noise=0.3, kind="unit", clustered_latent_dim=32
    ),
}

# The clustered distribution: cluster counts and how uneven their sizes are.
CLUSTERS = 512  # clusters per world
SUPER_CLUSTERS = 32  # groups of cluster centres
SIZE_SIGMA = 1.25  # log-normal sigma of the cluster weights: the largest ~100x the median
CLUSTER_NOISE = 0.08  # isotropic noise, relative to a cluster's radius
SPECTRUM_DECAY = 0.25  # clustered: standard deviation along the j-th latent direction ~ j^-decay


def shape(name: str) -> Shape:
    if name not in SHAPES:
        raise DatasetError(f"unknown synthetic shape {name!r}; known: {', '.join(SHAPES)}")
    return SHAPES[name]


def check_distribution(distribution: str) -> str:
    if distribution not in DISTRIBUTIONS:
        raise DatasetError(
            f"unknown synthetic distribution {distribution!r}; expected one of {', '.join(DISTRIBUTIONS)}"
        )
    return distribution


class SyntheticSpace:
    """One random world of a shape (centres, subspaces, weights); draw any number of points
    from it. `distribution` is `clustered` or `uniform` (see the module's docstring)."""

    def __init__(self, shape_name: str, seed: int, dim: int | None = None, distribution: str = "clustered"):
        self.shape = shape(shape_name)
        self.distribution = check_distribution(distribution)
        self.dim = dim or self.shape.dim
        if distribution == "uniform":
            self._uniform_world(seed)
        else:
            self._clustered_world(seed)

    def _uniform_world(self, seed: int) -> None:
        s = self.shape
        rng = np.random.default_rng([seed, 0x5F0E])
        latent = min(s.latent_dim, self.dim)
        self.centres = rng.normal(size=(s.clusters, self.dim)).astype(np.float32)
        # A decaying spectrum: a few directions carry most of the variance, as in real descriptors.
        scales = (np.arange(1, latent + 1, dtype=np.float32) ** -0.5) * s.spread * np.sqrt(self.dim / latent)
        bases = rng.normal(size=(s.clusters, latent, self.dim)).astype(np.float32) / np.sqrt(self.dim)
        self.bases = bases * scales[None, :, None]
        self.weights = rng.dirichlet(np.full(s.clusters, 2.0))
        self.noise = s.noise * s.spread  # per coordinate

    def _clustered_world(self, seed: int) -> None:
        s = self.shape
        rng = np.random.default_rng([seed, 0xC105])
        latent = min(s.clustered_latent_dim, self.dim)
        # Centres: super-centres spread like the uniform world's centres, clusters around them.
        supers = rng.normal(size=(SUPER_CLUSTERS, self.dim)).astype(np.float32)
        group = rng.integers(0, SUPER_CLUSTERS, size=CLUSTERS)
        self.centres = supers[group] + 0.5 * rng.normal(size=(CLUSTERS, self.dim)).astype(np.float32)
        # Cluster radius: a fraction of the distance between centres of one group (0.5 * sqrt(2 dim)).
        radius = s.clustered_spread * 0.5 * np.sqrt(2.0 * self.dim)
        spectrum = np.arange(1, latent + 1, dtype=np.float32) ** -SPECTRUM_DECAY
        scales = spectrum * radius / np.sqrt(float((spectrum**2).sum()))
        radii = np.exp(rng.normal(0.0, 0.3, size=CLUSTERS)).astype(np.float32)  # some clusters wider
        q, _ = np.linalg.qr(rng.normal(size=(CLUSTERS, self.dim, latent)))  # an orthonormal subspace per cluster
        self.bases = (q.transpose(0, 2, 1) * (scales[None, :] * radii[:, None])[:, :, None]).astype(np.float32)
        weights = np.exp(rng.normal(0.0, SIZE_SIGMA, size=CLUSTERS))
        self.weights = weights / weights.sum()
        self.noise = CLUSTER_NOISE * radius / np.sqrt(self.dim)  # per coordinate

    @property
    def clusters(self) -> int:
        return int(self.centres.shape[0])

    def sample(self, n: int, rng: np.random.Generator, chunk: int = 20000) -> np.ndarray:
        out = np.empty((n, self.dim), dtype=np.float32)
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            c = rng.choice(self.clusters, size=m, p=self.weights)
            x = rng.standard_normal(size=(m, self.dim), dtype=np.float32) * np.float32(self.noise)
            x += self.centres[c]
            for cluster in np.unique(c):
                rows = np.flatnonzero(c == cluster)
                z = rng.standard_normal(size=(len(rows), self.bases.shape[1]), dtype=np.float32)
                x[rows] += z @ self.bases[cluster]
            out[start : start + m] = self._finish(x)
        return out

    def _finish(self, x: np.ndarray) -> np.ndarray:
        kind = self.shape.kind
        if kind == "counts":  # SIFT: non-negative small integers
            return np.clip(np.rint(np.maximum(x, 0.0) * 40.0), 0, 255)
        if kind == "unit":  # GIST: values in [0, 1]
            return np.clip(0.5 + 0.15 * x, 0.0, 1.0)
        return x


def synthetic(
    shape_name: str, n: int, n_queries: int, seed: int, dim: int | None = None, distribution: str = "clustered"
) -> Dataset:
    """A seeded synthetic set: n base vectors and n_queries queries from the same world."""
    if n < 1 or n_queries < 1:
        raise DatasetError(f"synthetic set needs n >= 1 and n_queries >= 1, got {n}, {n_queries}")
    space = SyntheticSpace(shape_name, seed, dim=dim, distribution=distribution)
    base = space.sample(n, np.random.default_rng([seed, 1]))
    queries = space.sample(n_queries, np.random.default_rng([seed, 2]))
    suffix = "" if distribution == "clustered" else f"-{distribution}"
    return Dataset(name=f"{shape_name}{suffix}-{n}", metric=space.shape.metric, base=base, queries=queries)


def intrinsic_dimension(x: np.ndarray, k: int = 20, sample: int = 1000, seed: int = 0) -> float:
    """Local intrinsic dimension of a point set: the Levina-Bickel maximum-likelihood estimate
    from each sampled point's k nearest neighbours (in x), averaged as MacKay and Ghahramani
    suggest (mean of the inverse estimates)."""
    x = check_vectors(x, "vectors")
    if len(x) <= k + 1:
        raise DatasetError(f"intrinsic_dimension needs more than k + 1 = {k + 1} vectors, got {len(x)}")
    rng = np.random.default_rng(seed)
    rows = rng.choice(len(x), size=min(sample, len(x)), replace=False)
    xs = x.astype(np.float64)
    norms = (xs**2).sum(axis=1)
    inverse = []
    for start in range(0, len(rows), 256):
        q = xs[rows[start : start + 256]]
        d2 = np.maximum(norms[None, :] - 2.0 * q @ xs.T + (q**2).sum(axis=1)[:, None], 0.0)
        nearest = np.partition(d2, k, axis=1)[:, : k + 1]
        nearest.sort(axis=1)
        nearest = np.sqrt(np.maximum(nearest[:, 1:], 1e-12))  # column 0 is the point itself
        inverse.extend(np.log(nearest[:, -1:] / nearest[:, :-1]).mean(axis=1))
    return float(1.0 / np.mean(inverse))
