"""Where real datasets live, and checking that their files are intact.

The data directory comes from an explicit argument (``--data-dir``), else ``$MEMNETS_DATA``,
else ``../shared/data`` relative to the working directory (``memnets data where`` shows which,
and ``memnets data download`` fills one). Paths inside it are resolved with
:func:`data_file`, which refuses paths that escape the directory. :func:`verify_file` checks a
file against the directory's ``SHA256SUMS`` once and remembers the result (keyed by path, size
and modification time) in a small cache file, so later runs do not hash again.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
from pathlib import Path

from .train.checkpoint import atomic_write_text

__all__ = ["resolve_data_dir", "locate_data_dir", "data_file", "verify_file", "expected_sha256", "cache_dir",
           "DataError"]

CHECKSUMS = "SHA256SUMS"


class DataError(ValueError):
    """A dataset file is missing, corrupt, or outside the data directory."""


def cache_dir() -> Path:
    """``$MEMNETS_CACHE``, else ``$XDG_CACHE_HOME/memnets``, else ``~/.cache/memnets``."""
    if os.environ.get("MEMNETS_CACHE"):
        return Path(os.environ["MEMNETS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memnets"


def locate_data_dir(data_dir: str | os.PathLike | None = None) -> tuple[Path, str]:
    """``(path, origin)`` of the data directory, whether or not it exists.

    ``origin`` says where the path came from: ``"data_dir argument"``,
    ``"MEMNETS_DATA environment variable"`` or ``"default ../shared/data"``.
    """
    if data_dir is not None:
        return Path(data_dir), "data_dir argument"
    if os.environ.get("MEMNETS_DATA"):
        return Path(os.environ["MEMNETS_DATA"]), "MEMNETS_DATA environment variable"
    return Path.cwd() / ".." / "shared" / "data", "default ../shared/data"


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data directory: ``data_dir``, else ``$MEMNETS_DATA``, else ``../shared/data``.

    Raises FileNotFoundError naming the path, where it came from, and the command that
    downloads the datasets into it, if it does not exist.
    """
    path, origin = locate_data_dir(data_dir)
    if not path.is_dir():
        raise FileNotFoundError(
            f"data directory {str(path)!r} (from the {origin}) does not exist; download the datasets "
            f"into it with `memnets data download --to {shlex.quote(str(path))}`")
    return path.resolve()


def data_file(relative: str | os.PathLike, data_dir: str | os.PathLike | None = None, *,
              must_exist: bool = True) -> Path:
    """``data_dir / relative``, refusing absolute paths and paths that leave the directory."""
    root = resolve_data_dir(data_dir)
    rel = Path(relative)
    if rel.is_absolute():
        raise DataError(f"dataset path {str(relative)!r} must be relative to the data directory {str(root)!r}")
    path = (root / rel).resolve()
    if path != root and root not in path.parents:
        raise DataError(f"dataset path {str(relative)!r} escapes the data directory {str(root)!r}")
    if must_exist and not path.is_file():
        raise FileNotFoundError(f"dataset file {str(path)!r} not found in the data directory {str(root)!r}")
    return path


def expected_sha256(path: Path, root: Path) -> str | None:
    """The digest ``SHA256SUMS`` in ``root`` lists for ``path`` (None if not listed)."""
    sums = root / CHECKSUMS
    if not sums.is_file():
        return None
    rel = path.relative_to(root).as_posix()
    for line in sums.read_text().splitlines():
        parts = line.split(maxsplit=1)
        if len(parts) == 2 and parts[1].lstrip("*").strip() == rel:
            return parts[0].lower()
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def verify_file(path: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> bool:
    """Check ``path`` against the data directory's SHA256SUMS; hash it only once.

    Returns True if verified, False if the file is not listed (nothing to check against).
    Raises :class:`DataError` naming the file when its digest does not match.
    """
    root = resolve_data_dir(data_dir)
    path = Path(path).resolve()
    want = expected_sha256(path, root)
    if want is None:
        return False
    st = path.stat()
    key = f"{path}:{st.st_size}:{st.st_mtime_ns}"
    cache_file = cache_dir() / "verified.json"
    cache = _load_cache(cache_file)
    if cache.get(key) == want:
        return True
    got = _sha256(path)
    if got != want:
        raise DataError(
            f"dataset file {str(path)!r} is corrupt or modified: sha256 {got[:16]}… does not match "
            f"{want[:16]}… listed in {str(root / CHECKSUMS)!r}"
        )
    cache[key] = want
    try:
        atomic_write_text(cache_file, json.dumps(cache))
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
    return True
