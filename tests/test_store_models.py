"""Models in the object store (speedforge.store.models): pushed with `speedforge models push`,
loaded by URI wherever a model is named (policy.model, train.init, the pipeline's `model` and the
checkpoint the train step hands over), copied to the loading machine's cache first. The store is
the session's real S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speedforge.cli import main
from speedforge.errors import UserError
from speedforge.policy.backends import resolve_model
from speedforge.store import CorruptObjectError, open_store
from speedforge.store.models import MANIFEST, fetch_model, local_model, model_files


def test_a_model_pushed_to_the_store_loads_by_its_uri_on_a_machine_that_never_had_it(
    s3_uri, tiny_model, tmp_path, monkeypatch, capsys
):
    uri = f"{s3_uri}/models/tiny"
    assert main(["models", "push", uri, "--model", tiny_model]) == 0
    assert capsys.readouterr().out.startswith(f"{uri}: ")
    assert "config.json" in open_store(uri).list("")
    monkeypatch.setenv("SPEEDFORGE_CACHE", str(tmp_path / "elsewhere"))  # another pod's cache
    folder, gguf_file, name = resolve_model(uri)
    assert Path(folder).is_relative_to(tmp_path / "elsewhere") and gguf_file is None and name == uri
    assert (Path(folder) / "config.json").read_bytes() == (Path(tiny_model) / "config.json").read_bytes()
    transformers = pytest.importorskip("transformers")
    assert transformers.AutoConfig.from_pretrained(folder).num_hidden_layers == 2
    assert resolve_model(uri + "/")[0] == folder  # the same copy, kept while unchanged


def test_a_uri_with_no_model_under_it_is_one_line(s3_uri):
    with pytest.raises(UserError, match=r"no model at s3://\S+/nothing: the store has nothing under that prefix"):
        resolve_model(f"{s3_uri}/nothing")


def test_push_wants_a_store_uri(capsys):
    assert main(["models", "push", "/tmp/somewhere"]) == 2
    assert "'/tmp/somewhere' is not a store URI: give s3://bucket/prefix" in capsys.readouterr().err


def test_a_uri_and_a_registered_version_of_the_same_files_share_one_copy_and_a_changed_model_gets_its_own(
    s3_uri, tmp_path
):
    uri = f"{s3_uri}/models/changing"
    store = open_store(uri)
    store.put_bytes("config.json", b'{"model_type": "llama"}')
    store.put_bytes("weights.bin", b"w" * 100)
    cache = str(tmp_path / "cache")
    folder = local_model(uri, cache)
    files = model_files(uri)
    assert fetch_model(uri, cache, files) == folder  # what the registry fetches for a version: the same copy
    assert json.loads((Path(folder) / MANIFEST).read_text()) == files
    store.put_bytes("weights.bin", b"x" * 100)  # a new checkpoint under the same URI
    changed = local_model(uri, cache)
    assert changed != folder and (Path(changed) / "weights.bin").read_bytes() == b"x" * 100
    assert (Path(folder) / "weights.bin").read_bytes() == b"w" * 100  # a reader of the old copy is undisturbed
    with pytest.raises(CorruptObjectError, match="weights.bin"):
        fetch_model(uri, str(tmp_path / "other"), files)  # pinned to the old files
    assert not [p for p in (tmp_path / "other").iterdir()]  # nothing half-written left behind
