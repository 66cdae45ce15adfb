"""Staging to a real SeaweedFS and a folder: versions, idempotence, interruption, integrity."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest

from speedforge.cli import main
from speedforge.records import Candidate, Task
from speedforge.store import staging
from speedforge.store.staging import list_versions, load_dataset, read_manifest, stage_dataset
from speedforge.store import CorruptObjectError, StoreError, open_store
from speedforge.tasks import builtin_tasks

REF = "class Model:\n    pass\n\ndef get_inputs():\n    return [{i}]\n\ndef get_init_inputs():\n    return []\n"


def make_items(n: int, salt: str = "") -> tuple[list[Task], list[Candidate]]:
    tasks = [
        Task(task_id=f"gen/t{i:04d}", family="cpp", name=f"t{i:04d}", source=REF.format(i=i) + salt) for i in range(n)
    ]
    candidates = [
        Candidate.make(t.task_id, f"class ModelNew:\n    k = {i}\n", origin="builtin", created_at=0.0)
        for i, t in enumerate(tasks)
    ]
    return tasks, candidates


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(tmp_path / "store")
    return open_store(request.getfixturevalue("s3_uri"))


def bucket_objects(server, prefix: str) -> dict[str, tuple[str, object]]:
    """Every object under prefix on the server, as key -> (ETag, LastModified), listed with boto3."""
    objects = {}
    for page in server.client().get_paginator("list_objects_v2").paginate(Bucket=server.bucket, Prefix=prefix):
        objects.update({o["Key"]: (o["ETag"], o["LastModified"]) for o in page.get("Contents", ())})
    return objects


def test_staged_version_round_trips(store):
    tasks, candidates = make_items(150)
    result = stage_dataset(store, "gen", tasks[::-1], candidates, source="generated", progress=False)
    assert result.created and result.version == 1 and result.counts == {"tasks": 150, "candidates": 150}
    dataset = load_dataset(store, "gen")
    assert dataset.tasks == tasks and dataset.candidates == sorted(candidates, key=lambda c: c.candidate_id)
    manifest = dataset.manifest
    assert manifest["counts"] == {"tasks": 150, "candidates": 150}
    assert len(manifest["items"]["tasks"]) == 150 and all(len(h) == 64 for h in manifest["items"]["tasks"].values())
    assert sum(p["rows"] for p in manifest["tables"]["tasks"]) == 150


def test_restaging_unchanged_content_writes_zero_objects(s3_uri, s3_server):
    tasks, candidates = make_items(100)
    store = open_store(s3_uri)
    first = stage_dataset(store, "gen", tasks, candidates, progress=False)
    prefix = s3_uri.split("/", 3)[3] + "/"
    before = bucket_objects(s3_server, prefix)
    assert first.objects_written == len(before) == 2 + 2 + 1  # 2 task parts, 2 candidate parts, manifest

    again = open_store(s3_uri)  # a fresh process's view: counters start at zero
    result = stage_dataset(again, "gen", list(reversed(tasks)), candidates, progress=False)
    assert not result.created and result.version == 1
    assert result.objects_written == 0 and again.stats.puts == 0
    assert bucket_objects(s3_server, prefix) == before  # same keys, same ETags, same timestamps


def test_changed_source_makes_a_new_version_and_reuses_unchanged_parts(store):
    tasks, candidates = make_items(100)
    stage_dataset(store, "gen", tasks, candidates, progress=False)
    changed = [dataclasses.replace(tasks[0], notes="edited")] + tasks[1:]
    result = stage_dataset(store, "gen", changed, candidates, progress=False)
    assert result.created and result.version == 2
    assert result.objects_written == 2  # the one task part that changed, then the manifest
    assert list_versions(store, "gen") == [1, 2]
    assert load_dataset(store, "gen").tasks[0].notes == "edited"
    assert load_dataset(store, "gen", version=1).tasks[0].notes == ""


def test_failure_half_way_leaves_the_previous_version_and_resumes(store, monkeypatch):
    tasks, candidates = make_items(200)
    stage_dataset(store, "gen", tasks, candidates, progress=False)
    changed = [dataclasses.replace(t, notes="v2") for t in tasks]
    real_put, puts = store.put_bytes, []

    def failing_put(key, data):
        if len(puts) == 2:
            raise StoreError("injected: connection lost")
        puts.append(key)
        real_put(key, data)

    monkeypatch.setattr(store, "put_bytes", failing_put)
    with pytest.raises(StoreError, match="injected"):
        stage_dataset(store, "gen", changed, candidates, upload_threads=1, progress=False)
    assert len(puts) == 2 and all("/objects/" in k for k in puts)  # parts written, no manifest
    assert list_versions(store, "gen") == [1]
    assert load_dataset(store, "gen").tasks == tasks

    monkeypatch.setattr(store, "put_bytes", real_put)
    result = stage_dataset(store, "gen", changed, candidates, progress=False)
    assert result.version == 2 and result.objects_written == 4 - 2 + 1  # missing task parts + manifest
    assert load_dataset(store, "gen").tasks == changed


STAGE_SCRIPT = """
import dataclasses, sys
sys.path.insert(0, {tests!r})
from test_staging import make_items
from speedforge.store.staging import stage_dataset
from speedforge.store import open_store
tasks, candidates = make_items(300, salt="# v2")
stage_dataset(open_store({uri!r}), "gen", tasks, candidates, part_rows=1, upload_threads=1, progress=False)
"""


def test_staging_killed_half_way_leaves_the_previous_version_intact(s3_uri, s3_server):
    tasks, candidates = make_items(300)
    store = open_store(s3_uri)
    stage_dataset(store, "gen", tasks, candidates, progress=False)
    prefix = s3_uri.split("/", 3)[3] + "/"
    before = bucket_objects(s3_server, prefix)
    script = STAGE_SCRIPT.format(tests=os.path.dirname(__file__), uri=s3_uri)
    child = subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            new = set(bucket_objects(s3_server, prefix)) - set(before)
            if len(new) >= 20:
                break
            time.sleep(0.05)
        assert child.poll() is None, "the staging finished before it could be killed"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    after = bucket_objects(s3_server, prefix)
    new = set(after) - set(before)
    assert len(new) >= 20 and all("/objects/" in k for k in new)  # parts only, no manifest
    assert {k: v for k, v in after.items() if k in before} == before
    fresh = open_store(s3_uri)
    assert list_versions(fresh, "gen") == [1]
    assert load_dataset(fresh, "gen").tasks == tasks


def test_corrupted_part_is_detected_on_load(s3_uri, s3_server):
    tasks, candidates = make_items(10)
    store = open_store(s3_uri)
    stage_dataset(store, "gen", tasks, candidates, progress=False)
    part = read_manifest(store, "gen")["tables"]["candidates"][0]["key"]
    client = s3_server.client()
    key = s3_uri.split("/", 3)[3] + "/" + part
    data = bytearray(client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read())
    data[-20] ^= 0x01
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=bytes(data))
    with pytest.raises(CorruptObjectError, match=f"corrupted object .*{part}"):
        load_dataset(store, "gen")


def test_same_id_with_different_content_is_refused(store):
    tasks, candidates = make_items(2)
    with pytest.raises(StoreError, match="same id 'gen/t0000'"):
        stage_dataset(store, "gen", tasks + [dataclasses.replace(tasks[0], notes="x")], [], progress=False)
    with pytest.raises(StoreError, match="not staged"):
        stage_dataset(store, "gen", tasks[:1], candidates, progress=False)


def test_loading_a_missing_data_set_says_how_to_make_it(store):
    with pytest.raises(StoreError, match="no staged data set 'nope'.*speedforge stage"):
        load_dataset(store, "nope")


def test_stage_command_reports_store_errors_in_one_line(s3_env, capsys, monkeypatch):
    assert main(["stage", "--source", "builtin:cpp", "--dest", "s3://no-such-bucket/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("speedforge stage: error: bucket 'no-such-bucket' does not exist") and "\n" not in err
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "NOT-A-KEY")
    assert main(["stage", "--source", "builtin:cpp", "--dest", f"s3://{s3_env.bucket}/x"]) == 2
    err = capsys.readouterr().err.strip()
    assert "error: access denied" in err and "\n" not in err


def test_stage_command_stages_then_finds_nothing_to_write(s3_uri, capsys):
    assert main(["stage", "--source", "builtin:cpp", "--dest", s3_uri]) == 0
    assert "staged builtin-cpp v1" in capsys.readouterr().out
    assert main(["stage", "--source", "builtin:cpp", "--dest", s3_uri]) == 0
    assert "unchanged: builtin-cpp v1 already holds this content" in capsys.readouterr().out
    assert load_dataset(open_store(s3_uri), "builtin-cpp").tasks == builtin_tasks("cpp")


def test_concurrent_staging_takes_the_next_free_version(store, monkeypatch):
    tasks, candidates = make_items(5)
    stage_dataset(store, "gen", tasks, candidates, progress=False)
    v1 = read_manifest(store, "gen")
    b = [dataclasses.replace(t, notes="b") for t in tasks]
    stage_dataset(store, "gen", b, candidates, progress=False)  # v2, written after C read the latest
    c = [dataclasses.replace(t, notes="c") for t in tasks]
    real_read, calls = staging.read_manifest, []

    def stale_first_read(store_, name, version=None):
        calls.append(version)
        return v1 if len(calls) == 1 else real_read(store_, name, version)

    monkeypatch.setattr(staging, "read_manifest", stale_first_read)
    result = stage_dataset(store, "gen", c, candidates, progress=False)
    monkeypatch.undo()
    assert result.created and result.version == 3
    assert list_versions(store, "gen") == [1, 2, 3]
    assert load_dataset(store, "gen", 2).tasks == b and load_dataset(store, "gen", 3).tasks == c
