"""Limits of the downloader and the unpacker, against a local HTTP server on 127.0.0.1: a
download stops at the catalogue's size, an archive that would unpack past its limit is
refused before anything is written, and the temporary folders of killed unpacks are removed
by the next unpack."""
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import memnets.data_download as dd
from memnets.datadir import DataError

TIMEOUT = 5.0
SENT_MAX = 32 << 20  # the server never sends more than this, whatever the client does


class _Handler(BaseHTTPRequestHandler):
    timeout = TIMEOUT

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.requests += 1
        if self.path == "/endless":  # no length, bytes until the client hangs up
            self.send_response(200)
            self.end_headers()
            block = b"\0" * (1 << 16)
            try:
                while self.server.sent < SENT_MAX:
                    self.wfile.write(block)
                    self.server.sent += len(block)
            except OSError:
                pass
            return
        if self.path == "/announced":  # says it is huge
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 40))
            self.end_headers()
            try:
                self.wfile.write(b"\0" * 1024)
            except OSError:
                pass
            return
        self.send_response(404)
        self.end_headers()


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.requests, srv.sent = 0, 0
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    srv.base = f"http://127.0.0.1:{srv.server_address[1]}"
    yield srv
    srv.shutdown()
    srv.server_close()


def _entry(path, size, url="http://example.invalid/endless"):
    return dd.RemoteFile(path, url, "0" * 64, size)


def test_an_endless_download_stops_at_the_catalogue_size(server, tmp_path):
    entry = _entry("babi/x.tar.gz", 100_000)
    t0 = time.monotonic()
    with pytest.raises(DataError, match="more than the 100000 bytes"):
        dd.download_file(entry, tmp_path, url_base=server.base, timeout=TIMEOUT)
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "babi/x.tar.gz.part").exists() and not (tmp_path / "babi/x.tar.gz").exists()
    assert server.sent < SENT_MAX  # the client hung up long before the server's own bound


def test_an_announced_oversize_is_refused_before_reading(server, tmp_path):
    entry = _entry("babi/x.tar.gz", 100_000, "http://example.invalid/announced")
    with pytest.raises(DataError, match="announces"):
        dd.download_file(entry, tmp_path, url_base=server.base, timeout=TIMEOUT)
    assert not (tmp_path / "babi/x.tar.gz").exists()


def test_a_download_without_a_size_has_a_ceiling(server, tmp_path, monkeypatch):
    monkeypatch.setattr(dd, "DOWNLOAD_MAX", 200_000)
    with pytest.raises(DataError, match="more than the 200000 bytes"):
        dd.download_file(_entry("omniglot/splits/x.txt", None), tmp_path, url_base=server.base, timeout=TIMEOUT)
    assert not (tmp_path / "omniglot/splits/x.txt.part").exists()


def _bomb_tar(path, top, size):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"{top}/zeros.bin")
        info.size = size
        tar.addfile(info, io.BytesIO(b"\0" * size))
        small = tarfile.TarInfo(f"{top}/a.txt")
        small.size = 3
        tar.addfile(small, io.BytesIO(b"abc"))
    path.write_bytes(data.getvalue())


def _bomb_zip(path, top, size):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{top}/zeros.bin", b"\0" * size)


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_an_archive_past_its_limit_is_refused(tmp_path, kind):
    archive = tmp_path / ("a.tar.gz" if kind == "tar" else "a.zip")
    (_bomb_tar if kind == "tar" else _bomb_zip)(archive, "top", 4 << 20)
    assert archive.stat().st_size < 100_000
    with pytest.raises(DataError, match="would unpack to"):
        dd.unpack(archive, "top", max_bytes=1 << 20)
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name]  # nothing written, nothing left
    assert dd.unpack(archive, "top", max_bytes=8 << 20).is_dir()  # within its limit it unpacks


def test_the_default_unpack_limit_applies(tmp_path, monkeypatch):
    archive = tmp_path / "a.tar.gz"
    _bomb_tar(archive, "top", 2 << 20)
    monkeypatch.setattr(dd, "UNPACK_MAX", 1 << 20)
    with pytest.raises(DataError, match="would unpack to"):
        dd.unpack(archive, "top")


def test_download_unpacks_within_the_catalogue_limit(tmp_path, monkeypatch):
    """``download(do_unpack=True)`` passes each entry's ``unpacked_max`` on."""
    archive = tmp_path / "src.tar.gz"
    _bomb_tar(archive, "top", 2 << 20)
    blob = archive.read_bytes()
    entry = dd.RemoteFile("ds/src.tar.gz", "http://example.invalid/x", hashlib.sha256(blob).hexdigest(), len(blob),
                          unpack="top", unpacked_max=1 << 20)
    (tmp_path / "d/ds").mkdir(parents=True)
    (tmp_path / "d/ds/src.tar.gz").write_bytes(blob)  # already present: verified, not downloaded
    with pytest.raises(DataError, match="would unpack to"):
        dd.download(["ds"], tmp_path / "d", do_unpack=True, catalogue={"ds": (entry,)})
    assert not (tmp_path / "d/ds/top").exists()


def test_catalogue_archives_have_limits():
    for entries in dd.CATALOGUE.values():
        for e in entries:
            assert e.size is not None or not e.unpack
            if e.unpack:
                assert e.unpacked_max is not None and e.unpacked_max < 4 << 30


def test_stale_unpack_folders_are_removed(tmp_path):
    archive = tmp_path / "a.tar.gz"
    _bomb_tar(archive, "top", 1000)
    stale = tmp_path / ".top.unpack-abc123"
    (stale / "top").mkdir(parents=True)
    (stale / "top" / "big").write_bytes(b"x" * 1000)
    other = tmp_path / ".other.unpack-abc123"  # another archive's: not this unpack's business
    other.mkdir()
    dd.unpack(archive, "top")
    assert not stale.exists() and other.exists()
    (stale / "top").mkdir(parents=True)  # also when the folder is already unpacked
    dd.unpack(archive, "top")
    assert not stale.exists()


def test_a_killed_unpack_is_cleaned_up_and_a_running_one_is_not(tmp_path):
    archive = tmp_path / "a.tar.gz"
    _bomb_tar(archive, "top", 1000)
    killed = tmp_path / ".top.unpack-killed"
    killed.mkdir()
    code = ("import os, sys, memnets.data_download as dd; fd = dd._claim(__import__('pathlib').Path(sys.argv[1])); "
            "os.kill(os.getpid(), 9)")
    res = subprocess.run([sys.executable, "-c", code, str(killed)], timeout=120)
    assert res.returncode == -9
    running = tmp_path / ".top.unpack-running"
    running.mkdir()
    fd = dd._claim(running)  # held, as by an unpack in progress
    try:
        dd.unpack(archive, "top")
        assert not killed.exists()
        if fd is not None:
            assert running.exists()
    finally:
        if fd is not None:
            os.close(fd)


def test_download_without_unpack_also_removes_stale_unpack_folders(tmp_path):
    blob = b"not an archive, never unpacked here"
    entry = dd.RemoteFile("ds/a.tar.gz", "http://example.invalid/x", hashlib.sha256(blob).hexdigest(), len(blob),
                          unpack="top")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds/a.tar.gz").write_bytes(blob)
    stale = tmp_path / "ds/.top.unpack-x1y2"
    (stale / "top").mkdir(parents=True)
    dd.download(["ds"], tmp_path, catalogue={"ds": (entry,)})
    assert not stale.exists()
