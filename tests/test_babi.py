"""bAbI loader on the real archive (MEMNETS_DATA, else ../shared/data from the repo root)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from memnets.tasks import babi

REPO = Path(__file__).resolve().parents[1]


def _data_dir() -> Path | None:
    for cand in (os.environ.get("MEMNETS_DATA"), REPO / ".." / "shared" / "data"):
        if cand and (Path(cand) / babi.ARCHIVE).is_file():
            return Path(cand)
    return None


DATA = _data_dir()
if DATA is None:
    print("skipping bAbI tests: no bAbI archive under $MEMNETS_DATA or ../shared/data")
pytestmark = pytest.mark.skipif(DATA is None, reason="no bAbI archive under $MEMNETS_DATA or ../shared/data")


def test_resolve_data_dir_order(monkeypatch, tmp_path):
    assert babi.resolve_data_dir(DATA) == DATA.resolve()
    monkeypatch.setenv("MEMNETS_DATA", str(tmp_path))
    assert babi.resolve_data_dir() == tmp_path.resolve()
    monkeypatch.delenv("MEMNETS_DATA")
    monkeypatch.chdir(REPO)
    default = REPO / ".." / "shared" / "data"
    if default.is_dir():
        assert babi.resolve_data_dir() == default.resolve()
    else:
        with pytest.raises(FileNotFoundError, match="shared/data"):
            babi.resolve_data_dir()
    with pytest.raises(FileNotFoundError, match="nope"):
        babi.resolve_data_dir(tmp_path / "nope")


@pytest.mark.parametrize("task", range(1, 21))
def test_counts_every_task(task):
    train = babi.load_task(task, "train", DATA)
    test = babi.load_task(task, "test", DATA)
    assert len(train) == 1000 and len(test) == 1000
    for ex in train[:50]:
        assert ex.task == task and ex.question and ex.answer
        assert set(ex.supporting) <= set(ex.story_ids)  # support refers to story sentences


def test_first_story_parsed():
    ex = babi.load_task(1, "train", DATA)[0]
    assert ex.story == (("mary", "moved", "to", "the", "bathroom"), ("john", "went", "to", "the", "hallway"))
    assert ex.story_ids == (1, 2)
    assert ex.question == ("where", "is", "mary")
    assert ex.answer == "bathroom" and ex.answer_words == ("bathroom",) and ex.supporting == (1,)
    # the second question of the story sees the first four sentences (question lines excluded)
    ex2 = babi.load_task(1, "train", DATA)[1]
    assert len(ex2.story) == 4 and ex2.story_ids == (1, 2, 4, 5)


def test_list_answers_task8_and_19():
    t8 = babi.load_task(8, "train", DATA)
    assert any(len(ex.answer_words) > 1 for ex in t8)
    multi = next(ex for ex in t8 if len(ex.answer_words) > 1)
    assert multi.answer == ",".join(multi.answer_words)
    t19 = babi.load_task(19, "test", DATA)
    assert all(len(ex.answer_words) == 2 for ex in t19)
    v = babi.build_vocab(t8)
    assert multi.answer in v  # the whole list is one answer class


def test_story_length_matches_readme():
    assert max(len(ex.story) for ex in babi.load_task(3, "train", DATA)) == 224
    assert max(len(ex.story) for ex in babi.load_task(2, "train", DATA)) == 56


def test_vocab_and_vectorize():
    train = babi.load_task(2, "train", DATA)
    v = babi.build_vocab(train)
    assert v.itos[0] == babi.PAD and v.itos[1:] == sorted(v.itos[1:])
    assert babi.build_vocab(list(reversed(train))).itos == v.itos  # deterministic
    x = babi.vectorize(train[:20], v, memory_size=50)
    N, M, W = x.stories.shape
    assert (N, M) == (20, 50) and x.queries.shape == (20, W) and x.answers.shape == (20,)
    ex = train[19]
    # slot 0 is the most recent sentence; the 50 most recent kept
    last = ex.story[-1]
    assert v.decode(x.stories[19, 0, : len(last)]) == list(last)
    n_sent = min(len(ex.story), 50)
    assert bool((x.stories[19, n_sent:] == 0).all()) and bool((x.stories[19, :n_sent, 0] != 0).all())
    long_ex = max(train, key=lambda e: len(e.story))
    xl = babi.vectorize([long_ex], v, memory_size=50)
    assert v.decode(xl.stories[0, 49, : len(long_ex.story[-50])]) == list(long_ex.story[-50])
    assert v.decode(x.answers[:3]) == [e.answer for e in train[:3]]
    with pytest.raises(ValueError, match="sentence_size"):
        babi.vectorize(train[:5], v, sentence_size=2)


def test_validation_split_seeded_and_per_task():
    joint = babi.load_joint("train", DATA, tasks=(1, 2))
    tr, va = babi.split_validation(joint, 0.1, seed=3)
    tr2, va2 = babi.split_validation(joint, 0.1, seed=3)
    assert va == va2 and len(va) == 200 and len(tr) == 1800
    assert sum(ex.task == 1 for ex in va) == 100
    _, va3 = babi.split_validation(joint, 0.1, seed=4)
    assert va3 != va


def test_missing_10k_task3():
    with pytest.raises(FileNotFoundError, match="en-10k task 3 train"):
        babi.load_task(3, "train", DATA, ten_k=True)
    assert len(babi.load_task(1, "train", DATA, ten_k=True)) == 10000
    with pytest.warns(UserWarning, match="skipping task 3"):
        per = babi.load_tasks([2, 3], "train", DATA, ten_k=True)
    assert sorted(per) == [2] and len(per[2]) == 10000
    with pytest.warns(UserWarning, match="using the 1k file"):
        per = babi.load_tasks([3], "train", DATA, ten_k=True, fallback_1k=True)
    assert len(per[3]) == 1000


def test_corrupt_and_missing_archive(tmp_path):
    src = DATA / babi.ARCHIVE
    bad = tmp_path / "babi" / Path(babi.ARCHIVE).name
    bad.parent.mkdir()
    bad.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        babi.load_task(1, "train", tmp_path)
    bad.unlink()
    with pytest.raises(FileNotFoundError, match="bAbI archive not found"):
        babi.load_task(1, "train", tmp_path)


def test_parse_errors_and_bad_args():
    with pytest.raises(ValueError, match="src:2"):
        babi.parse_babi(["1 Mary went home.", "x broken"], 1, source="src")
    with pytest.raises(ValueError, match="supporting"):
        babi.parse_babi(["1 Where is Mary? \thome\tone"], 1, source="src")
    with pytest.raises(ValueError, match="task"):
        babi.load_task(21, "train", DATA)
    with pytest.raises(ValueError, match="split"):
        babi.load_task(1, "valid", DATA)
    assert isinstance(babi.vectorize(babi.load_task(1, "test", DATA)[:2], babi.build_vocab(
        babi.load_task(1, "test", DATA))).stories, torch.Tensor)
