"""`memnets data download|verify|where` and the loaders' archive layouts, fully offline.

Small fixture archives (bAbI, Omniglot, aclImdb, with the official member layouts) are served
from a local HTTP server on 127.0.0.1 that understands Range requests; the catalogue's digests
are replaced by the fixtures' digests.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import io
import re
import tarfile
import threading
import urllib.parse
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memnets import data_download as dd
from memnets.cli.main import main
from memnets.datadir import DataError

pytestmark = [pytest.mark.timeout(60)] if importlib.util.find_spec("pytest_timeout") else []

TIMEOUT = 5.0  # seconds for every client and server socket operation


# ----------------------------------------------------------------------------- fixtures

BABI_QA1_TRAIN = ("1 Mary moved to the bathroom.\n2 John went to the hallway.\n"
                  "3 Where is Mary? \tbathroom\t1\n")
BABI_QA1_TEST = "1 Daniel went to the garden.\n2 Where is Daniel? \tgarden\t1\n"
BABI_QA3_10K = ("1 Mary got the milk.\n2 Mary went to the office.\n3 Mary went to the garden.\n"
                "4 Where was the milk before the garden? \toffice\t1 2 3\n")


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_400_000_000
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, (2015, 10, 20, 0, 0, 0)), data)
    return buf.getvalue()


def _png(seed: int) -> bytes:
    from PIL import Image

    img = Image.new("1", (105, 105), 1)
    for i in range(30):
        img.putpixel(((seed * 7 + i * 3) % 105, (seed * 11 + i) % 105), 0)
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def _omniglot_zip(part: str, alphabet: str) -> bytes:
    return _zip({f"{part}/{alphabet}/character01/0001_{d:02d}.png": _png(d + 20 * len(part))
                 for d in range(1, 21)})


@pytest.fixture(scope="module")
def fixtures() -> dict[str, bytes]:
    """Fixture bytes per catalogue path."""
    babi = _tar_gz({
        "tasks_1-20_v1-2/LICENSE": b"CC BY 3.0\n",
        "tasks_1-20_v1-2/en/qa1_single-supporting-fact_train.txt": BABI_QA1_TRAIN.encode(),
        "tasks_1-20_v1-2/en/qa1_single-supporting-fact_test.txt": BABI_QA1_TEST.encode(),
        "tasks_1-20_v1-2/en-10k/qa3_three-supporting-facts_train.txt": BABI_QA3_10K.encode(),
        "tasks_1-20_v1-2/hn/qa1_single-supporting-fact_train.txt": "1 \u0915\n".encode(),  # skipped
    })
    imdb = _tar_gz({
        "aclImdb/README": b"Large Movie Review Dataset v1.0\n",
        "aclImdb/train/pos/0_9.txt": b"Bromwell High is a cartoon comedy.",
        "aclImdb/train/pos/1_7.txt": b"Good.",
        "aclImdb/train/neg/0_3.txt": b"Bad.",
        "aclImdb/train/unsup/0_0.txt": b"unlabelled",
        "aclImdb/test/pos/0_10.txt": b"Great!",
        "aclImdb/test/neg/0_1.txt": b"Awful.",
    })
    out = {
        dd.BABI_ARCHIVE: babi,
        "omniglot/images_background.zip": _omniglot_zip("images_background", "Latin"),
        "omniglot/images_evaluation.zip": _omniglot_zip("images_evaluation", "Angelic"),
        dd.IMDB_ARCHIVE: imdb,
    }
    for split, lines in (("train", "Latin/character01/rot000\nLatin/character01/rot090\n"),
                         ("val", "Latin/character01/rot180\n"), ("test", "Angelic/character01/rot000\n"),
                         ("trainval", "Latin/character01/rot000\nLatin/character01/rot090\n"
                                      "Latin/character01/rot180\n")):
        out[f"{dd.OMNIGLOT_SPLITS}/{split}.txt"] = lines.encode()
    return out


@pytest.fixture
def catalogue(fixtures, monkeypatch):
    """The real catalogue's paths and URLs with the fixtures' digests (patched into the module)."""
    cat = {name: tuple(dd.RemoteFile(e.path, e.url, hashlib.sha256(fixtures[e.path]).hexdigest(),
                                     len(fixtures[e.path]), e.unpack) for e in entries)
           for name, entries in dd.CATALOGUE.items()}
    monkeypatch.setattr(dd, "CATALOGUE", cat)
    monkeypatch.delenv(dd.MIRROR_ENV, raising=False)
    return cat


class _Handler(BaseHTTPRequestHandler):
    """GET with ``Range: bytes=N-`` support; behaviour set on the server object."""

    timeout = TIMEOUT

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_GET(self):
        srv = self.server
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        rng = self.headers.get("Range")
        srv.requests.append((path, rng))
        body = srv.files.get(path)
        if body is None:
            self.send_error(404)
            return
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", rng or "")
        if m and not srv.ignore_range:
            start = int(m.group(1))
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        payload = body[start:]
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if path in srv.truncate_once:  # promise every byte, send half, hang up
            srv.truncate_once.discard(path)
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(payload)


@pytest.fixture
def server(fixtures, catalogue):
    """A local server holding every fixture at its official URL path; yields it with ``.base``."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.files = {urllib.parse.urlsplit(e.url).path: fixtures[e.path]
                 for entries in catalogue.values() for e in entries}
    srv.requests, srv.truncate_once, srv.ignore_range = [], set(), False
    srv.base = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(TIMEOUT)


def _url_path(cat, rel: str) -> str:
    return next(urllib.parse.urlsplit(e.url).path for es in cat.values() for e in es if e.path == rel)


# ----------------------------------------------------------------------------- catalogue

def test_catalogue_is_well_formed():
    paths = [e.path for es in dd.CATALOGUE.values() for e in es]
    assert len(paths) == len(set(paths))
    assert set(dd.CATALOGUE) == {"babi", "omniglot", "imdb"} == set(dd.DATASETS)
    for name, entries in dd.CATALOGUE.items():
        for e in entries:
            assert re.fullmatch(r"[0-9a-f]{64}", e.sha256), e
            assert e.path.startswith(f"{name}/") and e.url.startswith(("http://", "https://"))
    assert dd.CATALOGUE["babi"][0].url == "http://www.thespermwhale.com/jaseweston/babi/tasks_1-20_v1-2.tar.gz"
    assert dd.CATALOGUE["imdb"][0].url == "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
    for name, _ in inspect.getmembers(dd):
        if name in dd.__all__ and (inspect.isfunction(getattr(dd, name)) or inspect.isclass(getattr(dd, name))):
            assert (getattr(dd, name).__doc__ or "").strip(), name


def test_rebase_url():
    assert dd.rebase_url("https://a.org/x/y.zip", "http://127.0.0.1:8/m/") == "http://127.0.0.1:8/m/x/y.zip"
    assert dd.rebase_url("https://a.org/~u/y.tgz?raw=1", "http://h") == "http://h/~u/y.tgz?raw=1"
    assert dd.rebase_url("https://a.org/x", None) == "https://a.org/x"


# ----------------------------------------------------------------------------- download + verify

def test_download_then_verify(server, tmp_path, capsys):
    d = tmp_path / "data"
    rc = main(["data", "download", "--to", str(d), "--url-base", server.base, "--quiet", "--timeout", str(TIMEOUT)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "babi/tasks_1-20_v1-2.tar.gz  (downloaded, sha256 verified)" in out
    for es in dd.CATALOGUE.values():
        for e in es:
            assert (d / e.path).is_file() and not (d / (e.path + ".part")).exists()
    assert main(["data", "verify", "--data-dir", str(d)]) == 0
    out = capsys.readouterr().out
    assert "ok        imdb/aclImdb_v1.tar.gz  (catalogue)" in out and "MISMATCH" not in out
    # a second download finds every file in place and fetches nothing
    n = len(server.requests)
    assert main(["data", "download", "babi", "--to", str(d), "--url-base", server.base, "-q"]) == 0
    assert len(server.requests) == n and "already present" in capsys.readouterr().out
    # a file changed afterwards is reported with both digests, exit 1
    (d / dd.IMDB_ARCHIVE).write_bytes(b"not the archive")
    assert main(["data", "verify", "--data-dir", str(d)]) == 1
    out = capsys.readouterr().out
    bad = hashlib.sha256(b"not the archive").hexdigest()
    assert f"MISMATCH  imdb/aclImdb_v1.tar.gz  expected {dd.CATALOGUE['imdb'][0].sha256} got {bad}" in out


@pytest.mark.parametrize("with_tqdm", [True, False])
def test_mirror_from_environment_with_progress(server, tmp_path, monkeypatch, capsys, with_tqdm):
    monkeypatch.setenv(dd.MIRROR_ENV, server.base)
    if not with_tqdm:
        monkeypatch.setitem(__import__("sys").modules, "tqdm", None)  # `import tqdm` fails
    paths = dd.download(["imdb"], tmp_path, timeout=TIMEOUT, progress=True)
    assert paths == [tmp_path / dd.IMDB_ARCHIVE] and paths[0].is_file()
    err = capsys.readouterr().err
    assert ("imdb/aclImdb_v1.tar.gz" in err) and (with_tqdm or "(100%)" in err)


@pytest.mark.parametrize("cmd", [["data"], ["data", "download"], ["data", "verify"], ["data", "where"]])
def test_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([*cmd, "--help"])
    assert e.value.code == 0 and "usage: memnets data" in capsys.readouterr().out


def test_corrupt_download_is_refused(server, fixtures, tmp_path, capsys):
    path = _url_path(dd.CATALOGUE, dd.BABI_ARCHIVE)
    server.files[path] = b"X" + fixtures[dd.BABI_ARCHIVE][1:]
    want = dd.CATALOGUE["babi"][0].sha256
    got = hashlib.sha256(server.files[path]).hexdigest()
    with pytest.raises(DataError) as info:
        dd.download(["babi"], tmp_path, url_base=server.base, timeout=TIMEOUT)
    msg = str(info.value)
    assert want in msg and got in msg and "tasks_1-20_v1-2.tar.gz" in msg
    assert not (tmp_path / dd.BABI_ARCHIVE).exists()
    assert not (tmp_path / (dd.BABI_ARCHIVE + ".part")).exists()
    # through the command line: a one-line error, exit 2
    assert main(["data", "download", "babi", "--to", str(tmp_path), "--url-base", server.base, "-q"]) == 2
    err = capsys.readouterr().err
    assert want in err and got in err and "Traceback" not in err


@pytest.mark.parametrize("server_resumes", [True, False])
def test_truncated_download_resumes(server, fixtures, tmp_path, server_resumes):
    path = _url_path(dd.CATALOGUE, dd.IMDB_ARCHIVE)
    server.truncate_once.add(path)
    server.ignore_range = not server_resumes
    with pytest.raises(DataError, match="run the same command again to resume"):
        dd.download(["imdb"], tmp_path, url_base=server.base, timeout=TIMEOUT)
    part = tmp_path / (dd.IMDB_ARCHIVE + ".part")
    size = len(fixtures[dd.IMDB_ARCHIVE])
    assert part.is_file() and 0 < part.stat().st_size < size
    assert not (tmp_path / dd.IMDB_ARCHIVE).exists()
    half = part.stat().st_size
    dd.download(["imdb"], tmp_path, url_base=server.base, timeout=TIMEOUT)
    assert (tmp_path / dd.IMDB_ARCHIVE).read_bytes() == fixtures[dd.IMDB_ARCHIVE] and not part.exists()
    assert server.requests[-1] == (path, f"bytes={half}-")  # the rerun asked for the rest
    assert all(r.status != "MISMATCH" for r in dd.verify_dir(tmp_path))


def test_whole_part_file_is_finished_without_data(server, fixtures, tmp_path):
    """A .part that already holds every byte (the server answers 416) is checked and renamed."""
    part = tmp_path / (dd.BABI_ARCHIVE + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(fixtures[dd.BABI_ARCHIVE])
    dd.download(["babi"], tmp_path, url_base=server.base, timeout=TIMEOUT)
    assert (tmp_path / dd.BABI_ARCHIVE).is_file() and not part.exists()


def test_unreachable_server_and_unknown_name(tmp_path, catalogue, capsys):
    with pytest.raises(DataError, match="download of http://127.0.0.1:9/"):
        dd.download(["babi"], tmp_path, url_base="http://127.0.0.1:9", timeout=TIMEOUT)
    assert main(["data", "download", "bab", "--to", str(tmp_path)]) == 2
    assert "did you mean babi" in capsys.readouterr().err


# ----------------------------------------------------------------------------- where

def test_where_lists_found_and_missing(server, tmp_path, monkeypatch, capsys):
    d = tmp_path / "data"
    dd.download(["babi"], d, url_base=server.base, timeout=TIMEOUT)
    monkeypatch.setenv("MEMNETS_DATA", str(d))
    assert main(["data", "where"]) == 0
    out = capsys.readouterr().out
    assert f"data directory: {d.resolve()}  (from the MEMNETS_DATA environment variable)" in out
    assert re.search(r"^babi\s+found: babi/tasks_1-20_v1-2.tar.gz", out, re.M)
    assert f"omniglot  missing; get it with: memnets data download omniglot --to {d.resolve()}" in out
    assert f"imdb      missing; get it with: memnets data download imdb --to {d.resolve()}" in out
    assert main(["data", "where", "--data-dir", str(tmp_path / "nope")]) == 0
    out = capsys.readouterr().out
    assert "(from the data_dir argument)" in out and "it does not exist" in out


# ----------------------------------------------------------------------------- loaders

def test_babi_reads_official_archive_and_unpacked_folder(server, tmp_path, monkeypatch):
    from memnets.tasks import babi

    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "data"
    assert main(["data", "download", "babi", "--to", str(d), "--url-base", server.base, "-q", "--unpack"]) == 0
    assert (d / dd.BABI_FOLDER / "en" / "qa1_single-supporting-fact_train.txt").is_file()
    assert not [p for p in (d / "babi").iterdir() if p.name.startswith(".")]  # no temporary folder left
    assert babi.archive_path(d) == (d / babi.OFFICIAL_ARCHIVE).resolve()
    from_archive = babi.load_task(1, "train", d)
    assert from_archive[0].answer == "bathroom" and from_archive[0].supporting == (1,)
    assert babi.load_task(3, "train", d, ten_k=True)[0].answer == "office"  # the official archive has it
    (d / babi.OFFICIAL_ARCHIVE).unlink()
    assert babi.archive_path(d) == (d / babi.FOLDER).resolve()
    assert babi.load_task(1, "train", d) == from_archive
    assert len(babi.load_task(1, "test", d)) == 1
    with pytest.raises(FileNotFoundError, match=re.escape(f"memnets data download babi --to {d.resolve()}")):
        babi.load_task(2, "train", d)


def test_imdb_reads_official_archive_and_unpacked_folder(server, tmp_path, monkeypatch):
    from memnets.tasks import imdb

    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "data"
    dd.download(["imdb"], d, url_base=server.base, do_unpack=True, timeout=TIMEOUT)
    a = imdb.load_imdb("train", max_len=8, data_dir=d, cache=False)
    assert a.labels.tolist() == [0, 1, 1] and a.ids.tolist() == [0, 0, 1] and a.ratings.tolist() == [3, 9, 7]
    assert a.tokens[1, :3].tolist() == [b + 1 for b in b"Bro"]
    (d / imdb.OFFICIAL_ARCHIVE).unlink()
    b = imdb.load_imdb("train", max_len=8, data_dir=d)  # the folder, cached
    assert all(getattr(a, k).tolist() == getattr(b, k).tolist() for k in ("tokens", "labels", "ids", "ratings"))
    c = imdb.load_imdb("train", max_len=8, data_dir=d)
    assert c.tokens.tolist() == b.tokens.tolist()
    assert len(imdb.load_imdb("test", max_len=4, data_dir=d, limit=1)) == 2


def test_omniglot_reads_zips_and_unpacked_folders(server, tmp_path):
    from memnets.tasks import omniglot as og

    d = tmp_path / "data"
    dd.download(["omniglot"], d, url_base=server.base, do_unpack=True, timeout=TIMEOUT)
    zipped = og.load_images(d, use_cache=False)
    assert zipped.characters == ("Angelic/character01", "Latin/character01")
    assert tuple(zipped.images.shape) == (2, 20, 28, 28)
    for part in og.ZIPS:
        (d / "omniglot" / part).unlink()
    unpacked = og.load_images(d, use_cache=False)
    assert unpacked.characters == zipped.characters and bool((unpacked.images == zipped.images).all())
    split = og.load_split("train", d, images=unpacked)
    assert split.classes == ("Latin/character01/rot000", "Latin/character01/rot090")
    assert "unpacked folders" in dd.locate("omniglot", d).layout and dd.locate("omniglot", d).complete


def test_missing_data_errors_name_the_download_command(tmp_path, monkeypatch):
    from memnets.datadir import resolve_data_dir
    from memnets.tasks import babi, imdb
    from memnets.tasks import omniglot as og

    monkeypatch.setenv("MEMNETS_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "empty"
    d.mkdir()
    root = d.resolve()
    with pytest.raises(FileNotFoundError, match=re.escape(f"`memnets data download babi --to {root}`")):
        babi.load_task(1, "train", d)
    with pytest.raises(FileNotFoundError, match=re.escape(f"`memnets data download imdb --to {root}`")):
        imdb.load_imdb("train", data_dir=d, limit=1)
    with pytest.raises(FileNotFoundError, match=re.escape(f"`memnets data download omniglot --to {root}`")):
        og.load_images(d, use_cache=False)
    with pytest.raises(FileNotFoundError, match=re.escape(f"`memnets data download omniglot --to {root}`")):
        og.read_split("train", d)
    with pytest.raises(FileNotFoundError, match=re.escape(f"`memnets data download --to {tmp_path / 'nope'}`")):
        resolve_data_dir(tmp_path / "nope")


# ----------------------------------------------------------------------------- the real data

def test_real_data_verifies(real_data_dir, capsys):
    assert main(["data", "verify", "--data-dir", str(real_data_dir)]) == 0
    out = capsys.readouterr().out
    assert "MISMATCH" not in out
    assert re.search(r"^ok\s+babi/tasks_1-20_v1-2_en_en-10k.tar.gz", out, re.M)
    assert re.search(r"^\d+ file\(s\) verified, none bad$", out, re.M)
