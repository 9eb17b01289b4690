"""The README and the documentation site say what the code does.

- The README is the front door: at most 250 lines, the two fresh-machine commands first (the test command is
  what CI runs), no measurement diary, and every relative link and anchor in it resolves.
- Every ``gsplit <command> --option`` written in the README, the pages and the measurement notes exists in
  that command's ``--help``.
- Every public name (the ``__all__`` of the modules listed in mkdocs.yml) has an entry in the API pages, and
  a docstring: the check that ``mkdocs build --strict`` runs (docs/griffe_gsplit.py) is tested here on a
  package made to fail it and on gsplit itself.

The site's own build (broken links and anchors between pages, pages missing from the navigation) is
``./dev docs``, which CI runs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import re
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

import gsplit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250


def markdown_files() -> List[Path]:
    """What a reader sees: the README, the pages, and the measurement notes the site includes."""
    return [README, *sorted(DOCS.rglob("*.md")), ROOT / "experiments" / "README.md"]


# ------------------------------------------------------------------------------------------------- README
def test_readme_is_the_front_door():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).splitlines()
    assert [line.split("#")[0].strip() for line in first_block] == ["./dev demo", "./dev test"]
    # the hook's rule (shared/hooks/before-stop): the README's first test line is what .ci/run calls
    test_line = next(line.strip() for line in lines
                     if re.match(r"^\s*(make test|pytest|python -m pytest|\./[a-z_/-]+ test)", line))
    assert test_line in (ROOT / ".ci" / "run").read_text(), f"README's test command {test_line!r} is not in .ci/run"
    for diary in ("load average", "this machine", "measured here"):
        assert diary not in text, f"README.md reads like a measurement diary ({diary!r}): that belongs in experiments/"
    assert "../shared" not in text, "README.md points into this project's development layout (../shared)"


def test_readme_install_lines_pin_torch_and_need_no_package_index():
    text = README.read_text()
    installs = re.findall(r"^\s*pip install (.*?)(?:\s+#.*)?$", text, flags=re.M)
    assert installs
    for args in installs:
        assert not re.search(r"""(^|\s)["']?gsplit\[""", args), f"gsplit is on no package index: {args!r}"
        if re.search(r"(^|\s)torch\b", args):
            assert "torch==" in args, f"torch must be pinned where the README installs it: {args!r}"


def slugify(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (MkDocs) gives a heading; GitHub's agrees on these headings."""
    text = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", heading)           # links keep their text
    text = re.sub(r"[`*_]", "", text)                                 # inline code and emphasis markers
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> Set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slugify(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_readme_links_resolve():
    text = README.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"^[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else README
        assert target.exists(), f"README links to {link}, which does not exist"
        if anchor:
            assert anchor in anchors(target), f"README links to {link}: {path or 'README.md'} has no heading #{anchor}"


def test_slugify_matches_the_site():
    assert slugify("Partition maps (paper Figure 5 and the Node/Edge/Rand rows of Table 3)") == \
        "partition-maps-paper-figure-5-and-the-nodeedgerand-rows-of-table-3"
    assert slugify("What `SplitParallel` does") == "what-splitparallel-does"
    assert slugify("Preparing and training at 1M-8M vertices") == "preparing-and-training-at-1m-8m-vertices"


# ------------------------------------------------------------------------------------- commands vs --help
def gsplit_help(*argv: str) -> str:
    """What ``gsplit ARGV --help`` prints (the console script's ``main``, in this process)."""
    from gsplit.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0, out.getvalue()
    return out.getvalue()


def declared_options(help_text: str) -> Set[str]:
    """The option strings an argparse help text declares (its option lines, not the prose of their help)."""
    options = set()
    for line in help_text.splitlines():
        m = re.match(r"^ {2}(-\S.*?)(?: {2,}|$)", line)
        if m:
            options.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", m.group(1)))
    return options


@lru_cache(maxsize=1)
def parser_options() -> Dict[str, Set[str]]:
    top = gsplit_help()
    commands = re.search(r"\{([a-z,]+)\}", top).group(1).split(",")
    return {cmd: declared_options(gsplit_help(cmd)) for cmd in commands}


_COMMAND = r"(?:^|(?<=[\s(`]))gsplit\s+({cmds})\b([^#\n`]*)"


def written_commands(text: str, commands) -> List[Tuple[str, List[str]]]:
    """``[(command, [options])]`` of every ``gsplit <command> ...`` in code blocks and inline code of ``text``."""
    pattern = re.compile(_COMMAND.format(cmds="|".join(commands)))
    spans = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M):
        spans.append(block.replace("\\\n", " "))                         # continuation lines
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    spans += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    found = []
    commands_written = [command for span in spans for line in span.splitlines()
                        for command in re.split(r"\s\|\s|&&|;", line)]   # shell pipes and lists
    for command in commands_written:
        for m in pattern.finditer(command):
            found.append((m.group(1), re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", m.group(2))))
    return found


def test_written_commands_are_found():
    cmds = ["train", "prepare"]
    text = ("```bash\ngsplit train --dataset synthetic \\\n   --fanouts=-1,-1 --epochs 2  # --not-this\n```\n"
            "and `gsplit prepare ... --presample expected|sampled [--presample-epochs 10]`, `gsplit train`'s.\n")
    assert written_commands(text, cmds) == [("train", ["--dataset", "--fanouts", "--epochs"]),
                                            ("prepare", ["--presample", "--presample-epochs"]), ("train", [])]


def test_every_written_gsplit_option_exists():
    options = parser_options()
    assert {"prepare", "train", "stats", "eval"} <= set(options)
    assert "--fanouts" in options["train"] and "--log-file" in options["train"] and "-D" in options["prepare"]
    wrong = []
    for path in markdown_files():
        for cmd, opts in written_commands(path.read_text(), options):
            wrong += [f"{path.relative_to(ROOT)}: gsplit {cmd} {opt}" for opt in opts if opt not in options[cmd]]
    assert not wrong, "options that `gsplit <command> --help` does not list:\n" + "\n".join(wrong)


# ------------------------------------------------------------------------------------------ API reference
def public_modules() -> List[str]:
    """The modules whose ``__all__`` is public, as mkdocs.yml lists them for the docstring check."""
    text = (ROOT / "mkdocs.yml").read_text()
    block = re.search(r"^\s*public:\n((?:\s+- \S+\n)+)", text, flags=re.M).group(1)
    return re.findall(r"- (\S+)", block)


def resolve(path: str):
    """The object ``path`` names, importing its longest module prefix (``gsplit.launcher.launch``: the function
    ``launch`` of the package ``gsplit.launcher``)."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(path)


def api_entries() -> List[str]:
    return [entry for page in sorted((DOCS / "api").glob("*.md"))
            for entry in re.findall(r"^::: (\S+)", page.read_text(), flags=re.M)]


def test_every_public_name_has_an_api_entry():
    documented = [resolve(entry) for entry in api_entries()]
    missing = []
    for module_path in public_modules():
        module = importlib.import_module(module_path)
        for name in module.__all__:
            obj = getattr(module, name)
            if name.startswith("__") or inspect.ismodule(obj):
                continue
            if not any(obj is d for d in documented):
                missing.append(f"{module_path}.{name}")
    assert not missing, f"public names without an entry in docs/api/*.md (add `::: NAME`): {missing}"


def test_top_level_page_lists_every_name():
    page = (DOCS / "api" / "gsplit.md").read_text()
    listed = set(re.findall(r"^\| \[`gsplit\.(\w+)`\]", page, flags=re.M))
    assert {n for n in gsplit.__all__ if not n.startswith("__")} <= listed


# ------------------------------------------------------------------------------- the docstring check itself
def docs_extension():
    pytest.importorskip("griffe", reason="griffe comes with the docs extra: pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location("griffe_gsplit", DOCS / "griffe_gsplit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_public_name_without_docstring_fails_the_check(tmp_path, caplog):
    ext = docs_extension()
    import griffe

    pkg = tmp_path / "pkgx"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A package."""\nfrom pkgx import sub\nfrom pkgx.sub import Helper\n'
                                     '__all__ = ["sub", "Helper", "documented", "undocumented", "__version__"]\n'
                                     '__version__ = "1"\n\n'
                                     'def documented():\n    """Has one."""\n\n\ndef undocumented():\n    pass\n')
    (pkg / "sub.py").write_text('"""A submodule."""\n__all__ = ["Helper"]\n\n\nclass Helper:\n    pass\n')
    loaded = griffe.load("pkgx", search_paths=[str(tmp_path)],
                         extensions=griffe.load_extensions(ext.GsplitDocs(public=["pkgx"], package="pkgx")))
    problems = ext.missing_docstrings(loaded.modules_collection, ["pkgx", "pkgx.sub"])
    assert [p.split(" ")[0] for p in problems] == ["pkgx.Helper", "pkgx.undocumented", "pkgx.sub.Helper"]
    assert "pkgx/__init__.py:11" in problems[1]
    assert "pkgx.undocumented is public" in caplog.text   # the build's warning, which --strict turns into a failure


def test_gsplit_public_names_have_docstrings():
    ext = docs_extension()
    import griffe

    loaded = griffe.load("gsplit", search_paths=[str(ROOT)], try_relative_path=False)
    assert ext.missing_docstrings(loaded.modules_collection, public_modules()) == []


def test_roles_become_links():
    ext = docs_extension()
    import griffe

    spawn = griffe.load("gsplit", search_paths=[str(ROOT)], try_relative_path=False)["spawn"]
    text = ext.rewrite_roles(spawn, "after :func:`launch`'s set-up, see :class:`~gsplit.Graph`\n    Example:\n"
                                    "        layout::\n")
    assert '<autoref identifier="gsplit.launcher.launch" optional><code>launch</code></autoref>' in text
    assert '<autoref identifier="gsplit.Graph" optional><code>Graph</code></autoref>' in text
    assert "    Examples:\n" in text and "layout:\n" in text and ":func:" not in text


def layout_modules(text: str) -> Set[str]:
    """The paths docs/layout.md names: ``room/`` lines and the ``module.py`` lines indented under them."""
    block = text.split("```\n", 2)[1]
    names, room = set(), ""
    for line in block.splitlines():
        name = line.split()[0] if line.strip() else ""
        depth = (len(line) - len(line.lstrip())) // 2
        if depth == 1:   # a room of gsplit/ (a package or a module)
            room = name if name.endswith("/") else ""
            names.add("gsplit/" + name.rstrip("/"))
        elif depth == 2 and room and name.endswith(".py"):
            names.add("gsplit/" + room + name)
    return names


def test_layout_page_names_every_module_and_only_real_ones():
    """docs/layout.md is the map of gsplit/: every package and top-level module is on it, and every path it
    names exists (a module moved or added without the map fails here)."""
    ROOT = Path(__file__).resolve().parents[2]
    named = layout_modules((ROOT / "docs" / "layout.md").read_text())
    real = {str(p.relative_to(ROOT)).removesuffix("/__init__.py") for p in (ROOT / "gsplit").glob("*/__init__.py")}
    real |= {str(p.relative_to(ROOT)) for p in (ROOT / "gsplit").glob("*.py") if not p.name.startswith("__")}
    assert real - named == set(), f"docs/layout.md does not mention {sorted(real - named)}"
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"docs/layout.md names {missing}, which do not exist under gsplit/"
