"""Whole-file writes (speedforge.files.write_whole): the store's downloads, the evaluator's pristine
timings and build index, the recorded extension sources and the report's files all use it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from speedforge.files import write_whole


def test_bytes_and_text_are_written_and_nothing_else_is_left(tmp_path: Path) -> None:
    write_whole(tmp_path / "a.bin", b"\x00\x01")
    write_whole(tmp_path / "b.json", '{"é": 1}')
    write_whole(tmp_path / "a.bin", b"new")  # over an old file
    assert (tmp_path / "a.bin").read_bytes() == b"new"
    assert (tmp_path / "b.json").read_text(encoding="utf-8") == '{"é": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin", "b.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")

    def full_disk(self, data):
        Path.write_text(self, "half")  # part of the data reached the disk
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(OSError):
        write_whole(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_writers_of_one_path_each_rename_their_own_temporary(tmp_path: Path, monkeypatch) -> None:
    """Two threads write one path at once, both held between the write and the rename; with one
    temporary name between them, one rename would fail (FileNotFoundError) or move the other's."""
    import os

    target = tmp_path / "model.safetensors"
    both_written = threading.Barrier(2, timeout=10)
    real_replace = os.replace

    def held_replace(src, dst):
        both_written.wait()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", held_replace)
    errors: list[BaseException] = []

    def writer(data: bytes) -> None:
        try:
            write_whole(target, data)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            errors.append(error)

    threads = [threading.Thread(target=writer, args=(bytes([n]) * 1000,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    data = target.read_bytes()
    assert len(data) == 1000 and len(set(data)) == 1  # one writer's file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
