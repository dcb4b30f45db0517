"""Data directory resolution, containment and cached checksum verification."""
from __future__ import annotations

import hashlib

import pytest

from memnets import datadir


@pytest.fixture
def fake_data(tmp_path, monkeypatch):
    root = tmp_path / "data"
    (root / "set").mkdir(parents=True)
    f = root / "set" / "file.bin"
    f.write_bytes(b"hello world")
    digest = hashlib.sha256(b"hello world").hexdigest()
    (root / "SHA256SUMS").write_text(f"{digest}  set/file.bin\n")
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MEMNETS_DATA", raising=False)
    return root


def test_resolution_order(fake_data, monkeypatch, tmp_path):
    assert datadir.resolve_data_dir(fake_data) == fake_data.resolve()
    monkeypatch.setenv("MEMNETS_DATA", str(fake_data))
    assert datadir.resolve_data_dir() == fake_data.resolve()
    monkeypatch.setenv("MEMNETS_DATA", str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="MEMNETS_DATA"):
        datadir.resolve_data_dir()


def test_paths_cannot_escape(fake_data):
    assert datadir.data_file("set/file.bin", fake_data).read_bytes() == b"hello world"
    for bad in ("../secret", "set/../../x", "/etc/passwd"):
        with pytest.raises(datadir.DataError, match="data directory"):
            datadir.data_file(bad, fake_data, must_exist=False)
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        datadir.data_file("set/missing.bin", fake_data)


def test_checksum_verified_once_then_cached(fake_data, monkeypatch):
    f = fake_data / "set" / "file.bin"
    assert datadir.verify_file(f, fake_data) is True
    calls = []
    monkeypatch.setattr(datadir, "_sha256", lambda p: calls.append(p) or "0")
    assert datadir.verify_file(f, fake_data) is True  # cached: no hashing
    assert calls == []


def test_corrupt_file_named(fake_data):
    f = fake_data / "set" / "file.bin"
    f.write_bytes(b"hello w0rld")  # same size, new content and mtime
    with pytest.raises(datadir.DataError, match="file.bin"):
        datadir.verify_file(f, fake_data)


def test_real_data_checksums(real_data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    f = datadir.data_file("babi/tasks_1-20_v1-2_en_en-10k.tar.gz", real_data_dir)
    assert datadir.verify_file(f, real_data_dir) is True


def test_loaders_refuse_a_modified_archive(tmp_path, monkeypatch):
    """A data file that no longer matches SHA256SUMS is refused by the loaders, naming it."""
    from memnets.tasks import babi

    root = tmp_path / "data"
    (root / "babi").mkdir(parents=True)
    archive = root / babi.ARCHIVE  # "babi/<name>.tar.gz"
    archive.write_bytes(b"not the real archive")
    (root / "SHA256SUMS").write_text(f"{'0' * 64}  {babi.ARCHIVE}\n")
    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(datadir.DataError, match="tasks_1-20_v1-2_en_en-10k.tar.gz"):
        babi.load_task(1, "train", data_dir=root)
