"""Omniglot loader, Vinyals splits with rotations, and the episode samplers (real data, small subset)."""
from __future__ import annotations

import zipfile

import pytest
import torch

from memnets.tasks import omniglot as og

# 14 background characters (train split only) + 45 evaluation characters (4 of them in the test split)
SUBSET = ["Blackfoot_(Canadian_Aboriginal_Syllabics)", "Gurmukhi"]


@pytest.fixture(scope="module")
def subset(tmp_path_factory, request):
    from conftest import data_dir

    d = data_dir()
    if d is None:
        msg = "real data not found: set MEMNETS_DATA or place shared/data beside the repository"
        print(msg)
        pytest.skip(msg)
    cache = tmp_path_factory.mktemp("omni_cache")
    return d, cache, og.load_images(d, cache_dir=cache, alphabets=SUBSET)


def test_subset_counts_and_pixels(subset):
    _, cache, imgs = subset
    assert len(imgs.characters) == 14 + 45
    assert imgs.images.shape == (59, 20, 28, 28) and imgs.images.dtype == torch.uint8
    assert imgs.characters[0] == "Blackfoot_(Canadian_Aboriginal_Syllabics)/character01"
    assert list(imgs.characters) == sorted(imgs.characters)
    ink = imgs.images.float().mean() / 255
    assert 0.03 < ink < 0.25  # strokes are a small fraction of the picture
    assert int(imgs.images[:, :, 0, 0].max()) < 64  # the corners are background (0 after inversion)


def test_cache_written_atomically_and_reused(subset):
    d, cache, imgs = subset
    files = list(cache.iterdir())
    assert len(files) == 1 and files[0].suffix == ".pt"  # no temp file left behind
    again = og.load_images(d, cache_dir=cache, alphabets=list(reversed(SUBSET)))
    assert again.characters == imgs.characters and torch.equal(again.images, imgs.images)


def test_split_lines_and_rotations(subset):
    d, _, imgs = subset
    train = og.load_split("train", d, images=imgs, alphabets=SUBSET[:1])
    assert len(train.classes) == 56 and train.images.shape == (56, 20, 28, 28)
    assert train.classes[:4] == tuple(f"Blackfoot_(Canadian_Aboriginal_Syllabics)/character01/rot{r:03d}" for r in (0, 90, 180, 270))
    raw = imgs.images[imgs.index()["Blackfoot_(Canadian_Aboriginal_Syllabics)/character01"]]
    assert torch.equal(train.images[0], raw)
    assert torch.equal(train.images[1], torch.rot90(raw, 1, (-2, -1)))
    assert torch.equal(train.images[2], raw.flip(-1).flip(-2))
    assert torch.equal(torch.rot90(train.images[3], 1, (-2, -1)), raw)
    test = og.load_split("test", d, images=imgs, alphabets=["Gurmukhi"])
    assert len(test.classes) == 16 and all(c.startswith("Gurmukhi/") for c in test.classes)


def test_full_split_files(subset):
    d, _, _ = subset
    sizes = {s: len(og.read_split(s, d)) for s in og.SPLITS}
    assert sizes == {"train": 4112, "val": 688, "test": 1692, "trainval": 4800}
    assert not set(og.read_split("train", d)) & set(og.read_split("test", d))
    with pytest.raises(ValueError, match="name"):
        og.read_split("dev", d)


def test_missing_and_corrupt_zip_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="images_background.zip"):
        og.load_images(tmp_path, use_cache=False)
    (tmp_path / "omniglot").mkdir()
    (tmp_path / "omniglot" / "images_background.zip").write_bytes(b"not a zip file at all")
    with pytest.raises(ValueError, match="images_background.zip"):
        og.load_images(tmp_path, use_cache=False)
    with zipfile.ZipFile(tmp_path / "omniglot" / "images_background.zip", "w") as zf:
        zf.writestr("images_background/A/character01/x_01.png", b"\x89PNG broken")
    with pytest.raises(ValueError, match="images_background.zip"):
        og.load_images(tmp_path, use_cache=False)


def test_resolve_data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMNETS_DATA", str(tmp_path))
    assert og.resolve_data_dir() == tmp_path.resolve()
    with pytest.raises(FileNotFoundError, match="data_dir argument"):
        og.resolve_data_dir(tmp_path / "x")
    monkeypatch.delenv("MEMNETS_DATA")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="shared/data"):
        og.resolve_data_dir()


def test_episode_sampler_shapes_labels_and_seed():
    g = torch.Generator().manual_seed(3)
    ep = og.sample_episode(30, 20, 5, 2, 3, g)
    assert ep.classes.shape == (5,) and ep.support.shape == (5, 2) and ep.query.shape == (5, 3)
    assert ep.classes.unique().numel() == 5 and int(ep.classes.max()) < 30
    for n in range(5):  # support and query drawn without replacement within a class
        assert torch.cat([ep.support[n], ep.query[n]]).unique().numel() == 5
    again = og.sample_episode(30, 20, 5, 2, 3, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(ep, again))
    allowed = torch.arange(10, 15)
    ep2 = og.sample_episode(30, 20, 4, 1, 4, g, allowed_samples=allowed)
    assert bool(((ep2.support >= 10) & (ep2.support < 15)).all()) and bool(((ep2.query >= 10) & (ep2.query < 15)).all())
    with pytest.raises(ValueError, match="k_shot"):
        og.sample_episode(30, 20, 5, 10, 11, g)
    with pytest.raises(ValueError, match="n_way"):
        og.sample_episode(3, 20, 5, 1, 1, g)


def test_gather_and_labels_follow_classes():
    pool = torch.arange(6 * 20).reshape(6, 20)  # value = class * 20 + sample
    ep = og.sample_episode(6, 20, 3, 2, 2, torch.Generator().manual_seed(0))
    s = og.gather(pool, ep.classes, ep.support)
    assert s.shape == (3, 2)
    assert torch.equal(s // 20, ep.classes[:, None].expand(3, 2))  # row n holds class n's samples
    assert torch.equal(s % 20, ep.support)
    flat = og.gather(pool, torch.tensor([1, 4]), torch.tensor([0, 19]))
    assert flat.tolist() == [20, 99]


def test_generalized_episode():
    g = torch.Generator().manual_seed(1)
    ge = og.sample_generalized_episode(40, 100, 20, 5, 1, 15, 75, g, base_samples=torch.arange(15, 20))
    assert ge.novel.support.shape == (5, 1) and ge.novel.query.shape == (5, 15)
    assert ge.base_classes.shape == (75,) and ge.base_samples.shape == (75,)
    assert int(ge.base_classes.max()) < 100 and bool((ge.base_samples >= 15).all())


def test_to_float():
    x = torch.tensor([[[0, 255]]], dtype=torch.uint8)
    y = og.to_float(x)
    assert y.shape == (1, 1, 1, 2) and y.flatten().tolist() == [0.0, 1.0]
