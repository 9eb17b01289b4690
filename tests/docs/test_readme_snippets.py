"""Every ```python block of README.md is run here as written (or listed with the reason it is not), so the
README and the code cannot drift apart. The README keeps one: the quick start, which is
``examples/quickstart.py`` (``tests/minibatch/test_parallel.py`` checks that they are the same text). The pages of the
documentation have their own runner, ``tests/docs/test_docs_snippets.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_docs_snippets import run_script

ROOT = Path(__file__).resolve().parents[2]

QUICK_START = "## Quick start (Python)"
RUN_HERE = {QUICK_START}
RUN_ELSEWHERE: dict = {}


def python_blocks():
    """``[(heading, code)]`` of README.md's ```python blocks, in order; ``heading`` is the nearest above."""
    text = (ROOT / "README.md").read_text()
    out = []
    for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
        headings = re.findall(r"^#{2,3} .*$", text[:m.start()], flags=re.M)
        out.append((headings[-1], m.group(1)))
    return out


def block(heading: str) -> str:
    found = [code for h, code in python_blocks() if h == heading]
    assert len(found) == 1, f"README.md has {len(found)} python blocks under {heading!r}"
    return found[0]


def test_every_python_block_is_run_or_explained():
    headings = [h for h, _ in python_blocks()]
    unknown = set(headings) - RUN_HERE - set(RUN_ELSEWHERE)
    assert not unknown, f"README python blocks under {unknown} are not run by any test: add them here"
    assert RUN_HERE | set(RUN_ELSEWHERE) <= set(headings), "a README section this test knows lost its block"


@pytest.mark.slow
def test_quick_start_block_runs(tmp_path):
    out = run_script(block(QUICK_START), tmp_path)
    lines = [line for line in out.splitlines() if line.startswith("epoch")]
    assert len(lines) == 5, out
    losses = [float(re.search(r"loss (\S+)", line).group(1)) for line in lines]
    assert losses[-1] < losses[0], out
    assert float(re.search(r"test accuracy (\S+)", lines[-1]).group(1)) > 0.5, out
