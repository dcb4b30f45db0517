"""Omniglot (Lake et al. 2015) for N-way K-shot learning (docs/maths.md §4, §11), read from the real zips.

The data directory comes from ``data_dir``, else ``MEMNETS_DATA``, else ``../shared/data``
relative to the current working directory. Images are read straight out of
``<data>/omniglot/images_{background,evaluation}.zip`` (members
``images_background/<Alphabet>/characterNN/<id>_<drawer>.png``, 105×105, 1-bit, 1 = background),
or, for a zip that is absent, from its unpacked folder ``<data>/omniglot/images_background/``
(``memnets data download omniglot --to <data>`` fetches the zips and the split lists),
inverted (stroke = 1), resized to 28×28 (bilinear) and stored as ``uint8`` in ``[0, 255]``.
The decoded tensor is cached under ``cache_dir`` (default ``~/.cache/memnets/omniglot``) with an
atomic write (:func:`memnets.train.checkpoint.atomic_save`), so later loads take well under a second.

Few-shot classes follow the split of Vinyals et al. 2016 as used by Prototypical Networks:
``<data>/omniglot/splits/vinyals/{train,val,test,trainval}.txt``, one class per line,
``Alphabet/characterNN/rotDDD`` (rotation by DDD ∈ {0, 90, 180, 270} degrees counter-clockwise,
each rotation a class of its own): 4112 / 688 / 1692 classes.

Worked example: the line ``Gurmukhi/character42/rot090`` is the class whose 20 images are the
20 drawings of ``images_evaluation/Gurmukhi/character42/*.png`` rotated by 90°; in
:func:`load_split` it is one row ``images[c]`` of shape ``[20, 28, 28]``.

Episodes (:func:`sample_episode`, :func:`sample_generalized_episode`) are index tensors, so the
same sampler serves images ``[C, 20, 28, 28]`` and precomputed features ``[C, 20, F]``
(:func:`gather`).
"""
from __future__ import annotations

import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch

from ..data_download import missing_message
from ..datadir import cache_dir, resolve_data_dir, verify_file

__all__ = [
    "ZIPS", "SPLITS", "IMAGE_SIZE", "DRAWERS", "OmniglotImages", "OmniglotSplit", "Episode",
    "GeneralizedEpisode", "resolve_data_dir", "default_cache_dir", "load_images", "read_split",
    "load_split", "sample_episode", "sample_generalized_episode", "gather", "to_float",
]

ZIPS = ("images_background.zip", "images_evaluation.zip")
SPLITS = ("train", "val", "test", "trainval")
IMAGE_SIZE = 28
DRAWERS = 20
_CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """``<memnets cache>/omniglot`` (see :func:`memnets.datadir.cache_dir`)."""
    return cache_dir() / "omniglot"


@dataclass(frozen=True)
class OmniglotImages:
    """All decoded characters: ``images`` uint8 ``[C, 20, 28, 28]`` (stroke = 255), row ``c`` the
    20 drawers of ``characters[c]`` (``"Alphabet/characterNN"``), sorted by name."""

    characters: tuple[str, ...]
    images: torch.Tensor

    def index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.characters)}


@dataclass(frozen=True)
class OmniglotSplit:
    """One Vinyals split: ``images`` uint8 ``[C, 20, 28, 28]`` (rotation applied), ``classes`` the
    split lines ``"Alphabet/characterNN/rotDDD"`` in file order."""

    classes: tuple[str, ...]
    images: torch.Tensor


def _decode_png(data: bytes, size: int) -> np.ndarray:
    from PIL import Image  # pillow ships with matplotlib, a declared dependency

    img = Image.open(io.BytesIO(data)).convert("L")
    img = img.resize((size, size), Image.Resampling.BILINEAR)
    return 255 - np.asarray(img, dtype=np.uint8)  # stroke = 255, background = 0


def _decode_zip(path: Path, alphabets: set[str] | None, size: int) -> dict[str, np.ndarray]:
    """Decode the zip ``path``, or its unpacked folder (``path`` without ``.zip``) when the zip is absent."""
    folder = path.with_suffix("")
    if not path.is_file() and folder.is_dir():
        return _decode_folder(folder, alphabets, size)
    if not path.is_file():
        raise FileNotFoundError(missing_message(
            "omniglot", f"Omniglot archive not found: {path} (nor the unpacked folder {folder}/)", path.parents[1]))
    verify_file(path, path.parents[1])  # against the data directory's SHA256SUMS, once
    out: dict[str, list[tuple[str, np.ndarray]]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for name in sorted(zf.namelist()):
                parts = name.split("/")
                if len(parts) != 4 or not parts[3].endswith(".png"):
                    continue
                _, alphabet, char, fname = parts
                if alphabets is not None and alphabet not in alphabets:
                    continue
                out.setdefault(f"{alphabet}/{char}", []).append((fname, _decode_png(zf.read(name), size)))
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise ValueError(f"Omniglot archive {path} is corrupt or unreadable: {e}") from e
    return _stack(path, out)


def _decode_folder(folder: Path, alphabets: set[str] | None, size: int) -> dict[str, np.ndarray]:
    """Decode an unpacked ``images_*`` folder: ``<Alphabet>/characterNN/*.png``."""
    out: dict[str, list[tuple[str, np.ndarray]]] = {}
    try:
        for png in sorted(folder.glob("*/*/*.png")):
            char, alphabet = png.parent.name, png.parent.parent.name
            if alphabets is not None and alphabet not in alphabets:
                continue
            out.setdefault(f"{alphabet}/{char}", []).append((png.name, _decode_png(png.read_bytes(), size)))
    except (OSError, ValueError) as e:
        raise ValueError(f"Omniglot folder {folder} holds an unreadable image: {e}") from e
    return _stack(folder, out)


def _stack(path: Path, out: dict[str, list[tuple[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    result = {}
    for char, items in out.items():
        if len(items) != DRAWERS:
            raise ValueError(f"Omniglot archive {path}: {char} has {len(items)} images, expected {DRAWERS}")
        result[char] = np.stack([a for _, a in sorted(items)])  # [20, size, size]
    return result


def _atomic_save(obj: object, path: Path) -> None:
    from ..train.checkpoint import atomic_save

    atomic_save(path, lambda tmp: torch.save(obj, tmp))


def load_images(
    data_dir: str | os.PathLike | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    alphabets: Sequence[str] | None = None,
    size: int = IMAGE_SIZE,
    use_cache: bool = True,
) -> OmniglotImages:
    """Decode both Omniglot zips (or only ``alphabets``) into ``uint8 [C, 20, size, size]``.

    The result is cached as ``<cache_dir>/omniglot<size>_<key>.pt`` (``key`` = ``all`` or a hash
    of the alphabet subset). A zip that is absent is read from its unpacked folder
    (``omniglot/images_background/``) when that exists. A missing or corrupt zip raises an error
    naming the file (and, when missing, the command that downloads it).
    """
    root = resolve_data_dir(data_dir) / "omniglot"
    subset = None if alphabets is None else sorted(set(alphabets))
    key = "all" if subset is None else hashlib.sha1("\n".join(subset).encode()).hexdigest()[:12]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cpath = cache / f"omniglot{size}_v{_CACHE_VERSION}_{key}.pt"
    if use_cache and cpath.is_file():
        try:
            blob = torch.load(cpath, weights_only=True)
            return OmniglotImages(tuple(blob["characters"]), blob["images"])
        except Exception:  # a damaged cache is rebuilt
            pass
    chars: dict[str, np.ndarray] = {}
    for zname in ZIPS:
        chars.update(_decode_zip(root / zname, None if subset is None else set(subset), size))
    if not chars:
        raise ValueError(f"no Omniglot characters found for alphabets={subset} in {root}")
    names = sorted(chars)
    images = torch.from_numpy(np.stack([chars[c] for c in names]))  # [C, 20, size, size]
    if use_cache:
        _atomic_save({"characters": names, "images": images}, cpath)
    return OmniglotImages(tuple(names), images)


def read_split(name: str, data_dir: str | os.PathLike | None = None) -> list[str]:
    """Lines of ``splits/vinyals/<name>.txt`` (``"Alphabet/characterNN/rotDDD"``)."""
    if name not in SPLITS:
        raise ValueError(f"`name` expected one of {SPLITS}, got {name!r}")
    root = resolve_data_dir(data_dir)
    path = root / "omniglot" / "splits" / "vinyals" / f"{name}.txt"
    if not path.is_file():
        raise FileNotFoundError(missing_message("omniglot", f"Omniglot split file not found: {path}", root))
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]


def _rotate(images: torch.Tensor, degrees: int) -> torch.Tensor:
    if degrees % 90:
        raise ValueError(f"rotation expected a multiple of 90 degrees, got {degrees}")
    return torch.rot90(images, k=(degrees // 90) % 4, dims=(-2, -1))  # counter-clockwise


def load_split(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    images: OmniglotImages | None = None,
    alphabets: Sequence[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> OmniglotSplit:
    """Classes of a Vinyals split with rotations applied: ``uint8 [C, 20, 28, 28]``.

    ``alphabets`` keeps only the split lines of those alphabets (a small subset for tests);
    ``images`` reuses an already decoded :class:`OmniglotImages`.
    """
    lines = read_split(name, data_dir)
    if alphabets is not None:
        keep = set(alphabets)
        lines = [ln for ln in lines if ln.split("/")[0] in keep]
    if images is None:
        needed = sorted({ln.split("/")[0] for ln in lines})
        images = load_images(data_dir, cache_dir=cache_dir, alphabets=None if alphabets is None else needed)
    idx = images.index()
    out = []
    for ln in lines:
        alphabet, char, rot = ln.split("/")
        key = f"{alphabet}/{char}"
        if key not in idx or not rot.startswith("rot"):
            raise ValueError(f"split line {ln!r} does not match a decoded character")
        out.append(_rotate(images.images[idx[key]], int(rot[3:])))
    return OmniglotSplit(tuple(lines), torch.stack(out))  # [C, 20, 28, 28]


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 28, 28]`` → float ``[..., 1, 28, 28]`` in ``[0, 1]`` (stroke = 1)."""
    return (images.float() / 255.0).unsqueeze(-3)


class Episode(NamedTuple):
    """Index form of an N-way K-shot episode over a pool ``[C, S, ...]`` (S samples per class).

    classes ``[N]`` pool class ids; support ``[N, K]`` and query ``[N, Q]`` sample ids within each
    class (disjoint); the label of ``support[n, k]`` / ``query[n, q]`` is ``n``.
    """

    classes: torch.Tensor
    support: torch.Tensor
    query: torch.Tensor


class GeneralizedEpisode(NamedTuple):
    """Novel N-way K-shot episode plus base queries (Table 2's Novel / Base / Both).

    ``novel`` an :class:`Episode` over the novel pool; ``base_classes`` ``[M]`` and
    ``base_samples`` ``[M]`` index base query images in the base pool. In the joint label space
    base class ``b`` has label ``b`` and novel class ``n`` has label ``B + n``.
    """

    novel: Episode
    base_classes: torch.Tensor
    base_samples: torch.Tensor


def sample_episode(
    num_classes: int,
    samples_per_class: int,
    n_way: int,
    k_shot: int,
    n_query: int,
    generator: torch.Generator,
    *,
    allowed_samples: torch.Tensor | None = None,
) -> Episode:
    """Draw N distinct classes and, per class, K support + Q query distinct samples.

    ``allowed_samples`` (1-D sample ids) restricts which samples may be drawn (default all S).
    """
    pool = torch.arange(samples_per_class) if allowed_samples is None else allowed_samples
    if n_way > num_classes:
        raise ValueError(f"`n_way` expected <= {num_classes} classes, got {n_way}")
    if k_shot + n_query > pool.numel():
        raise ValueError(f"`k_shot + n_query` expected <= {pool.numel()} samples, got {k_shot + n_query}")
    classes = torch.randperm(num_classes, generator=generator)[:n_way]
    order = torch.argsort(torch.rand(n_way, pool.numel(), generator=generator), dim=1)
    picks = pool[order[:, : k_shot + n_query]]  # [N, K+Q]
    return Episode(classes, picks[:, :k_shot], picks[:, k_shot:])


def sample_generalized_episode(
    num_novel: int,
    num_base: int,
    samples_per_class: int,
    n_way: int,
    k_shot: int,
    n_query: int,
    n_base_query: int,
    generator: torch.Generator,
    *,
    base_samples: torch.Tensor | None = None,
) -> GeneralizedEpisode:
    """A novel episode plus ``n_base_query`` base query samples (uniform over base classes,
    sample ids drawn from ``base_samples``, default all)."""
    novel = sample_episode(num_novel, samples_per_class, n_way, k_shot, n_query, generator)
    pool = torch.arange(samples_per_class) if base_samples is None else base_samples
    bc = torch.randint(num_base, (n_base_query,), generator=generator)
    bs = pool[torch.randint(pool.numel(), (n_base_query,), generator=generator)]
    return GeneralizedEpisode(novel, bc, bs)


def gather(pool: torch.Tensor, classes: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
    """``pool[classes[n], samples[n, j]]`` for a pool ``[C, S, ...]`` → ``[N, J, ...]``.

    ``classes`` ``[N]`` with ``samples`` ``[N, J]``, or both ``[M]`` (→ ``[M, ...]``).
    """
    if samples.dim() == 2:
        return pool[classes[:, None], samples]
    return pool[classes, samples]
