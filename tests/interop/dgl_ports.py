"""What the tests of gsplit's ports of DGL's examples share (``test_dgl_port.py``, ``test_dgl_link_port.py``).

A port is DGL's file with at most 8 changed code lines. DGL's file is stored as it ships in ``tests/data/``,
below an attribution header and :data:`MARKER`; the guide that presents the port shows the diff in its first
```` ```diff ```` block and says "N changed code lines". Neither check needs DGL.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

MARKER = "# ---- 8< ---- DGL's file follows, unchanged ----\n"


def is_code(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def changed_code_lines(a, b) -> Tuple[int, int, int]:
    """``(changed, removed, added)`` code lines: a replaced line counts once (per hunk, the larger side)."""
    changed = removed = added = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        r = sum(map(is_code, a[i1:i2]))
        d = sum(map(is_code, b[j1:j2]))
        changed, removed, added = changed + max(r, d), removed + r, added + d
    return changed, removed, added


@dataclass(frozen=True)
class DGLPort:
    """One port of a DGL example."""

    original: Path
    """DGL's file as stored in tests/data (attribution header, :data:`MARKER`, then DGL's text)."""
    port: Path
    """The port in examples/."""
    guide: Path
    """The docs page that shows the diff and the count."""
    dgl_name: str
    """The diff's header for DGL's side: its path in DGL's repository and version."""

    def original_lines(self) -> List[str]:
        """DGL's file as DGL ships it (the attribution header above the marker left out)."""
        text = self.original.read_text()
        assert MARKER in text, f"{self.original} lost its marker line"
        return text.split(MARKER, 1)[1].splitlines(keepends=True)

    def port_lines(self, without_header: bool = False) -> List[str]:
        lines = self.port.read_text().splitlines(keepends=True)
        if without_header:  # the port's leading comment block (what changed and how to run it)
            while lines and lines[0].startswith("#"):
                lines.pop(0)
        return lines

    def changed(self) -> Tuple[int, int, int]:
        return changed_code_lines(self.original_lines(), self.port_lines())

    def diff(self) -> str:
        """The diff the guide shows: DGL's file -> the port without its header comment, one line of context."""
        return "".join(difflib.unified_diff(self.original_lines(), self.port_lines(without_header=True),
                                            self.dgl_name, f"gsplit/examples/{self.port.name}", n=1))

    def check_guide(self, rewrite_with: str) -> None:
        """The guide's first diff block is :meth:`diff` and it states the count (else: run ``rewrite_with``)."""
        guide = self.guide.read_text()
        blocks = re.findall(r"```diff\n(.*?)```", guide, flags=re.S)
        assert blocks, f"{self.guide} has no ```diff block"
        assert blocks[0] == self.diff(), f"{self.guide}'s DGL diff is stale: run python {rewrite_with} to rewrite it"
        assert f"{self.changed()[0]} changed code lines" in guide

    def rewrite_guide(self) -> None:
        """Rewrite the guide's diff block and its count from the two files."""
        text = self.guide.read_text()
        new = re.sub(r"```diff\n.*?```", lambda m: "```diff\n" + self.diff() + "```", text, count=1, flags=re.S)
        n = self.changed()[0]
        self.guide.write_text(re.sub(r"\d+ changed code lines", f"{n} changed code lines", new))
        print(f"{self.guide}: diff rewritten ({n} changed code lines)")
