"""Every ```python snippet in README.md and docs/*.md runs as written (in one namespace per file)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
BASH = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
FIRST_RUN = "## A first run"
# appended to the first run's `memnets train` so that the test takes seconds, not a minute
TINY_TRAIN = ["max_steps=2", "task.train_size=32", "batch_size=16", "task.eval_size=16", "threads=1"]


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same level ("" if none)."""
    start = text.find("\n" + heading + "\n")
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(heading) + 2)
    return text[start:end if end >= 0 else len(text)]


def _snippets():
    for path in FILES:
        if path.exists():
            text = path.read_text()
            if path.name == "README.md":  # the first run's snippets need its run: test_readme_first_run
                text = text.replace(_section(text, FIRST_RUN), "\n")
            blocks = BLOCK.findall(text)
            if blocks:
                yield pytest.param(path, blocks, id=path.relative_to(REPO).as_posix())


def test_readme_has_snippets():
    assert any(True for _ in _snippets()), "README.md shows no python usage"


@pytest.mark.parametrize("path, blocks", list(_snippets()))
def test_snippets_run(path, blocks, tmp_path, monkeypatch):
    import memnets.registry

    monkeypatch.chdir(tmp_path)  # snippets that write files write them here
    # a model a snippet registers (docs/index.md) is forgotten afterwards; memnets' own models
    # are all registered first, so that the registry put back holds every one of them
    memnets.registry.available_models()
    monkeypatch.setattr(memnets.registry, "_REGISTRY", dict(memnets.registry._REGISTRY))
    namespace: dict = {"__name__": "__readme__"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{path.name}[snippet {i}]", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the message is the point
            raise AssertionError(f"{path.name} snippet {i} failed: {type(e).__name__}: {e}\n{code}") from e


def test_readme_first_run(tmp_path, monkeypatch, capsys):
    """The README's first run as written (train, eval, viz, report, then ``memnets.load_run``),
    with the training shortened by :data:`TINY_TRAIN`."""
    import shlex

    from memnets.cli.main import main

    section = _section((REPO / "README.md").read_text(), FIRST_RUN)
    assert section, f"README.md has no {FIRST_RUN!r} section"
    commands = [shlex.split(line, comments=True) for block in BASH.findall(section) for line in block.splitlines()]
    commands = [c for c in commands if c]
    assert [c[:2] for c in commands] == [["memnets", "train"], ["memnets", "eval"], ["memnets", "viz"],
                                         ["memnets", "report"]]
    snippets = BLOCK.findall(section)
    assert snippets and "memnets.load_run" in snippets[0]
    monkeypatch.chdir(tmp_path)
    for argv in commands:
        argv = argv[1:] + (TINY_TRAIN + ["--quiet"] if argv[1] == "train" else [])
        assert main(argv) == 0, (argv, capsys.readouterr().err)
    assert (tmp_path / "runs" / "report.html").is_file()
    assert list((tmp_path / "runs" / "first" / "figures").glob("*.png"))
    namespace: dict = {"__name__": "__readme__"}
    for i, code in enumerate(snippets):
        exec(compile(code, f"README.md[first run, snippet {i}]", "exec"), namespace)


FAMILY_PAGES = ["lra.md", "babi.md", "fewshot.md", "ntm.md", "capacity.md"]


def test_docs_index_gives_each_reader_a_path():
    index = (REPO / "docs" / "index.md").read_text()
    for path in ("use a memory layer", "reproduce a table", "add a model"):
        assert re.search(rf"^## Path \d: {path}", index, re.M | re.I), path
    for page in re.findall(r"\]\(([\w.-]+\.md)\)", index):
        assert (REPO / "docs" / page).is_file(), page
    readme = (REPO / "README.md").read_text()
    assert "docs/index.md" in readme and "memnets.load_run" in _section(readme, FIRST_RUN)


@pytest.mark.parametrize("page", FAMILY_PAGES)
def test_family_page_opens_with_its_table_and_command(page):
    text = (REPO / "docs" / page).read_text()
    heads = [m.start() for m in re.finditer(r"^## ", text, re.M)]
    top = text[:heads[1]] if len(heads) > 1 else text  # the title, the intro and the first section
    assert re.search(r"^\|.*\|\s*$", top, re.M), f"{page} does not open with its table"
    assert any("memnets " in block for block in BASH.findall(top)), f"{page} does not open with its command"


def _anchors(text: str) -> set[str]:
    """The anchors of the headings of a Markdown page, as GitHub makes them: lower case, marks
    other than ``-`` and ``_`` dropped, spaces to ``-``, a repeated anchor numbered ``-1``, ``-2``."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # a `# comment` in a code block is no heading
    seen: dict[str, int] = {}
    anchors = set()
    for title in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(f"{slug}-{n}" if n else slug)
    return anchors


def test_anchors_and_their_slugs():
    assert _anchors("# Repeat copy: batch 1, 96k (fourteen seeds)\n```bash\n# not a heading\n```\n## A\n## A\n") == {
        "repeat-copy-batch-1-96k-fourteen-seeds", "a", "a-1"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_links_to_a_section_find_it(path):
    """A link ``page.md#section`` (or ``#section``) in the docs names a heading that the page has."""
    text = path.read_text()
    for page, anchor in re.findall(r"\]\(([\w./-]*?\.md)?#([^)\s]+)\)", text):
        target = (path.parent / page) if page else path
        if target.is_file():
            assert anchor in _anchors(target.read_text()), f"{path.name}: no section #{anchor} in {target.name}"
