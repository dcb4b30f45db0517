"""bAbI as a word sequence for DNC / LSAM / NAM-Transformer (memnets.experiments.babi_seq)."""
from __future__ import annotations

import pytest
import torch

from memnets.experiments import babi_seq
from memnets.tasks import babi


def _data(real_data_dir, tasks=(1,)):
    return babi_seq.prepare(list(tasks), real_data_dir, max_sentences=50, seed=0)


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


@pytest.mark.parametrize("kind", babi_seq.SEQ_MODELS)
def test_models_give_logits_at_the_last_position(kind):
    cfg = babi_seq.SeqConfig(embedding_dim=8, hidden_size=8, num_heads=2, memory_slots=4, word_size=4)
    model = babi_seq.SeqQA(kind, 20, 5, cfg, max_len=12)
    tokens = torch.randint(1, 20, (3, 12))
    lengths = torch.tensor([12, 7, 3])
    tokens[1, 7:] = 0
    tokens[2, 3:] = 0
    out = model(tokens, lengths)
    assert out.shape == (3, 5)
    # the padding after a sequence's end does not change its answer
    cut = model(tokens[2:, :3], lengths[2:])
    assert torch.allclose(out[2:], cut, atol=1e-5)


def test_lsam_learns_task1_above_chance(real_data_dir):
    """A tiny LSAM trained for a few epochs on real task 1 beats the uniform guess (83% error)."""
    cfg = babi_seq.SeqConfig(embedding_dim=32, hidden_size=32, num_heads=2, epochs=4, lr=3e-3,
                             max_minutes=1.0)
    res = babi_seq.run(["lsam"], [1], False, cfg, real_data_dir, log=lambda s: None)
    t1 = res["models"]["lsam"]["tasks"][1]
    assert t1["uniform_guess_error"] == pytest.approx(83.3, abs=0.1)
    assert t1["test_error"] < 65.0, t1
    assert "| 1 | single-supporting-fact |" in babi_seq.markdown_table(res)


@pytest.mark.parametrize("kind, task", [("dnc", 1), ("nam_transformer", 2)])
def test_every_model_runs_on_real_data(real_data_dir, kind, task):
    """One short epoch (capped at 3 s) per model; the Transformer's positions cover the test
    set, whose longest sequence can exceed the training set's (task 2: 318 against 312)."""
    cfg = babi_seq.SeqConfig(embedding_dim=8, hidden_size=8, num_heads=2, memory_slots=4, word_size=4,
                             epochs=1, max_minutes=0.05)
    saved = []
    res = babi_seq.run([kind], [task], False, cfg, real_data_dir, log=lambda s: None, on_model=saved.append)
    assert 0.0 <= res["models"][kind]["tasks"][task]["test_error"] <= 100.0 and saved == [res]


def test_bad_arguments(real_data_dir):
    cfg = babi_seq.SeqConfig()
    with pytest.raises(ValueError, match="models"):
        babi_seq.run(["lstm"], [1], False, cfg, real_data_dir)
    with pytest.raises(ValueError, match="tasks"):
        babi_seq.run(["dnc"], [21], False, cfg, real_data_dir)
    with pytest.raises(ValueError, match="kind"):
        babi_seq.SeqQA("ntm", 10, 2, cfg, 5)
    with pytest.raises(ValueError, match="max_sentences"):
        babi_seq.encode_sequences([], babi.Vocabulary([]), {}, max_sentences=0)


def test_ten_k_trains_task3_from_its_1k_file(real_data_dir):
    """``ten_k``: en-10k training files, task 3 from the 1k file (its 10k train file is absent);
    the table says so."""
    cfg = babi_seq.SeqConfig(embedding_dim=8, hidden_size=8, num_heads=2, epochs=1, max_minutes=0.02)
    with pytest.warns(UserWarning, match="task 3"):
        _, _, tr, va, te = babi_seq.prepare([1, 3], real_data_dir, ten_k=True)
    n1 = int((tr.tasks == 1).sum() + (va.tasks == 1).sum())
    n3 = int((tr.tasks == 3).sum() + (va.tasks == 3).sum())
    assert n1 == 10_000 and n3 == 1_000
    with pytest.warns(UserWarning):
        res = babi_seq.run(["lsam"], [1, 3], True, cfg, real_data_dir, log=lambda s: None, ten_k=True)
    assert res["data"] == "en-10k" and res["task3_from_1k"]
    assert "en-10k" in babi_seq.markdown_table(res) and "1k file" in babi_seq.markdown_table(res)
