"""Shared fixtures.

S3 in tests is a real SeaweedFS server (speedforge.store.s3server), started once per test session on
127.0.0.1 with free ports, a temporary data dir and generated credentials:

    def test_something(s3_env, s3_uri):       # env points boto3/speedforge at the server
        store = open_store(s3_uri)             # a fresh, empty prefix for this test
        ...

    def test_other(s3_server):                # the running SeaweedServer itself
        client = s3_server.client()            # boto3 client with its credentials
        client.list_objects_v2(Bucket=s3_server.bucket)

Do not stop the session server in a test; start your own SeaweedServer for that.

Two more things are made once per session, because they cost tens of seconds each:

    def test_plumbing(tiny_model):             # a folder: a 2-layer random Llama, SmolLM2's tokenizer
        PolicyConfig(model=tiny_model, device="cpu")

    def test_measures(warm_cache):             # a cache dir in which one built-in cpp candidate is built
        EvaluatorConfig(cache_dir=warm_cache.cache_dir), find_task(warm_cache.task_id)

The warm cache is shared in place by every test that uses it: what a test keeps under its cache
dir besides builds (run-s3, pipeline-s3) is that test's alone only while no other test using the
warm cache runs the same command. A test that counts compiles or tests the build cache itself
keeps a cold cache of its own.
"""

from __future__ import annotations

import dataclasses
import os
import uuid

# Under `make test` each pytest-xdist worker is one of as many processes as the machine has cores, and
# the tests start more (Ray, sandboxes, pipeline steps). A math library that starts a thread per core in
# each of them oversubscribes the cores, and its threads spin while they wait. One thread each, unless
# the caller says otherwise; the evaluator sets its sandboxes' threads itself (evaluator.cpu_threads).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import pytest

from speedforge.store.s3server import SeaweedServer

S3_BUCKET = "speedforge-test"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A running SeaweedFS with bucket S3_BUCKET; has .endpoint, .access_key, .secret_key, .bucket, .env()."""
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"), bucket=S3_BUCKET)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The session server's endpoint and credentials in the AWS_* / SPEEDFORGE_S3_ENDPOINT env vars."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_uri(s3_env, request):
    """A fresh `s3://<bucket>/<prefix>` for this test alone (the env points at the server)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"s3://{s3_env.bucket}/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A 2-layer Llama with SmolLM2's tokenizer and chat template (random weights), for tests of
    the plumbing around a policy (the default model's own tests load the default model)."""
    import torch

    transformers = pytest.importorskip("transformers", reason="the tiny model needs the 'train' extra")
    from speedforge.policy.backends import resolve_model

    folder, gguf_file, _ = resolve_model("")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-model")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@dataclasses.dataclass(frozen=True)
class WarmCache:
    """An evaluator cache dir in which the candidate of `task_id` is built."""

    cache_dir: str
    task_id: str


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory) -> WarmCache:
    """A cache dir shared by the session's tests, with one built-in cpp candidate built in it once:
    the first of a staged builtin:cpp data set (staging sorts candidates by id), which a pipeline
    with a budget of one candidate measures. Shared in place: a build is reused only at the path
    it was built at (its ninja files name that path)."""
    from speedforge.config import EvaluatorConfig
    from speedforge.evaluator import build_candidate
    from speedforge.tasks import builtin_candidates, find_task

    cache_dir = str(tmp_path_factory.mktemp("warm-cache"))
    candidate = min(builtin_candidates("cpp"), key=lambda c: c.candidate_id)
    build = build_candidate(find_task(candidate.task_id), candidate, EvaluatorConfig(cache_dir=cache_dir))
    assert build.ok, build.failure
    return WarmCache(cache_dir, candidate.task_id)


# The modules that take longest under `make test` (seconds of work on a 2-core machine, 2026-11-27: 221,
# 141, 96, 72, 67, 61, 60, 55, 52, 51, 49), handed out first. pytest-xdist gives a worker a file at a time
# in collection order (the Makefile passes --no-loadscope-reorder; xdist otherwise orders files by their
# number of tests, which put a 5-minute file 70th of 84); a long file handed out last keeps one worker busy
# while the other has nothing left. Every other module keeps its place after these.
LONGEST_FIRST = (
    "test_train_stages.py",
    "test_cluster_service.py",
    "test_evaluator.py",
    "test_sandbox_confinement.py",
    "test_sandbox_lifetime.py",
    "test_extensions_prebuilt.py",
    "test_evaluator_adversarial.py",
    "test_s3server.py",
    "test_evaluator_modes.py",
    "test_train_ray_job.py",
    "test_cluster_cli.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each module keeps its order
