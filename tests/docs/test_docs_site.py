"""The built documentation site works for a reader (issue 49, item 8): its search index holds the API names, a
grouped parameter (``shuffle, drop_last: ...``) is shown with its default (not *required*), an example under a
titled ``Example (...):`` renders as code, long code lines are not cut off, and the new pages are in the nav.

The site build (``mkdocs build --strict``, what ``./dev docs`` runs) takes 10-20 s: that test is marked slow.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_docs import DOCS, ROOT, docs_extension


def test_grouped_parameters_become_one_item_each():
    ext = docs_extension()
    text = ("Summary.\n\n    Args:\n        graph: the graph.\n        shuffle, drop_last: as in DGL.\n"
            "            Second line.\n\n        features, labels (Tensor): rows.\n\n    Returns:\n"
            "        a, b: not parameters.\n")
    out = ext.split_grouped_parameters(text)
    assert "shuffle, drop_last" not in out and "features, labels" not in out
    assert "        shuffle: as in DGL.\n            Second line.\n        drop_last: as in DGL.\n" \
           "            Second line.\n" in out
    assert "        features (Tensor): rows.\n        labels (Tensor): rows.\n" in out
    assert "        a, b: not parameters." in out  # Returns: is not a parameter list


def test_a_titled_example_becomes_griffe_examples_section():
    ext = docs_extension()
    import griffe

    loaded = griffe.load("gsplit", search_paths=[str(ROOT)], try_relative_path=False)
    text = ext.rewrite_roles(loaded["SplitParallel"], loaded["SplitParallel"].docstring.value)
    assert "One process, no process group: the wrapper changes nothing:\n\nExamples:\n    >>> import" in text


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="mkdocs comes with the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("mkdocstrings", reason="mkdocstrings comes with the docs extra")
    out = tmp_path_factory.mktemp("site")
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.mark.slow
def test_the_search_index_finds_the_api_and_the_guides(site):
    index = json.loads((site / "search" / "search_index.json").read_text())
    locations = {doc["location"] for doc in index["docs"]}
    for name in ("api/gsplit/#gsplit.SplitParallel", "api/loaders/#gsplit.DataLoader",
                 "api/launcher/#gsplit.launcher.launch", "api/partitioning/#gsplit.partition",
                 "api/datasets/#gsplit.datasets.load_edgelist", "guides/your-data/"):
        assert name in locations, f"{name} is not in the search index ({len(locations)} entries)"
    texts = " ".join(doc["text"] for doc in index["docs"] if doc["location"].startswith("guides/your-data/"))
    assert "features" in texts and "labels" in texts


@pytest.mark.slow
def test_api_pages_show_defaults_examples_as_code_and_do_not_cut_code(site):
    loaders = (site / "api" / "loaders" / "index.html").read_text()
    defaults = {}
    for row in loaders.split('<tr class="doc-section-item">')[1:]:  # a parameter table's row: name ... default
        cells = re.findall(r"<td>(.*?)</td>", row.split("</tr>")[0], re.S)
        if cells:
            defaults.setdefault(re.sub(r"<[^>]+>", "", cells[0]).strip(), re.sub(r"<[^>]+>", "", cells[-1]).strip())
    assert defaults.get("shuffle") == "False" and defaults.get("drop_last") == "False", defaults
    assert "shuffle, drop_last" not in loaders
    top = (site / "api" / "gsplit" / "index.html").read_text()
    start = top.index('id="gsplit.SplitParallel"')
    example = top[start:top.index("inside each rank", start)]
    assert re.search(r"<pre>.*SplitParallel.*</pre>", example, re.S), "SplitParallel's example is not a code block"
    assert "assets/extra.css" in top and (site / "assets" / "extra.css").is_file()
    css = (DOCS / "assets" / "extra.css").read_text()
    assert "overflow-x: auto" in css and "pre-wrap" in css
