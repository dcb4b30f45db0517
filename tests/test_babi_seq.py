"""bAbI as a word sequence for DNC / LSAM / NAM-Transformer (the ``babi_seq`` task of
memnets.train.families.babi), on the real data."""
from __future__ import annotations

import pytest
import torch

from memnets.tasks import babi
from memnets.train import ConfigError, load_config, train
from memnets.train.families.babi import SEQ_MODELS, SeqQA, babi_table, encode_sequences, prepare_seq

TINY = ["epochs=1", "log_every=10", "model.d_model=8", "model.options.embedding_dim=8", "model.options.num_heads=2",
        "model.options.memory_slots=4", "model.options.word_size=4"]


@pytest.fixture
def data_env(real_data_dir, monkeypatch):
    monkeypatch.setenv("MEMNETS_DATA", str(real_data_dir))
    return real_data_dir


def _data(real_data_dir, tasks=(1,)):
    return prepare_seq(list(tasks), 50, 0.1, 0, data_dir=real_data_dir)


def test_encoding_matches_the_story(real_data_dir):
    vocab, answers, tr, va, te = _data(real_data_dir)
    ex = babi.load_task(1, "test", real_data_dir)[0]
    n = int(te.lengths[0])
    words = vocab.decode(te.tokens[0, :n].tolist())
    expected = [w for s in ex.story for w in (*s, ".")] + [*ex.question, "?"]
    assert words == expected and (te.tokens[0, n:] == 0).all()
    assert int(te.answers[0]) == answers[ex.answer] and len(answers) == 6
    assert len(tr.answers) == 900 and len(va.answers) == 100 and len(te.answers) == 1000


def test_list_answers_are_one_class(real_data_dir):
    _, answers, *_ = _data(real_data_dir, (8,))
    assert any("," in a for a in answers)


@pytest.mark.parametrize("kind", SEQ_MODELS)
def test_models_give_logits_at_the_last_position(kind):
    model = SeqQA(kind, 20, 5, 8, max_len=12, embedding_dim=8, num_heads=2, memory_slots=4, word_size=4)
    tokens = torch.randint(1, 20, (3, 12))
    lengths = torch.tensor([12, 7, 3])
    tokens[1, 7:] = 0
    tokens[2, 3:] = 0
    out = model(tokens, lengths)
    assert out.shape == (3, 5)
    # the padding after a sequence's end does not change its answer
    cut = model(tokens[2:, :3], lengths[2:])
    assert torch.allclose(out[2:], cut, atol=1e-5)


def test_lsam_learns_task1_above_chance(data_env, tmp_path):
    """A tiny LSAM trained for a few epochs on real task 1 beats the uniform guess (83% error)."""
    cfg = load_config("babi/seq-task1-lsam", ["epochs=4", "optim.lr=3e-3", "model.d_model=32",
                                               "model.options.embedding_dim=32", "model.options.num_heads=2"])
    res = train(cfg, tmp_path / "r", quiet=True)
    assert res["tasks"]["1"]["test_error"] < 65.0, res["tasks"]
    assert "| 1 | single-supporting-fact |" in babi_table([res])


@pytest.mark.parametrize("kind, task", [("dnc", 1), ("nam_transformer", 2)])
def test_every_model_runs_on_real_data(data_env, tmp_path, kind, task):
    """One short run per model; the Transformer's positions cover the test set, whose longest
    sequence can exceed the training set's (task 2: 318 against 312)."""
    res = train(load_config(f"babi/seq-task1-{kind}", [*TINY, f"task.options.tasks=[{task}]", "max_steps=3"]),
                tmp_path / "r", quiet=True)
    assert 0.0 <= res["tasks"][str(task)]["test_error"] <= 100.0 and res["steps"] == 3


def test_bad_settings():
    with pytest.raises(ConfigError, match="model.backbone"):
        load_config("babi/seq-task1-dnc", ["model.backbone=lstm"])
    with pytest.raises(ConfigError, match="task.options.tasks"):
        load_config("babi/seq-task1-dnc", ["task.options.tasks=[21]"])
    with pytest.raises(ValueError, match="kind"):
        SeqQA("ntm", 10, 2, 8, 5)
    with pytest.raises(ValueError, match="max_sentences"):
        encode_sequences([], babi.Vocabulary([]), {}, max_sentences=0)


def test_ten_k_trains_task3_from_its_1k_file(data_env, tmp_path):
    """``ten_k``: en-10k training files, task 3 from the 1k file (its 10k train file is absent);
    the table says so."""
    with pytest.warns(UserWarning, match="task 3"):
        _, _, tr, va, te = prepare_seq([1, 3], 50, 0.1, 0, ten_k=True, data_dir=data_env)
    n1 = int((tr.tasks == 1).sum() + (va.tasks == 1).sum())
    n3 = int((tr.tasks == 3).sum() + (va.tasks == 3).sum())
    assert n1 == 10_000 and n3 == 1_000
    with pytest.warns(UserWarning):
        res = train(load_config("babi/seq-task1-lsam", [*TINY, "task.options.tasks=[1, 3]", "task.options.ten_k=true",
                                                        "max_steps=2"]), tmp_path / "r", quiet=True)
    assert res["ten_k"] and res["task3_from_1k"] and res["joint"]
    table = babi_table([res])
    assert "en-10k" in table and "1k file" in table
