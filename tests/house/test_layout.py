"""The house: gsplit's root holds only its front door, packages import without cycles, every module path the docs
name imports, and the paths that moved keep importing (a user's script or saved file that names one still works).
"""

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
_environ = dict(os.environ)
from layout_metrics import cycles, import_graph  # noqa: E402 - through the harness, which sets OMP_WAIT_POLICY:
os.environ.clear()  # this test process keeps the environment it had
os.environ.update(_environ)

from test_docs import resolve  # noqa: E402 - tests/docs/, on the path (conftest)

from gsplit import _moved  # noqa: E402

FRONT_DOOR = {"__init__.py", "__main__.py", "_moved.py"}


def test_the_root_holds_only_the_front_door():
    loose = sorted(p.name for p in (ROOT / "gsplit").glob("*.py") if p.name not in FRONT_DOOR)
    assert not loose, f"modules loose in gsplit/: {loose}; put each in the package of its concept (docs/layout.md)"


def test_no_import_cycles():
    found = cycles(import_graph("gsplit", ROOT))
    assert not found, f"import cycles (a module imports, through others, one that imports it): {found}"


def test_the_metrics_see_a_cycle(tmp_path):
    """The cycle check itself: a two-module cycle through a lazy import and a package's __init__ is found."""
    pkg = tmp_path / "gsplit" / "a"
    pkg.mkdir(parents=True)
    (tmp_path / "gsplit" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from gsplit.a import x\n")
    (pkg / "x.py").write_text("def f():\n    from gsplit.b import y\n")
    (tmp_path / "gsplit" / "b.py").write_text("from typing import TYPE_CHECKING\nimport gsplit.a.x\n"
                                              "if TYPE_CHECKING:\n    import gsplit.c\n")
    (tmp_path / "gsplit" / "c.py").write_text("import gsplit.b\n")
    graph = import_graph("gsplit", tmp_path)
    assert "gsplit.c" not in graph["gsplit.b"]  # annotations only
    assert cycles(graph) == [["gsplit.a", "gsplit.a.x", "gsplit.b"]]


def _old_path_pattern():
    olds = sorted((o for o in _moved.MOVED if o != "gsplit.launch"), key=len, reverse=True)
    return re.compile(r"(?<![\w.])(" + "|".join(re.escape(o) for o in olds) + r")\b(?!\.\w*\s*=)"
                      r"|(?<![\w.])(?:from gsplit\.launch import|import gsplit\.launch\b|gsplit\.launch\.\w)")


def test_no_code_of_the_project_uses_an_old_path():
    """The old paths are for users' scripts: gsplit, its tests and its experiments import the new ones."""
    pattern = _old_path_pattern()
    files = [p for d in ("gsplit", "tests", "experiments", "examples") for p in (ROOT / d).rglob("*.py")]
    skip = {ROOT / "gsplit" / "_moved.py", Path(__file__).resolve()}
    bad = []
    for p in files:
        if p in skip:
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if re.match(r"\s*(from|import) ", line) and pattern.search(line):
                bad.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
            # `from gsplit.sampling import counter_rng`: a moved module imported as its old parent's attribute
            attr = re.match(r"\s*from (gsplit[\w.]*) import \(?([\w, ]+)", line)
            if attr and any(f"{attr.group(1)}.{name.strip()}" in _moved.MOVED for name in attr.group(2).split(",")):
                bad.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "old module paths in the project's own code:\n" + "\n".join(bad[:20])


def _documented_paths():
    """Every ``::: gsplit.x`` of the API pages, and every backticked dotted ``gsplit.x.y`` of the docs and README."""
    texts = [p.read_text() for p in (ROOT / "docs").rglob("*.md")] + [(ROOT / "README.md").read_text()]
    names = set()
    for text in texts:
        names.update(re.findall(r"^::: (gsplit[\w.]*)", text, flags=re.M))
        names.update(re.findall(r"`(gsplit(?:\.\w+)+)`", text))
    return sorted(names)


def test_every_documented_path_imports():
    paths = _documented_paths()
    assert len(paths) > 150, f"found only {len(paths)} documented paths: has the docs' syntax changed?"
    broken = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the docs name the new paths, not the moved ones
        for dotted in paths:
            try:
                resolve(dotted)
            except Exception as e:  # noqa: BLE001 - listed below, whatever it is
                broken.append(f"{dotted}: {type(e).__name__}: {e}")
    assert not broken, "documented paths that do not import:\n" + "\n".join(broken)


def test_a_moved_module_imports_from_its_old_path_as_the_same_module():
    """In a fresh interpreter: each old path warns once, names the new one, and gives the very module object (so
    isinstance checks and monkeypatching in a user's code keep working); gsplit.launch stays the function."""
    code = ("import json, sys, warnings, importlib, gsplit\n"
            "from gsplit._moved import MOVED\n"
            "out = {}\n"
            "for old, new in MOVED.items():\n"
            "    with warnings.catch_warnings(record=True) as w:\n"
            "        warnings.simplefilter('always')\n"
            "        mod = importlib.import_module(old)\n"
            "    said = [str(x.message) for x in w if issubclass(x.category, DeprecationWarning)]\n"
            "    out[old] = [mod is importlib.import_module(new), sum(new in m for m in said)]\n"
            "out['launch is callable'] = callable(gsplit.launch)\n"
            "print(json.dumps(out))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got.pop("launch is callable") is True
    # gsplit.launch is entered under its old name when gsplit is imported: nothing to warn about there
    expected = {old: [True, 0 if old == "gsplit.launch" else 1] for old in _moved.MOVED}
    assert got == expected


def test_old_launch_paths_keep_the_launch_function():
    code = ("import gsplit\nfrom gsplit.launch import RankFailure\nfrom gsplit.launch.start import launch\n"
            "import gsplit.launch\nassert callable(gsplit.launch) and gsplit.launch is launch\n"
            "from gsplit.launcher.failures import RankFailure as R\nassert RankFailure is R\n")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
