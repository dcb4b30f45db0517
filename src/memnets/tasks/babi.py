"""bAbI question answering tasks 1-20, v1.2 (Weston et al. 2015), read from the real archive.

The data directory comes from ``data_dir``, else the ``MEMNETS_DATA`` environment variable,
else ``../shared/data`` relative to the current working directory (:func:`resolve_data_dir`).
The task files ``tasks_1-20_v1-2/{en,en-10k}/qa{N}_{name}_{train,test}.txt`` are read from the
first of these found in ``<data>/babi/`` (:data:`SOURCES`): the official archive
``tasks_1-20_v1-2.tar.gz`` (what ``memnets data download babi --to <data>`` fetches), the
repacked ``tasks_1-20_v1-2_en_en-10k.tar.gz`` (``en`` and ``en-10k`` only), or the unpacked
folder ``tasks_1-20_v1-2/``. Archives are read without unpacking. Used by the MemN2N
experiments (docs/maths.md §9, §11).

Worked example (task 1, first story)::

    1 Mary moved to the bathroom.
    2 John went to the hallway.
    3 Where is Mary? \tbathroom\t1

gives one :class:`BabiExample` with ``story = (("mary", "moved", "to", "the", "bathroom"),
("john", "went", "to", "the", "hallway"))``, ``story_ids = (1, 2)``,
``question = ("where", "is", "mary")``, ``answer = "bathroom"``, ``answer_words = ("bathroom",)``,
``supporting = (1,)``. Task 8 / 19 answers such as ``apple,milk`` keep the whole string as one
answer class (``answer = "apple,milk"``) and the list as ``answer_words = ("apple", "milk")``.

Vectorised for MemN2N (:func:`vectorize`): stories ``[N, M, W]`` with slot 0 the *most recent*
sentence (the paper indexes sentences in reverse order), padding sentences all-zero at the end,
queries ``[N, W]``, answers ``[N]``; token id 0 is the padding / nil word.
"""
from __future__ import annotations

import functools
import os
import random
import re
import shlex
import tarfile
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

import torch

from ..data_download import BABI_ARCHIVE, BABI_FOLDER, BABI_REPACK, missing_message
from ..datadir import resolve_data_dir, verify_file

__all__ = [
    "TASK_NAMES", "ARCHIVE", "OFFICIAL_ARCHIVE", "FOLDER", "SOURCES", "PAD", "BabiExample", "BabiTensors", "Vocabulary",
    "resolve_data_dir", "archive_path", "member_name", "tokenize", "parse_babi", "load_task",
    "load_tasks", "load_joint", "split_validation", "build_vocab", "vectorize",
]

TASK_NAMES: dict[int, str] = {
    1: "single-supporting-fact", 2: "two-supporting-facts", 3: "three-supporting-facts",
    4: "two-arg-relations", 5: "three-arg-relations", 6: "yes-no-questions", 7: "counting",
    8: "lists-sets", 9: "simple-negation", 10: "indefinite-knowledge", 11: "basic-coreference",
    12: "conjunction", 13: "compound-coreference", 14: "time-reasoning", 15: "basic-deduction",
    16: "basic-induction", 17: "positional-reasoning", 18: "size-reasoning", 19: "path-finding",
    20: "agents-motivations",
}
ARCHIVE = BABI_REPACK                # "babi/tasks_1-20_v1-2_en_en-10k.tar.gz": en + en-10k, repacked
OFFICIAL_ARCHIVE = BABI_ARCHIVE      # "babi/tasks_1-20_v1-2.tar.gz": the official archive
FOLDER = BABI_FOLDER                 # "babi/tasks_1-20_v1-2": either archive, unpacked
SOURCES = (OFFICIAL_ARCHIVE, ARCHIVE, FOLDER)  # in the order they are looked for
PAD = "<pad>"
_ROOT = "tasks_1-20_v1-2"
_MISSING_10K = {(3, "train")}  # absent from the repacked archive (ARCHIVE); the official one has it
_MEMBER = re.compile(r"^tasks_1-20_v1-2/(en|en-10k)/qa\d+_[a-z-]+_(train|test)\.txt$")
_TOKEN = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class BabiExample:
    """One question with the story sentences that precede it.

    story: the non-question lines of the story before the question, oldest first, tokenised.
    story_ids: the line ID of each story sentence (supporting facts refer to these IDs).
    answer: the answer string, one class (``"apple,milk"`` for a task 8 list).
    answer_words: the answer split on commas (``("apple", "milk")``; ``("bathroom",)``).
    supporting: the supporting-fact line IDs.
    """

    task: int
    story: tuple[tuple[str, ...], ...]
    story_ids: tuple[int, ...]
    question: tuple[str, ...]
    answer: str
    answer_words: tuple[str, ...]
    supporting: tuple[int, ...]


class BabiTensors(NamedTuple):
    """Vectorised examples: ``stories [N, M, W]``, ``queries [N, W]``, ``answers [N]`` (long),
    ``tasks [N]`` (long, task number 1-20). Story slot 0 is the most recent sentence."""

    stories: torch.Tensor
    queries: torch.Tensor
    answers: torch.Tensor
    tasks: torch.Tensor


def archive_path(data_dir: str | os.PathLike | None = None) -> Path:
    """Where the bAbI files are read from: the first of :data:`SOURCES` present in the data
    directory (an archive file, or the unpacked folder ``babi/tasks_1-20_v1-2``).

    Raises FileNotFoundError naming the accepted names and the command that downloads them.
    """
    root = resolve_data_dir(data_dir)
    for rel in SOURCES:
        path = root / rel
        if path.is_dir() if rel == FOLDER else path.is_file():
            return path
    raise FileNotFoundError(missing_message(
        "babi", f"bAbI archive not found in the data directory {str(root)!r}: expected {OFFICIAL_ARCHIVE} "
        f"(the official archive), {ARCHIVE}, or the unpacked folder {FOLDER}/", root))


def member_name(task: int, split: str, ten_k: bool = False) -> str:
    """Archive member of a task file, e.g. ``tasks_1-20_v1-2/en/qa1_single-supporting-fact_train.txt``."""
    if task not in TASK_NAMES:
        raise ValueError(f"`task` expected an integer in 1..20, got {task!r}")
    if split not in ("train", "test"):
        raise ValueError(f"`split` expected 'train' or 'test', got {split!r}")
    return f"{_ROOT}/{'en-10k' if ten_k else 'en'}/qa{task}_{TASK_NAMES[task]}_{split}.txt"


@functools.lru_cache(maxsize=4)
def _read_archive(path: str, mtime_ns: int, size: int) -> dict[str, str]:
    """The ``en`` and ``en-10k`` task files of the archive, keyed by member name (cached per
    file version; the official archive's other folders are skipped)."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            return {m.name: tar.extractfile(m).read().decode("ascii")  # type: ignore[union-attr]
                    for m in tar if m.isfile() and _MEMBER.match(m.name)}
    except (tarfile.TarError, EOFError, zlib.error, UnicodeDecodeError, OSError) as e:
        raise ValueError(
            f"bAbI archive {path!r} is corrupt or truncated: expected a complete gzip-compressed "
            f"tar of tasks_1-20_v1-2 ({type(e).__name__}: {e})") from e


def _member_text(data_dir: str | os.PathLike | None, name: str) -> tuple[Path, str | None]:
    """``(source, text)`` of member ``name`` (text None when the source lacks it)."""
    path = archive_path(data_dir)
    if path.is_dir():  # the unpacked folder: member names are relative to its parent
        f = path.parent / name
        try:
            return path, f.read_text(encoding="ascii") if f.is_file() else None
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"bAbI file {str(f)!r} could not be read: {e}") from e
    verify_file(path, path.parents[1])  # against the data directory's SHA256SUMS, once
    st = path.stat()
    return path, _read_archive(str(path), st.st_mtime_ns, st.st_size).get(name)


def tokenize(sentence: str) -> tuple[str, ...]:
    """Lower-case word tokens, punctuation dropped: ``"Where is Mary?" -> ("where", "is", "mary")``."""
    return tuple(_TOKEN.findall(sentence.lower()))


def parse_babi(lines: Iterable[str], task: int, source: str = "<lines>") -> list[BabiExample]:
    """Parse bAbI lines (``ID text`` or ``ID question\\tanswer\\tsupporting IDs``) into examples.

    Story IDs restart at 1; each question sees the story sentences before it (question lines
    are numbered but not part of the story). Malformed lines raise ValueError naming
    ``source`` and the line number.
    """
    examples: list[BabiExample] = []
    story: list[tuple[str, ...]] = []
    ids: list[int] = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.rstrip("\n")
        if not line.strip():
            continue
        head, _, rest = line.partition(" ")
        if not head.isdigit() or not rest:
            raise ValueError(f"{source}:{lineno}: expected 'ID text', got {line[:60]!r}")
        line_id = int(head)
        if line_id == 1:
            story, ids = [], []
        if "\t" in rest:
            parts = rest.split("\t")
            if len(parts) != 3 or not parts[1].strip():
                raise ValueError(f"{source}:{lineno}: expected 'ID question<TAB>answer<TAB>"
                                 f"supporting IDs', got {line[:60]!r}")
            question, answer, support = parts[0], parts[1].strip(), parts[2].split()
            if not all(s.isdigit() for s in support):
                raise ValueError(f"{source}:{lineno}: supporting fact IDs must be integers, got {parts[2]!r}")
            examples.append(BabiExample(
                task=task, story=tuple(story), story_ids=tuple(ids), question=tokenize(question),
                answer=answer.lower(), answer_words=tuple(w for w in answer.lower().split(",")),
                supporting=tuple(int(s) for s in support)))
        else:
            story.append(tokenize(rest))
            ids.append(line_id)
    return examples


def load_task(task: int, split: str = "train", data_dir: str | os.PathLike | None = None,
              ten_k: bool = False) -> list[BabiExample]:
    """Examples of one task file (``en`` = 1k, ``en-10k`` when ``ten_k``).

    Raises FileNotFoundError when the data or the member is absent (for en-10k task 3 train,
    absent from the repacked archive, with a message saying so), naming the command that
    downloads the official archive, and ValueError when the archive is corrupt.
    """
    name = member_name(task, split, ten_k)
    path, text = _member_text(data_dir, name)
    if text is None:
        root = path.parents[1]
        if ten_k and (task, split) in _MISSING_10K:
            raise FileNotFoundError(
                f"{name} is missing from {str(path)!r}: the en-10k task 3 train file is not in this copy "
                f"of bAbI; the official archive has it (`memnets data download babi --to "
                f"{shlex.quote(str(root))}`), or use the 1k file instead (load_joint(..., fallback_1k=True)) "
                "or skip task 3")
        raise FileNotFoundError(missing_message(
            "babi", f"member {name!r} not found in the bAbI data {str(path)!r}", root))
    return parse_babi(text.splitlines(), task, source=f"{path}:{name}")


def load_tasks(tasks: Sequence[int], split: str = "train", data_dir: str | os.PathLike | None = None,
               ten_k: bool = False, fallback_1k: bool = False) -> dict[int, list[BabiExample]]:
    """Examples per task. With ``ten_k``, a task whose 10k file is missing (task 3 train) is
    skipped with a warning, or read from the 1k file with a warning when ``fallback_1k``."""
    out: dict[int, list[BabiExample]] = {}
    for t in tasks:
        try:
            out[t] = load_task(t, split, data_dir, ten_k)
        except FileNotFoundError:
            if not (ten_k and (t, split) in _MISSING_10K):
                raise
            if fallback_1k:
                warnings.warn(f"en-10k task {t} {split} file is missing from the data; "
                              f"using the 1k file (1000 questions) for task {t}", stacklevel=2)
                out[t] = load_task(t, split, data_dir, ten_k=False)
            else:
                warnings.warn(f"en-10k task {t} {split} file is missing from the data; "
                              f"skipping task {t}", stacklevel=2)
    return out


def load_joint(split: str = "train", data_dir: str | os.PathLike | None = None, ten_k: bool = False,
               fallback_1k: bool = False, tasks: Sequence[int] = tuple(range(1, 21))) -> list[BabiExample]:
    """All examples of ``tasks`` concatenated in task order (the joint training set)."""
    per = load_tasks(tasks, split, data_dir, ten_k, fallback_1k)
    return [ex for t in sorted(per) for ex in per[t]]


def split_validation(examples: Sequence[BabiExample], fraction: float = 0.1,
                     seed: int = 0) -> tuple[list[BabiExample], list[BabiExample]]:
    """Seeded random ``(train, valid)`` split; ``valid`` holds ``round(fraction * N)`` examples
    of each task (so a joint set keeps every task represented)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"`fraction` expected a value in [0, 1), got {fraction!r}")
    rng = random.Random(seed)
    by_task: dict[int, list[int]] = {}
    for i, ex in enumerate(examples):
        by_task.setdefault(ex.task, []).append(i)
    valid_idx: set[int] = set()
    for t in sorted(by_task):
        idx = by_task[t][:]
        rng.shuffle(idx)
        valid_idx.update(idx[: int(round(fraction * len(idx)))])
    train = [ex for i, ex in enumerate(examples) if i not in valid_idx]
    valid = [ex for i, ex in enumerate(examples) if i in valid_idx]
    return train, valid


class Vocabulary:
    """Deterministic word vocabulary: ``PAD`` (the nil word) is id 0, then all words of
    stories, questions and answer strings, sorted. Multi-word answers (``"apple,milk"``)
    are single entries, so one answer string is one class."""

    def __init__(self, words: Iterable[str]):
        self.itos: list[str] = [PAD] + sorted(set(words) - {PAD})
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def encode(self, words: Sequence[str]) -> list[int]:
        """Ids of ``words``; an unknown word raises KeyError naming it."""
        try:
            return [self.stoi[w] for w in words]
        except KeyError as e:
            raise KeyError(f"word {e.args[0]!r} is not in the vocabulary ({len(self)} entries)") from None

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[int(i)] for i in ids]


def build_vocab(*example_sets: Iterable[BabiExample]) -> Vocabulary:
    """Vocabulary over every word and answer string of the given example sets."""
    words: set[str] = set()
    for examples in example_sets:
        for ex in examples:
            for s in ex.story:
                words.update(s)
            words.update(ex.question)
            words.add(ex.answer)
            words.update(ex.answer_words)
    return Vocabulary(words)


def vectorize(examples: Sequence[BabiExample], vocab: Vocabulary, memory_size: int = 50,
              sentence_size: int | None = None) -> BabiTensors:
    """Pad examples into MemN2N tensors.

    Keeps the ``memory_size`` most recent story sentences, stored most recent first
    (slot 0 = the sentence just before the question); padding sentences and words are 0.
    ``sentence_size`` (default: the longest sentence or question) is ``W``; a longer
    sentence raises ValueError. Returns :class:`BabiTensors`: stories ``[N, M, W]``,
    queries ``[N, W]``, answers ``[N]`` (ids of the answer strings), tasks ``[N]``.
    """
    if memory_size < 1:
        raise ValueError(f"`memory_size` expected an integer >= 1, got {memory_size!r}")
    longest = max([len(s) for ex in examples for s in ex.story] + [len(ex.question) for ex in examples] + [1])
    W = longest if sentence_size is None else sentence_size
    if longest > W:
        raise ValueError(f"`sentence_size` expected >= {longest} (the longest sentence), got {W}")
    pad_sent = [0] * W
    rows, qrows = [], []
    for ex in examples:
        recent = ex.story[::-1][:memory_size]  # most recent first
        sents = [vocab.encode(s) + [0] * (W - len(s)) for s in recent]
        rows.append(sents + [pad_sent] * (memory_size - len(sents)))
        qrows.append(vocab.encode(ex.question) + [0] * (W - len(ex.question)))
    stories = torch.tensor(rows, dtype=torch.long).reshape(len(examples), memory_size, W)  # [N, M, W]
    queries = torch.tensor(qrows, dtype=torch.long).reshape(len(examples), W)  # [N, W]
    answers = torch.tensor([vocab.stoi[ex.answer] for ex in examples], dtype=torch.long)
    tasks = torch.tensor([ex.task for ex in examples], dtype=torch.long)
    return BabiTensors(stories, queries, answers, tasks)
