"""Every ```python block of README.md is run here as written (or listed with the reason it is not), so the
README and the code cannot drift apart.

Blocks are found by the heading they sit under. A whole script (quick start, PyG) runs in a subprocess from
a file holding exactly the block; a fragment runs with ``exec`` in a namespace that holds the names its
section defines around it (a graph ``g``, ``blocks``, ...). The DGL block runs where DGL imports
(``tests/test_dgl_port.py::test_readme_dgl_snippet``, by ``./dev test-dgl``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gsplit

ROOT = Path(__file__).resolve().parents[1]
CORA = ROOT.parent / "shared" / "data" / "cora.npz"
if not CORA.exists():
    CORA = Path("/work/shared/data/cora.npz")

QUICK_START = "## Quick start (Python)"
OWN_LAYERS = "### Your own layers"
DDP_RECIPE = "### Loss and gradients: how N ranks take the same step as one process"
DGL_PORT = "## Porting DGL's multi-GPU node-classification example"
PYG = "## PyG users"
OFFLINE = "### Offline preparation: expected weights instead of sampling"
MANY_HOSTS = "## Many hosts"
GPUS = "## GPUs"
FULL_GRAPH = "## Full-graph training"

RUN_HERE = {QUICK_START, OWN_LAYERS, PYG, OFFLINE, GPUS, FULL_GRAPH}
RUN_ELSEWHERE = {
    DGL_PORT: "tests/test_dgl_port.py::test_readme_dgl_snippet (needs DGL: ./dev test-dgl)",
    DDP_RECIPE: "tests/test_split_parity.py::test_ddp_recipe_matches_single_process checks this recipe",
    MANY_HOSTS: "needs torchrun on several hosts with GPUs (NCCL)",
}


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


def run_script(code: str, cwd: Path, timeout: int = 600) -> str:
    script = cwd / "snippet.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


@pytest.mark.slow
def test_quick_start_block_runs(tmp_path):
    out = run_script(block(QUICK_START), tmp_path)
    lines = [line for line in out.splitlines() if line.startswith("epoch")]
    assert len(lines) == 5, out
    losses = [float(re.search(r"loss (\S+)", line).group(1)) for line in lines]
    assert losses[-1] < losses[0], out
    assert float(re.search(r"test accuracy (\S+)", lines[-1]).group(1)) > 0.5, out


@pytest.mark.slow
def test_full_graph_block_runs(tmp_path):
    out = run_script(block(FULL_GRAPH), tmp_path)
    losses = [float(m) for m in re.findall(r"^epoch \d+  loss (\S+)$", out, flags=re.M)]
    assert len(losses) == 5, out
    assert losses[-1] < losses[0], out


def test_own_layers_block_runs():
    """The fragment with ``layers`` and ``blocks`` from a split loader: the same rows as ``sp_forward``."""
    ds = gsplit.datasets.load("synthetic", num_nodes=400, avg_degree=6, feature_dim=8, seed=0)
    loader = gsplit.DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler([4, 4]), batch_size=32,
                               features=ds.features, labels=ds.labels)
    _, _, blocks = next(iter(loader))
    torch.manual_seed(0)
    layers = [gsplit.nn.SAGEConv(8, 16), gsplit.nn.SAGEConv(16, ds.num_classes)]
    namespace = {"gsplit": gsplit, "blocks": blocks, "layers": layers}
    exec(block(OWN_LAYERS), namespace)
    expected = gsplit.sp_forward(layers, blocks[0].srcdata["feat"], blocks)
    assert torch.equal(namespace["h"], expected)
    assert namespace["h"].shape == (blocks[-1].num_dst_nodes(), ds.num_classes)


def test_offline_block_runs():
    ds = gsplit.datasets.load("synthetic", num_nodes=400, avg_degree=6, feature_dim=8, seed=0)
    namespace = {"gsplit": gsplit, "g": ds.graph, "train_idx": ds.train_idx,
                 "sampler": gsplit.NeighborSampler([3, 3])}
    exec(block(OFFLINE).replace("epochs=10", "epochs=1"), namespace)  # the sampled variant, one epoch here
    assert namespace["w"].num_batches > 0


def test_gpus_block_runs(capsys):
    """The host-sync counter around one training step (on the CPU it counts no device syncs, but runs)."""
    ds = gsplit.datasets.load("synthetic", num_nodes=400, avg_degree=6, feature_dim=8, seed=0)
    loader = gsplit.DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler([4, 4]), batch_size=32,
                               features=ds.features, labels=ds.labels)
    model = gsplit.SplitParallel(gsplit.nn.SAGE(8, 16, ds.num_classes, num_layers=2), loader)

    def step(batch):
        blocks = batch.blocks
        loss = torch.nn.functional.cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"])
        loss.backward()
        return loss

    namespace = {"step": step, "batches": iter(loader)}
    exec(block(GPUS), namespace)
    assert namespace["loss"].requires_grad and namespace["counter"].total >= 0
    capsys.readouterr()


def offline_planetoid(root: Path):
    """Planetoid("data", "Cora") without a download: Cora (the same graph, from ../shared/data/cora.npz)
    stored where Planetoid keeps its processed file, and empty raw files so that it does not download."""
    from torch_geometric.datasets import Planetoid

    from gsplit.interop.pyg import to_pyg

    data = to_pyg(gsplit.datasets.load(f"npz:{CORA}"))
    folder = root / "data" / "Cora"
    (folder / "raw").mkdir(parents=True)
    for name in ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index"):
        (folder / "raw" / f"ind.cora.{name}").write_bytes(b"")
    (folder / "processed").mkdir()
    Planetoid.save([data], str(folder / "processed" / "data.pt"))
    return data


@pytest.mark.slow
def test_pyg_block_runs(tmp_path):
    """The README's PyG script, as written, on 2 CPU ranks. Fails on the old main (SplitParallel shuffled
    the rows sp_forward had shuffled already; DataLoader refused a Data; no batch.x / batch.y)."""
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed (pip install 'gsplit[pyg]')")
    if not CORA.exists():
        pytest.skip(f"{CORA} is absent (the shared data folder)")
    offline_planetoid(tmp_path)
    out = run_script(block(PYG), tmp_path)
    acc = float(re.search(r"^test accuracy (\S+)$", out, flags=re.M).group(1))
    assert acc > 0.5, out   # 7 classes; a split-parallel SAGE reaches ~0.7-0.8 on Cora in 10 epochs
