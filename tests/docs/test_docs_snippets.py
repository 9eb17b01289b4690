"""Every ```python block of the documentation (docs/**/*.md) is run here as written, at small sizes, or says
where it is run instead, so the pages and the code cannot drift apart.

Each block is preceded by a marker comment (invisible on the site):

- ``<!-- test: script [NAME] -->``: the block is a whole script; it runs in a fresh process from a file holding
  exactly the block (``NAME`` picks the set-up and the checks of its output below);
- ``<!-- test: fragment NAME -->``: the block runs with ``exec`` in the namespace ``FRAGMENTS[NAME]`` builds (a
  graph ``g``, ``blocks``, ...), then ``FRAGMENTS[NAME]``'s check runs on what it left;
- ``<!-- test: elsewhere TEST -->``: ``TEST`` (``tests/FILE.py::function``, which must exist) runs it;
- ``<!-- test: skip REASON -->``: not run, with the reason (several hosts, GPUs).

``| shrink: OLD -> NEW`` after the kind replaces ``OLD`` by ``NEW`` before running (a smaller graph, fewer
epochs); ``OLD`` must occur in the block, so a shrink cannot silently stop applying.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest
import torch

import gsplit

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CORA = ROOT.parent / "shared" / "data" / "cora.npz"
if not CORA.exists():
    CORA = Path("/work/shared/data/cora.npz")

_BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
_MARKER = re.compile(r"<!-- test: (.*?) -->\s*\Z", flags=re.S)
KINDS = ("script", "fragment", "elsewhere", "skip")


@dataclass
class Snippet:
    """One ```python block of a page and what its marker says to do with it."""

    page: str                      # path below docs/
    line: int                      # line of the opening fence
    code: str                      # the block as written
    kind: str = ""                 # script / fragment / elsewhere / skip ("" when the marker is missing)
    arg: str = ""                  # script set-up or fragment name, the test elsewhere, the reason to skip
    shrinks: List[Tuple[str, str]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    def small(self) -> str:
        """The block with its shrinks applied (each must apply)."""
        code = self.code
        for old, new in self.shrinks:
            assert old in code, f"{self.id}: shrink {old!r} no longer occurs in the block"
            code = code.replace(old, new)
        return code


def parse_marker(text: str) -> Tuple[str, str, List[Tuple[str, str]]]:
    """``"fragment offline | shrink: epochs=10 -> epochs=1"`` -> ``("fragment", "offline", [("epochs=10", "epochs=1")])``."""
    head, *rest = [part.strip() for part in text.split(" | ")]
    kind, _, arg = head.partition(" ")
    shrinks = []
    for part in rest:
        assert part.startswith("shrink: ") and " -> " in part, f"marker part {part!r}: write 'shrink: OLD -> NEW'"
        old, new = part[len("shrink: "):].split(" -> ", 1)
        shrinks.append((old, new))
    return kind, arg.strip(), shrinks


def snippets(root: Path = DOCS) -> List[Snippet]:
    """Every ```python block under ``root`` with its marker (the comment right above its fence)."""
    out = []
    for path in sorted(root.rglob("*.md")):
        text = path.read_text()
        for m in _BLOCK.finditer(text):
            s = Snippet(str(path.relative_to(root)), text.count("\n", 0, m.start()) + 1, m.group(1))
            marker = _MARKER.search(text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1] + "\n")
            if marker:
                s.kind, s.arg, s.shrinks = parse_marker(marker.group(1))
            out.append(s)
    return out


def marked_block(page: str, arg: str) -> str:
    """The code of the one block of ``docs/page`` whose marker argument starts with ``arg`` (the name of a
    fragment or script, or for ``elsewhere`` the test that runs it: ``tests/FILE.py::function``)."""
    found = [s.code for s in snippets() if s.page == page and s.arg.split(" ")[0] == arg]
    assert len(found) == 1, f"docs/{page} has {len(found)} python blocks marked with {arg!r}"
    return found[0]


# ------------------------------------------------------------------------------------------------ fragments
def small_dataset():
    return gsplit.datasets.load("synthetic", num_nodes=400, avg_degree=6, feature_dim=8, seed=0)


def one_process_loader(ds, fanouts=(4, 4)):
    return gsplit.DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler(list(fanouts)), batch_size=32,
                             features=ds.features, labels=ds.labels)


def loop_namespace():
    ds = small_dataset()
    torch.manual_seed(0)
    return {"gsplit": gsplit, "loader": one_process_loader(ds),
            "layers": [gsplit.nn.SAGEConv(8, 16), gsplit.nn.SAGEConv(16, ds.num_classes)], "ds": ds}


def loop_check(ns):
    """After the loop, ``h`` is the last batch's output: the rows ``sp_forward`` computes on its ``blocks``."""
    blocks = ns["blocks"]
    assert torch.equal(ns["h"], gsplit.sp_forward(ns["layers"], blocks[0].srcdata["feat"], blocks))
    assert ns["h"].shape == (blocks[-1].num_dst_nodes(), ns["ds"].num_classes)


def own_layers_namespace():
    ns = loop_namespace()
    _, _, ns["blocks"] = next(iter(ns["loader"]))
    return ns


def own_layers_check(ns):
    expected = gsplit.sp_forward(ns["layers"], ns["blocks"][0].srcdata["feat"], ns["blocks"])
    assert torch.equal(ns["h"], expected)
    assert ns["h"].shape == (ns["blocks"][-1].num_dst_nodes(), ns["ds"].num_classes)


def dataset_namespace():
    return {"gsplit": gsplit, "ds": small_dataset(), "sampler": gsplit.NeighborSampler([3, 3])}


def dataset_check(ns):
    loaded = gsplit.PartitionMap.load("parts/syn4")
    assert loaded.num_parts == 4 and torch.equal(loaded.assignment, ns["pmap"].assignment)


def offline_namespace():
    ds = small_dataset()
    return {"gsplit": gsplit, "g": ds.graph, "train_idx": ds.train_idx, "sampler": gsplit.NeighborSampler([3, 3])}


def offline_check(ns):
    assert ns["w"].num_batches > 0   # the sampled variant ran last (one epoch here)


def host_syncs_namespace():
    """The host-sync counter around one training step (on the CPU it counts no device syncs, but runs)."""
    ds = small_dataset()
    loader = one_process_loader(ds)
    model = gsplit.SplitParallel(gsplit.nn.SAGE(8, 16, ds.num_classes, num_layers=2), loader)

    def step(batch):
        blocks = batch.blocks
        logits = model(blocks, blocks[0].srcdata["feat"])
        loss = torch.nn.functional.cross_entropy(logits, blocks[-1].dstdata["label"])
        loss.backward()
        return loss

    return {"step": step, "batches": iter(loader)}


def host_syncs_check(ns):
    assert ns["loss"].requires_grad and ns["counter"].total >= 0


def macrobatch_namespace():
    """One process, one part: the loader runs its macrobatch path (sample 16, load their union) alone."""
    ds = small_dataset()
    pmap = gsplit.partition(ds.graph, 1, method="random")
    return {"gsplit": gsplit, "graph": ds.graph, "train_idx": ds.train_idx, "pmap": pmap,
            "sampler": gsplit.NeighborSampler([3, 3]), "feats": ds.features, "labels": ds.labels}


def macrobatch_check(ns):
    """The loop left the last batch; the same loader with macrobatch=1 ends on the same one."""
    assert ns["loader"].macrobatch == 16
    single = gsplit.DataLoader(ns["graph"], ns["train_idx"], ns["sampler"], partition=ns["pmap"], use_ddp=True,
                               batch_size=16, features=ns["feats"], labels=ns["labels"])
    *_, (_, last_output, last_blocks) = iter(single)
    assert torch.equal(ns["output_nodes"], last_output)
    assert torch.equal(ns["blocks"][0].srcdata["feat"], last_blocks[0].srcdata["feat"])


FRAGMENTS: Dict[str, Tuple[Callable[[], dict], Callable[[dict], None]]] = {
    "loop": (loop_namespace, loop_check),
    "own-layers": (own_layers_namespace, own_layers_check),
    "dataset": (dataset_namespace, dataset_check),
    "offline": (offline_namespace, offline_check),
    "host-syncs": (host_syncs_namespace, host_syncs_check),
    "macrobatch": (macrobatch_namespace, macrobatch_check),
}


# -------------------------------------------------------------------------------------------------- scripts
def offline_planetoid(root: Path):
    """Planetoid("data", "Cora") without a download: Cora (the same graph, from the shared data folder)
    stored where Planetoid keeps its processed file, and empty raw files so that it does not download."""
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed (pip install -e '.[pyg]')")
    if not CORA.exists():
        pytest.skip(f"{CORA} is absent (the shared data folder)")
    from torch_geometric.datasets import Planetoid

    from gsplit.interop.pyg import to_pyg

    data = to_pyg(gsplit.datasets.load(f"npz:{CORA}"))
    folder = root / "data" / "Cora"
    (folder / "raw").mkdir(parents=True)
    for name in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"):
        (folder / "raw" / f"ind.cora.{name}").write_bytes(b"")
    (folder / "processed").mkdir()
    Planetoid.save([data], str(folder / "processed" / "data.pt"))


def pyg_check(out: str):
    acc = float(re.search(r"^test accuracy (\S+)$", out, flags=re.M).group(1))
    assert acc > 0.5, out   # 7 classes; a split-parallel SAGE reaches ~0.7-0.8 on Cora in 10 epochs


def full_graph_check(out: str):
    losses = [float(m) for m in re.findall(r"^epoch \d+  loss (\S+)$", out, flags=re.M)]
    assert len(losses) == 5, out
    assert losses[-1] < losses[0], out
    acc = float(re.search(r"^test accuracy (\S+)$", out, flags=re.M).group(1))
    assert acc > 0.5, out   # the synthetic graph's classes follow its features; chance is 1/num_classes


def estimate_check(out: str):
    split_s, dp_s, choice = out.split()[:3]
    assert float(split_s) > 0 and float(dp_s) > 0, out
    assert choice in ("split", "dp"), out


def no_check(out: str):
    pass


SCRIPTS: Dict[str, Tuple[Callable[[Path], None], Callable[[str], None]]] = {
    "": (lambda cwd: None, no_check),
    "pyg-cora": (offline_planetoid, pyg_check),
    "full-graph": (lambda cwd: None, full_graph_check),
    "estimate": (lambda cwd: None, estimate_check),
}


def run_script(code: str, cwd: Path, timeout: int = 600) -> str:
    script = cwd / "snippet.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("GSPLIT_START_METHOD", None)  # as a user runs it: spawned ranks (the suite's are forked: conftest.py)
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


# ---------------------------------------------------------------------------------------------------- tests
ALL = snippets()


def test_every_python_block_is_marked_and_its_marker_holds():
    assert ALL, "no python block found under docs/"
    for s in ALL:
        assert s.kind in KINDS, (f"docs/{s.page} line {s.line}: a python block needs a marker comment right above "
                                 f"its fence, <!-- test: {'|'.join(KINDS)} ... --> (see this file's docstring)")
        if s.kind == "fragment":
            assert s.arg in FRAGMENTS, f"{s.id}: no fragment namespace {s.arg!r} in tests/docs/test_docs_snippets.py"
        elif s.kind == "script":
            assert s.arg in SCRIPTS, f"{s.id}: no script set-up {s.arg!r} in tests/docs/test_docs_snippets.py"
        elif s.kind == "elsewhere":
            test = s.arg.split()[0]
            file, _, name = test.partition("::")
            assert name and (ROOT / file).exists(), f"{s.id}: {test!r} is not tests/FILE.py::function"
            assert re.search(rf"^def {re.escape(name)}\(", (ROOT / file).read_text(), flags=re.M), \
                f"{s.id}: {file} has no test {name}"
        else:
            assert s.arg, f"{s.id}: say why the block is skipped"
        s.small()   # every shrink applies
        for line in s.code.splitlines():
            if line.startswith("--8<--"):
                included = ROOT / line.split('"')[1]
                assert included.exists(), f"{s.id}: includes {included}, which does not exist"


@pytest.mark.parametrize("snippet", [s for s in ALL if s.kind == "fragment"], ids=lambda s: s.id)
def test_fragment_runs(snippet, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)   # a fragment may write files (pmap.save)
    make_namespace, check = FRAGMENTS[snippet.arg]
    namespace = make_namespace()
    exec(snippet.small(), namespace)
    check(namespace)
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.parametrize("snippet", [s for s in ALL if s.kind == "script"], ids=lambda s: s.id)
def test_script_runs(snippet, tmp_path):
    prepare, check = SCRIPTS[snippet.arg]
    prepare(tmp_path)
    check(run_script(snippet.small(), tmp_path))


def test_a_block_without_marker_is_found(tmp_path):
    """The marker check itself: an unmarked block is reported, a marked one parsed with its shrinks."""
    (tmp_path / "page.md").write_text("text\n\n```python\nx = 1\n```\n\n"
                                      "<!-- test: fragment loop | shrink: 1 -> 2 -->\n```python\ny = 1\n```\n")
    first, second = snippets(tmp_path)
    assert first.kind == "" and first.line == 3
    assert (second.kind, second.arg, second.shrinks) == ("fragment", "loop", [("1", "2")])
    assert second.small() == "y = 2\n"
