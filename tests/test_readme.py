"""Every ```python snippet in README.md and docs/*.md runs as written (in one namespace per file)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _snippets():
    for path in FILES:
        if path.exists():
            blocks = BLOCK.findall(path.read_text())
            if blocks:
                yield pytest.param(path, blocks, id=path.relative_to(REPO).as_posix())


def test_readme_has_snippets():
    assert any(True for _ in _snippets()), "README.md shows no python usage"


@pytest.mark.parametrize("path, blocks", list(_snippets()))
def test_snippets_run(path, blocks, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # snippets that write files write them here
    namespace: dict = {"__name__": "__readme__"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{path.name}[snippet {i}]", "exec"), namespace)
        except Exception as e:  # pragma: no cover - the message is the point
            raise AssertionError(f"{path.name} snippet {i} failed: {type(e).__name__}: {e}\n{code}") from e
