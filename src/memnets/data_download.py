"""The real datasets: where each file comes from, downloading it, checking it, finding it.

:data:`CATALOGUE` lists, per dataset (``babi``, ``omniglot``, ``imdb``), the files
``memnets data download`` fetches: their place in the data directory, official URL and
SHA-256. The layout is the one the loaders read::

    <data>/babi/tasks_1-20_v1-2.tar.gz             bAbI 1-20 v1.2, the official archive
    <data>/omniglot/images_background.zip           Omniglot, the official zips
    <data>/omniglot/images_evaluation.zip
    <data>/omniglot/splits/vinyals/{train,val,test,trainval}.txt   few-shot split lists
    <data>/imdb/aclImdb_v1.tar.gz                   IMDB reviews (aclImdb v1), the official archive

The loaders also accept, per dataset, a repacked archive (``babi/tasks_1-20_v1-2_en_en-10k.tar.gz``,
``imdb/aclImdb_v1_labeled.tar.gz``, the names of the shared copy) and an unpacked folder
(``babi/tasks_1-20_v1-2/``, ``omniglot/images_background/`` and ``images_evaluation/``,
``imdb/aclImdb/``); :func:`locate` reports which one a directory holds.

:func:`download_file` streams into ``<file>.part`` (resuming it with an HTTP ``Range`` request
when it exists), checks the SHA-256 and only then renames it to the final name, so a final
name always holds a verified file. :func:`verify_dir` checks every known file present in a
data directory: against the directory's own ``SHA256SUMS`` when that lists the file, else
against the catalogue.

Example::

    download(["babi"], "data")        # data/babi/tasks_1-20_v1-2.tar.gz, verified
    verify_dir("data")                # [VerifyResult(path='babi/tasks_1-20_v1-2.tar.gz', status='ok', ...), ...]
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import shlex
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .datadir import CHECKSUMS, DataError, locate_data_dir
from .train.checkpoint import move_into_place

__all__ = [
    "RemoteFile", "VerifyResult", "Found", "CATALOGUE", "DATASETS", "MIRROR_ENV", "BABI_ARCHIVE",
    "BABI_REPACK", "BABI_FOLDER", "OMNIGLOT_PARTS", "OMNIGLOT_SPLITS", "IMDB_ARCHIVE", "IMDB_REPACK",
    "IMDB_FOLDER", "DOWNLOAD_MAX", "UNPACK_MAX", "UNPACK_MAX_MEMBERS", "download_command", "missing_message", "rebase_url", "sha256_file", "download_file",
    "unpack", "download", "verify_dir", "locate", "where_lines",
]

MIRROR_ENV = "MEMNETS_DATA_MIRROR"
_CHUNK = 1 << 16
DOWNLOAD_MAX = 64 << 20  # bytes: the most a download without a catalogue size may hold
UNPACK_MAX = 2 << 30  # bytes: the most an archive without its own limit may unpack to
UNPACK_MAX_MEMBERS = 500_000  # files and folders in one archive
_USER_AGENT = "memnets-data/1 (Python urllib)"

BABI_ARCHIVE = "babi/tasks_1-20_v1-2.tar.gz"
BABI_REPACK = "babi/tasks_1-20_v1-2_en_en-10k.tar.gz"
BABI_FOLDER = "babi/tasks_1-20_v1-2"
OMNIGLOT_PARTS = ("images_background", "images_evaluation")
OMNIGLOT_SPLITS = "omniglot/splits/vinyals"
IMDB_ARCHIVE = "imdb/aclImdb_v1.tar.gz"
IMDB_REPACK = "imdb/aclImdb_v1_labeled.tar.gz"
IMDB_FOLDER = "imdb/aclImdb"


@dataclass(frozen=True)
class RemoteFile:
    """One downloadable file: ``path`` in the data directory, its official ``url`` and
    ``sha256``; ``size`` in bytes when known (a download stops there); ``unpack`` the top-level
    folder the archive holds (it unpacks beside the archive), None for a file that is not an
    archive; ``unpacked_max`` the most bytes its members may hold once unpacked (else
    :data:`UNPACK_MAX`)."""

    path: str
    url: str
    sha256: str
    size: int | None = None
    unpack: str | None = None
    unpacked_max: int | None = None


_SPLITS_URL = ("https://raw.githubusercontent.com/jakesnell/prototypical-networks/"
               "c9bb4d258267c11cb6e23f0a19242d24ca98ad8a/data/omniglot/splits/vinyals/")

CATALOGUE: dict[str, tuple[RemoteFile, ...]] = {
    "babi": (
        RemoteFile(BABI_ARCHIVE, "http://www.thespermwhale.com/jaseweston/babi/tasks_1-20_v1-2.tar.gz",
                   "0364ebde659f14d11bc21744516c5ec49d3d06cb692733f66680771244998898", 15719851,
                   unpack="tasks_1-20_v1-2", unpacked_max=400 << 20),
    ),
    "omniglot": (
        RemoteFile("omniglot/images_background.zip",
                   "https://github.com/brendenlake/omniglot/raw/master/python/images_background.zip",
                   "ad41ab679c8b5d90b271ef46be6987cc81211774a695c29dcc5367b2b26ee640", 9464212,
                   unpack="images_background", unpacked_max=200 << 20),
        RemoteFile("omniglot/images_evaluation.zip",
                   "https://github.com/brendenlake/omniglot/raw/master/python/images_evaluation.zip",
                   "1f61a8f3366785b057fc117d9228e78a16e3d976c8953b2a10fcc74cf0609cee", 6462886,
                   unpack="images_evaluation", unpacked_max=200 << 20),
        RemoteFile(f"{OMNIGLOT_SPLITS}/train.txt", _SPLITS_URL + "train.txt",
                   "984522c194c30fb678ce53304a160a42faf5403ad4f9a67010f32dd3a35738e0"),
        RemoteFile(f"{OMNIGLOT_SPLITS}/val.txt", _SPLITS_URL + "val.txt",
                   "11f99e54faee3e26f53d3231c1cceac5bf7b8730e9be31cb6dab256551dc0c1a"),
        RemoteFile(f"{OMNIGLOT_SPLITS}/test.txt", _SPLITS_URL + "test.txt",
                   "845264cc5c156180828ccf17915668b17ee21424d0170df6e7d81676aa5d1204"),
        RemoteFile(f"{OMNIGLOT_SPLITS}/trainval.txt", _SPLITS_URL + "trainval.txt",
                   "5276ae50c755596d0bff7f2284e85625695549a85ee6e36b6491ad1e5d1cc26a"),
    ),
    "imdb": (
        RemoteFile(IMDB_ARCHIVE, "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
                   "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe", 84125825,
                   unpack="aclImdb", unpacked_max=1 << 30),
    ),
}
DATASETS = tuple(CATALOGUE)

# Files the loaders read that are not downloaded (the repacked archives of the shared copy):
# they are checked against the data directory's SHA256SUMS only.
_OTHER_KNOWN = {"babi": (BABI_REPACK,), "omniglot": (), "imdb": (IMDB_REPACK,)}
_TITLES = {"babi": "bAbI", "omniglot": "Omniglot", "imdb": "IMDB"}


def _catalogue(catalogue: Mapping[str, Sequence[RemoteFile]] | None) -> Mapping[str, Sequence[RemoteFile]]:
    return CATALOGUE if catalogue is None else catalogue


def download_command(name: str | None, data_dir: str | os.PathLike) -> str:
    """The command that downloads dataset ``name`` (every dataset when None) into ``data_dir``:
    ``memnets data download babi --to /data``."""
    what = f" {name}" if name else ""
    return f"memnets data download{what} --to {shlex.quote(str(data_dir))}"


def missing_message(name: str, what: str, data_dir: str | os.PathLike) -> str:
    """The text of a missing-data error: ``what`` was not found, and the command that gets it."""
    return f"{what}; get it with `{download_command(name, data_dir)}`"


def rebase_url(url: str, base: str | None) -> str:
    """``url`` with its scheme and host replaced by ``base`` (which may carry a path prefix):
    ``rebase_url("https://a.org/x/y.zip", "http://127.0.0.1:8000/m") == "http://127.0.0.1:8000/m/x/y.zip"``.
    ``base`` None or empty returns ``url`` unchanged."""
    if not base:
        return url
    parts = urllib.parse.urlsplit(url)
    tail = parts.path + (f"?{parts.query}" if parts.query else "")
    return base.rstrip("/") + tail


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _listed(root: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of the directory's SHA256SUMS (empty when absent)."""
    sums = root / CHECKSUMS
    out: dict[str, str] = {}
    if not sums.is_file():
        return out
    for line in sums.read_text().splitlines():
        parts = line.split(maxsplit=1)
        if len(parts) == 2 and re.fullmatch(r"[0-9a-fA-F]{64}", parts[0]):
            out[parts[1].lstrip("*").strip()] = parts[0].lower()
    return out


class _Progress:
    """tqdm when it is installed, else a plain line every 10 %; silent when disabled."""

    def __init__(self, desc: str, total: int | None, initial: int, enabled: bool):
        self.bar = None
        self.enabled = enabled
        self.desc, self.total, self.done, self.shown = desc, total, initial, -1
        if not enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(total=total, initial=initial, unit="B", unit_scale=True, unit_divisor=1024,
                        desc=desc, file=sys.stderr, leave=False)

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and self.total:
            tenth = 10 * self.done // self.total
            if tenth != self.shown:
                self.shown = tenth
                print(f"{self.desc}: {self.done}/{self.total} bytes ({10 * tenth}%)", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _open(url: str, offset: int, timeout: float):
    headers = {"User-Agent": _USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)


def _content_range_start_total(value: str | None) -> tuple[int | None, int | None]:
    m = re.match(r"\s*bytes\s+(\d+)-\d+/(\d+|\*)", value or "")
    if not m:
        return None, None
    return int(m.group(1)), (None if m.group(2) == "*" else int(m.group(2)))


def _connect(url: str, offset: int, timeout: float, on_restart: Callable[[], None]):
    """``(response, offset, total)``: a response for ``url`` from byte ``offset`` on (offset 0
    when the server ignores or mangles the Range request), or ``(None, offset, None)`` when the
    server answers 416 to a resume (the partial file is already whole)."""
    try:
        resp = _open(url, offset, timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:
            return None, offset, None
        raise DataError(f"download of {url} failed: HTTP {e.code} {e.reason}") from e
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise DataError(f"download of {url} failed: {reason} (no network? a mirror can be given with "
                        f"--url-base or ${MIRROR_ENV})") from e
    length = resp.headers.get("Content-Length")
    length = int(length) if length is not None and length.isdigit() else None
    if offset:
        start, full = _content_range_start_total(resp.headers.get("Content-Range"))
        if resp.status == 206 and start == offset:
            return resp, offset, full if full is not None else (offset + length if length is not None else None)
        on_restart()
        if resp.status != 200:  # a partial answer for another range: ask for everything
            resp.close()
            return _connect(url, 0, timeout, on_restart)
    return resp, 0, length


def download_file(entry: RemoteFile, dest_root: str | os.PathLike, *, url_base: str | None = None,
                  timeout: float = 60.0, progress: bool = False,
                  log: Callable[[str], None] | None = None) -> Path:
    """Download ``entry`` to ``dest_root / entry.path`` and return that path.

    Streams into ``<file>.part``; an existing ``.part`` is resumed with a ``Range`` request
    (a server that ignores it gets a fresh download). The SHA-256 is checked before the
    atomic rename to the final name; a mismatch deletes the ``.part`` and raises
    :class:`~memnets.datadir.DataError` naming the file, the expected and the actual SHA-256.
    A connection that breaks off keeps the ``.part`` and raises DataError saying so (the same
    call resumes it). A final file already present is checked instead of downloaded again.
    """
    log = log or (lambda msg: None)
    root = Path(dest_root)
    target = root / entry.path
    part = target.with_name(target.name + ".part")
    want = entry.sha256.lower()
    if target.is_file():
        got = sha256_file(target)
        if got == want:
            log(f"ok        {entry.path}  (already present, sha256 verified)")
            return target
        if _listed(root).get(entry.path) == got:
            log(f"ok        {entry.path}  (already present, matches {CHECKSUMS}; not the official download)")
            return target
        raise DataError(
            f"{str(target)!r} is already present but its sha256 {got} is not the expected {want}; "
            f"delete it and run the command again")
    target.parent.mkdir(parents=True, exist_ok=True)
    url = rebase_url(entry.url, url_base)
    offset = part.stat().st_size if part.is_file() else 0
    if entry.size is not None and offset > entry.size:
        part.unlink()
        offset = 0
    resp, offset, total = _connect(url, offset, timeout, lambda: log(
        f"restart   {entry.path}  (the server does not resume; downloading from the start)"))
    if total is None:
        total = entry.size
    h = hashlib.sha256()
    if offset:
        with open(part, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    limit = entry.size if entry.size is not None else DOWNLOAD_MAX
    if total is not None and total > limit:
        if resp is not None:
            resp.close()
        raise DataError(
            f"download of {url} refused: the server announces {total} bytes, more than the "
            f"{limit} expected for {entry.path}")
    if resp is not None:  # None: the server says the .part already holds every byte
        received = offset
        bar = _Progress(entry.path, total, offset, progress)
        try:
            with resp, open(part, "ab" if offset else "wb") as f:
                while True:
                    try:
                        chunk = resp.read(_CHUNK)
                    except (OSError, http.client.HTTPException) as e:
                        raise DataError(
                            f"download of {url} broke off after {received} bytes ({e}); the partial file "
                            f"{str(part)!r} is kept: run the same command again to resume") from e
                    if not chunk:
                        break
                    if received + len(chunk) > limit:  # an endless or oversized answer: stop here
                        f.close()
                        part.unlink(missing_ok=True)
                        raise DataError(
                            f"download of {url} stopped: the server sent more than the {limit} bytes "
                            f"expected for {entry.path} (the partial file was deleted)")
                    f.write(chunk)
                    h.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
                f.flush()
                os.fsync(f.fileno())
        finally:
            bar.close()
        if total is not None and received < total:
            raise DataError(
                f"download of {url} stopped after {received} of {total} bytes; the partial file "
                f"{str(part)!r} is kept: run the same command again to resume")
    got = h.hexdigest()
    if got != want:
        part.unlink(missing_ok=True)
        raise DataError(
            f"downloaded file {str(target)!r} from {url} is corrupt: expected sha256 {want}, got {got} "
            f"(the partial file was deleted; run the command again, or check the mirror)")
    move_into_place(part, target)
    log(f"ok        {entry.path}  (downloaded, sha256 verified)")
    return target


def _safe_tar_members(tar: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    """Regular files and folders whose names stay inside ``dest`` (for Pythons without tar filters)."""
    out = []
    for m in tar.getmembers():
        if not (m.isfile() or m.isdir()):
            continue
        p = (dest / m.name).resolve()
        if m.name.startswith("/") or (p != dest and dest not in p.parents):
            raise DataError(f"archive member {m.name!r} would be written outside {str(dest)!r}")
        out.append(m)
    return out


def _claim(folder: Path):
    """Hold an exclusive lock on ``folder`` for as long as the returned handle stays open (None
    where locks are not available): what tells an unpack in progress from one that was killed."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise
    return fd


def _remove_stale(parent: Path, top: str, log: Callable[[str], None]) -> None:
    """Remove the temporary folders of earlier unpacks of ``top`` into ``parent`` that were cut
    short (killed, power lost): those no running unpack holds the lock of."""
    for old in parent.glob(f".{top}.unpack-*"):
        if old.is_symlink() or not old.is_dir():
            continue
        try:
            fd = _claim(old)
        except OSError:
            continue  # an unpack in progress holds it
        if fd is None and time.time() - old.stat().st_mtime < 24 * 3600:
            continue  # no locks here: only a day-old folder is known to be stale
        try:
            shutil.rmtree(old, ignore_errors=True)
            log(f"removed   {old.name}/ (left by an unpack that did not finish)")
        finally:
            if fd is not None:
                os.close(fd)


def _check_size(archive: Path, sizes: list[int], limit: int) -> None:
    """Refuse an archive whose members would unpack to more than ``limit`` bytes, or too many."""
    if len(sizes) > UNPACK_MAX_MEMBERS:
        raise DataError(f"archive {str(archive)!r} holds {len(sizes)} members, more than the "
                        f"{UNPACK_MAX_MEMBERS} an archive may hold; not unpacked")
    total = sum(sizes)
    if total > limit:
        raise DataError(f"archive {str(archive)!r} would unpack to {total} bytes, more than the {limit} "
                        f"allowed for it; not unpacked")


def unpack(archive: str | os.PathLike, top: str, *, log: Callable[[str], None] | None = None,
           max_bytes: int | None = None) -> Path:
    """Unpack ``archive`` (``.tar.gz`` or ``.zip``) whose members live under ``top/`` into the
    folder beside it, atomically: extract into a temporary folder there, then rename ``top`` into
    place. An existing ``top`` folder is left as it is. Returns the folder.

    An archive whose members add up to more than ``max_bytes`` (default :data:`UNPACK_MAX`), or
    that holds more than :data:`UNPACK_MAX_MEMBERS` members, is refused before anything is
    written. Temporary folders of earlier unpacks that were killed are removed first."""
    log = log or (lambda msg: None)
    archive = Path(archive)
    limit = UNPACK_MAX if max_bytes is None else max_bytes
    final = archive.parent / top
    _remove_stale(archive.parent, top, log)
    if final.is_dir():
        log(f"unpacked  {final.name}/ already present beside {archive.name}")
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{top}.unpack-", dir=archive.parent)).resolve()
    lock = _claim(tmp)
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                _check_size(archive, [zi.file_size for zi in zf.infolist()], limit)
                zf.extractall(tmp)
        else:
            with tarfile.open(archive, "r:*") as tar:
                members = tar.getmembers()
                _check_size(archive, [m.size for m in members if m.isfile()], limit)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(tmp, filter="data")
                else:  # pragma: no cover - Python < 3.11.4
                    tar.extractall(tmp, members=_safe_tar_members(tar, tmp))
        if not (tmp / top).is_dir():
            raise DataError(f"archive {str(archive)!r} has no top-level folder {top!r}/")
        move_into_place(tmp / top, final)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as e:
        raise DataError(f"could not unpack {str(archive)!r}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if lock is not None:
            os.close(lock)
    log(f"unpacked  {final.relative_to(archive.parent.parent)}/")
    return final


def download(names: Sequence[str] | None, to: str | os.PathLike, *, url_base: str | None = None,
             do_unpack: bool = False, timeout: float = 60.0, progress: bool = False,
             catalogue: Mapping[str, Sequence[RemoteFile]] | None = None,
             log: Callable[[str], None] | None = None) -> list[Path]:
    """Download the datasets ``names`` (all when None or empty) into ``to`` (created if needed);
    with ``do_unpack``, also unpack each archive beside it. ``url_base`` (else ``$MEMNETS_DATA_MIRROR``)
    replaces the host of every URL. Returns the final paths. Raises ValueError for an unknown
    name and :class:`~memnets.datadir.DataError` for a failed or corrupt download."""
    cat = _catalogue(catalogue)
    names = list(names or cat)
    unknown = [n for n in names if n not in cat]
    if unknown:
        raise ValueError(f"unknown dataset {unknown[0]!r}: expected one of {', '.join(cat)}")
    if url_base is None:
        url_base = os.environ.get(MIRROR_ENV) or None
    root = Path(to)
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for name in dict.fromkeys(names):
        for entry in cat[name]:
            path = download_file(entry, root, url_base=url_base, timeout=timeout, progress=progress, log=log)
            out.append(path)
            if do_unpack and entry.unpack:
                unpack(path, entry.unpack, log=log, max_bytes=entry.unpacked_max)
            elif entry.unpack:  # the leftovers of a killed unpack go on the next run either way
                _remove_stale(path.parent, entry.unpack, log or (lambda msg: None))
    return out


@dataclass(frozen=True)
class VerifyResult:
    """One line of :func:`verify_dir`: ``status`` is ``ok``, ``MISMATCH``, ``missing`` or
    ``unchecked`` (present, no digest known); ``expected`` / ``actual`` the digests compared;
    ``source`` which digest was used (``SHA256SUMS`` or ``catalogue``); ``note`` a remark."""

    path: str
    status: str
    expected: str | None = None
    actual: str | None = None
    source: str | None = None
    note: str = ""

    @property
    def bad(self) -> bool:
        return self.status == "MISMATCH"

    def line(self) -> str:
        """The line ``memnets data verify`` prints for this file."""
        if self.status == "MISMATCH":
            text = f"MISMATCH  {self.path}  expected {self.expected} got {self.actual} ({self.source})"
        elif self.status == "ok":
            text = f"ok        {self.path}  ({self.source})"
        else:
            text = f"{self.status:<9} {self.path}"
        return text + (f"  {self.note}" if self.note else "")


def verify_dir(data_dir: str | os.PathLike, *,
               catalogue: Mapping[str, Sequence[RemoteFile]] | None = None) -> list[VerifyResult]:
    """Check every known file of ``data_dir``: the catalogue's files, the repacked archives the
    loaders read, and every file the directory's ``SHA256SUMS`` lists.

    A file listed in ``SHA256SUMS`` is checked against it (that file describes what the directory
    holds; a digest that differs from the official download is noted); any other file against the
    catalogue. Absent files are ``missing`` (with the command that gets them when their dataset
    is not found in another layout). Raises FileNotFoundError when ``data_dir`` does not exist.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"data directory {str(root)!r} does not exist; "
                                f"create it with `{download_command(None, root)}`")
    cat = _catalogue(catalogue)
    listed = _listed(root)
    official: dict[str, str] = {}
    owner: dict[str, str] = {}
    order: list[str] = []
    for name, entries in cat.items():
        for e in entries:
            official[e.path] = e.sha256.lower()
            owner[e.path] = name
            order.append(e.path)
        for rel in _OTHER_KNOWN.get(name, ()):
            owner.setdefault(rel, name)
            order.append(rel)
    order += sorted(listed)
    found = {name: locate(name, root, catalogue=cat) for name in cat}
    results: list[VerifyResult] = []
    for rel in dict.fromkeys(order):
        path = root / rel
        if not path.is_file():
            name = owner.get(rel)
            note = ""
            if name is not None and found[name].complete:
                note = f"(not needed: {_TITLES.get(name, name)} is read from {', '.join(found[name].items)})"
            elif name is not None and rel in official:
                note = f"(get it: {download_command(name, root)})"
            elif rel in listed:
                note = f"(listed in {CHECKSUMS})"
            results.append(VerifyResult(rel, "missing", note=note))
            continue
        if rel in listed:
            want, source = listed[rel], CHECKSUMS
        elif rel in official:
            want, source = official[rel], "catalogue"
        else:
            results.append(VerifyResult(rel, "unchecked", note="(no digest known)"))
            continue
        got = sha256_file(path)
        note = ""
        if got == want and source == CHECKSUMS and rel in official and official[rel] != got:
            note = "(a repacked copy: differs from the official download)"
        results.append(VerifyResult(rel, "ok" if got == want else "MISMATCH", want, got, source, note))
    return results


@dataclass(frozen=True)
class Found:
    """Where :func:`locate` found a dataset: ``items`` the files / folders the loader reads
    (relative to the data directory), ``layout`` in words, ``missing`` what is still absent
    (``complete`` when nothing is)."""

    name: str
    items: tuple[str, ...]
    layout: str
    missing: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return bool(self.items) and not self.missing


def locate(name: str, data_dir: str | os.PathLike, *,
           catalogue: Mapping[str, Sequence[RemoteFile]] | None = None) -> Found:
    """Which layout of dataset ``name`` the loaders would read in ``data_dir`` (see the module
    docstring for the layouts, in the order the loaders prefer them)."""
    root = Path(data_dir)
    if name == "babi":
        for rel, layout in ((BABI_ARCHIVE, "official archive"),
                            (BABI_REPACK, "repacked en + en-10k archive; en-10k task 3 train absent")):
            if (root / rel).is_file():
                return Found(name, (rel,), layout, ())
        if (root / BABI_FOLDER / "en").is_dir():
            return Found(name, (BABI_FOLDER + "/",), "unpacked folder", ())
        return Found(name, (), "", (BABI_ARCHIVE,))
    if name == "imdb":
        for rel, layout in ((IMDB_ARCHIVE, "official archive"), (IMDB_REPACK, "repacked labelled archive")):
            if (root / rel).is_file():
                return Found(name, (rel,), layout, ())
        if (root / IMDB_FOLDER / "train").is_dir() and (root / IMDB_FOLDER / "test").is_dir():
            return Found(name, (IMDB_FOLDER + "/",), "unpacked folder", ())
        return Found(name, (), "", (IMDB_ARCHIVE,))
    if name == "omniglot":
        items, missing, kinds = [], [], set()
        for part in OMNIGLOT_PARTS:
            z, d = f"omniglot/{part}.zip", f"omniglot/{part}"
            if (root / z).is_file():
                items.append(z)
                kinds.add("zips")
            elif (root / d).is_dir():
                items.append(d + "/")
                kinds.add("unpacked folders")
            else:
                missing.append(z)
        splits = [e.path for e in _catalogue(catalogue).get("omniglot", ()) if e.path.startswith(OMNIGLOT_SPLITS)]
        have = [s for s in splits if (root / s).is_file()]
        missing += [s for s in splits if s not in have]
        if have:
            items.append(f"{OMNIGLOT_SPLITS}/ ({len(have)} split lists)")
        return Found(name, tuple(items), " + ".join(sorted(kinds)), tuple(missing))
    raise ValueError(f"unknown dataset {name!r}: expected one of {', '.join(_catalogue(catalogue))}")


def where_lines(data_dir: str | os.PathLike | None = None, *,
                catalogue: Mapping[str, Sequence[RemoteFile]] | None = None) -> list[str]:
    """The report of ``memnets data where``: the data directory and where it came from, then
    per dataset what was found, or what is missing and the command that gets it."""
    path, origin = locate_data_dir(data_dir)
    cat = _catalogue(catalogue)
    shown = path.resolve() if path.is_dir() else path
    lines = [f"data directory: {shown}  (from the {origin})"]
    if not path.is_dir():
        lines.append("  it does not exist")
    if (path / CHECKSUMS).is_file():
        lines.append(f"  checksums: {CHECKSUMS} present (`memnets data verify` checks every file)")
    width = max(len(n) for n in cat)
    for name in cat:
        f = locate(name, path, catalogue=cat) if path.is_dir() else Found(name, (), "", ("everything",))
        title = name.ljust(width)
        if f.complete:
            lines.append(f"{title}  found: {', '.join(f.items)}  [{f.layout}]")
        elif f.items:
            lines.append(f"{title}  incomplete: found {', '.join(f.items)}; missing {', '.join(f.missing)}; "
                         f"get it with: {download_command(name, shown)}")
        else:
            lines.append(f"{title}  missing; get it with: {download_command(name, shown)}")
    return lines
