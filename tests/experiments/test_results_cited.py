"""Every file in experiments/results/ is cited, and every cited one is there.

A result a reader cannot reach from the docs is one they cannot tell current from superseded, and a number
whose file is gone cannot be checked. The citations are read from the pages that quote results
(``docs/benchmarks.md``, the measurement notes ``experiments/README.md``, the guides and the other docs pages)
and from the tests that read result files. A file counts as cited when its path under ``experiments/results/``
(or, where it is unique, its name) appears there; a figure ``NAME.png``, a printed log ``NAME.txt`` and the
rounds ``NAME_round<k>.json`` ride with a cited ``NAME.json`` (one run writes them together;
``docs/benchmarks.md`` says so). A cited path that names no file fails: a path written with
``experiments/results/`` or ``results/`` anywhere, and any result-like name (``*.json``, ``*.png``, ``*.txt``)
in the two results pages, unless it is a path elsewhere in the repository, a pattern (``NAME``, ``<k>``, ``*``), a
suffix shorthand (``_quiet.json``) or where a command writes (after ``--out``, ``--report`` or "writes").
"""

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results"
RESULT_PAGES = (ROOT / "docs" / "benchmarks.md", ROOT / "experiments" / "README.md")
"""The pages whose every result-like name must be a file in experiments/results/."""
TOKEN = re.compile(r"(?<![\w/.{},-])[\w./{},-]*[\w}]\.(?:json|png|txt|md)\b")
PATTERN = re.compile(r"NAME|<|\*|^[_.]")
"""Not a file: a pattern, or a suffix shorthand (``_quiet.json``: the one above it with that suffix)."""
OUTPUT = re.compile(r"(?:--(?:out|report)[ =]|writes )$")
"""A path after ``--out``, ``--report`` or "writes" is where a command would write, not a file cited."""


def _expand(token: str) -> list:
    """``a_{2m,10m}.json`` -> ``['a_2m.json', 'a_10m.json']`` (shell braces, as the docs write a pair).

    Example:
        >>> _expand("first_iteration_cpu_{2m,10m}.json")
        ['first_iteration_cpu_2m.json', 'first_iteration_cpu_10m.json']
    """
    parts = re.split(r"\{([^{}]*)\}", token)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _sources() -> list:
    docs = sorted((ROOT / "docs").rglob("*.md"))
    tests = sorted(p for p in (ROOT / "tests").rglob("*.py") if p.resolve() != Path(__file__).resolve())
    return [*RESULT_PAGES, *docs, *tests]


def _stored() -> set:
    return {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()
            and "scratch" not in p.relative_to(RESULTS).parts}


def _citations(stored: set):
    """``(cited, missing)``: stored paths cited, and ``{token: [source]}`` of cited paths that name no file."""
    by_name: dict = {}
    for rel in stored:
        by_name.setdefault(rel.rsplit("/", 1)[-1], []).append(rel)
    cited, missing = set(), {}
    for source in _sources():
        text = source.read_text()
        strict = source in RESULT_PAGES
        for match in TOKEN.finditer(text):
            token = match.group(0)
            if PATTERN.search(token) or OUTPUT.search(text[max(0, match.start() - 10):match.start()]):
                continue
            for name in _expand(token):
                prefixed = "results/" in name
                rel = name.split("experiments/results/")[-1].split("results/")[-1]
                if rel in stored:
                    cited.add(rel)
                elif "/" not in rel and len(by_name.get(rel, ())) == 1:
                    cited.add(by_name[rel][0])
                elif prefixed or (strict and "/" not in name and not rel.endswith(".md")
                                  and not (ROOT / name).exists()):
                    missing.setdefault(token, []).append(source.relative_to(ROOT).as_posix())
    return cited, missing


def _riders(cited: set, stored: set) -> set:
    """The figures, printed logs and rounds a cited JSON's run wrote beside it."""
    out = set()
    for rel in stored:
        stem = rel.rsplit(".", 1)[0]
        base = re.sub(r"_round\d+$", "", stem) if rel.endswith(".json") else stem
        if f"{base}.json" in cited and rel != f"{base}.json":
            out.add(rel)
    return out


def test_every_result_file_is_cited_by_a_page_or_a_test():
    stored = _stored()
    cited, _ = _citations(stored)
    uncited = sorted(stored - cited - _riders(cited, stored))
    assert not uncited, (f"{len(uncited)} files in experiments/results/ cited by no page and no test: {uncited}; "
                         "cite each where its numbers are quoted (docs/benchmarks.md, experiments/README.md, a "
                         "guide) or `git rm` it (git keeps it)")


def test_every_cited_result_file_exists():
    _, missing = _citations(_stored())
    assert not missing, f"cited but not in experiments/results/: {missing}"


def test_the_citation_reader_finds_what_a_page_writes(tmp_path):
    """The reader itself: a prefixed path, a bare name, a brace pair and a pattern."""
    text = ("`experiments/results/a.json` and `b.json`, `results/c_{x,y}.json`; "
            "`NAME_quick.json`, (`gpu/d.txt`)")
    assert TOKEN.findall(text) == ["experiments/results/a.json", "b.json", "results/c_{x,y}.json",
                                   "NAME_quick.json", "gpu/d.txt"]
    assert _expand("results/c_{x,y}.json") == ["results/c_x.json", "results/c_y.json"]
    assert _riders({"v.json"}, {"v.json", "v.png", "v_round2.json", "w.png"}) == {"v.png", "v_round2.json"}
