"""examples/dgl_port.py is DGL's examples/multigpu/node_classification_sage.py with at most 8 changed code lines.

The diff and the count need no DGL (they run in every environment); running the port needs DGL and runs
where it imports (``./dev test-dgl``). The diff in docs/guides/dgl.md is generated from the two files: run
``python tests/interop/test_dgl_port.py`` to rewrite it after changing the port.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dgl_ports import DGLPort

ROOT = Path(__file__).resolve().parents[2]
NODE_PORT = DGLPort(original=ROOT / "tests" / "data" / "dgl_node_classification_sage.py.txt",
                    port=ROOT / "examples" / "dgl_port.py", guide=ROOT / "docs" / "guides" / "dgl.md",
                    dgl_name="dgl/examples/multigpu/node_classification_sage.py (v2.1.0)")
PORT, GUIDE = NODE_PORT.port, NODE_PORT.guide
MAX_CHANGED = 8


def test_port_changes_at_most_8_code_lines():
    changed, removed, added = NODE_PORT.changed()
    assert 0 < changed <= MAX_CHANGED, f"{changed} changed code lines (-{removed} +{added}); the DGL guide promises <= 8"
    port = PORT.read_text()
    # what the port keeps: DGL's model class with dgl.nn layers, the DGLGraph and its loaders, DGL's inference
    for kept in ("import dgl.nn as dglnn", "class SAGE(nn.Module):", 'self.layers.append(dglnn.SAGEConv(in_size, hid_size, "mean"))',
                 "g = dataset[0]", "sampler = NeighborSampler(", "def layerwise_infer(", "    def inference(self, g, device"):
        assert kept in port, kept


def test_readme_diff_is_generated_from_the_port():
    NODE_PORT.check_guide("tests/interop/test_dgl_port.py")


SHIMS = {
    # stand-ins for what DGL's script imports beyond DGL: no download of ogbn-products here, and no torchmetrics
    "ogb/__init__.py": "",
    "ogb/nodeproppred.py": '''
        import dgl, gsplit

        class DglNodePropPredDataset:           # a synthetic graph in OGB's shape: (graph, labels), idx split
            def __init__(self, name, root="dataset"):
                self.name = name
                ds = gsplit.datasets.load("synthetic", num_nodes=3000, avg_degree=8, feature_dim=16, seed=1)
                self.g = dgl.graph((ds.graph.indices, ds.graph.edge_dst()), num_nodes=ds.num_nodes)
                self.g.ndata["feat"] = ds.features
                self.labels = ds.labels.reshape(-1, 1)
                self.num_classes = ds.num_classes
                self.split = {"train": ds.train_idx, "valid": ds.val_idx, "test": ds.test_idx}

            def __getitem__(self, i):
                return self.g, self.labels

            def __len__(self):
                return 1

            def get_idx_split(self):
                return self.split
    ''',
    "torchmetrics/__init__.py": "",
    "torchmetrics/functional.py": '''
        def accuracy(preds, target, task="multiclass", num_classes=None):
            return (preds.argmax(1) == target).float().mean()
    ''',
}


@pytest.mark.slow
def test_port_runs_on_two_cpu_ranks(tmp_path):
    """The port as a user runs it (``--gpu cpu,cpu``): 2 epochs of training, then layer-wise inference."""
    pytest.importorskip("dgl", reason="DGL is not installed here; ./dev test-dgl runs this test")
    for name, text in SHIMS.items():
        path = tmp_path / "shims" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    env = dict(os.environ, DGLBACKEND="pytorch", DGL_DOWNLOAD_DIR=str(tmp_path / "dgl"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path / "shims"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(PORT), "--gpu", "cpu,cpu", "--mode", "puregpu", "--num_epochs", "2"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    epochs = re.findall(r"^Epoch 0000(\d) \| Loss ([\d.]+) \| Accuracy ([\d.]+)", proc.stdout, flags=re.M)
    assert [e[0] for e in epochs] == ["0", "1"], proc.stdout
    test = re.search(r"^Test accuracy ([\d.]+)$", proc.stdout, flags=re.M)
    assert test and 0.0 < float(test.group(1)) <= 1.0, proc.stdout
    assert "Testing..." in proc.stdout


def test_readme_dgl_snippet():
    """The DGL guide's "make the map once" block, as written, with the names the port defines around it."""
    dgl = pytest.importorskip("dgl", reason="DGL is not installed here; ./dev test-dgl runs this test")
    import torch

    import gsplit
    from test_docs_snippets import marked_block

    ds = gsplit.datasets.load("synthetic", num_nodes=300, avg_degree=6, feature_dim=8, seed=0)
    g = dgl.graph((ds.graph.indices, ds.graph.edge_dst()), num_nodes=ds.num_nodes)
    g.ndata["feat"], g.ndata["label"] = ds.features, ds.labels
    g.ndata["train_mask"] = torch.zeros(ds.num_nodes, dtype=torch.bool).index_fill_(0, ds.train_idx, True)
    namespace = {"dgl": dgl, "gsplit": gsplit, "g": g, "nprocs": 1, "train_idx": ds.train_idx, "device": "cpu",
                 "DataLoader": gsplit.DataLoader}
    exec(marked_block("guides/dgl.md", "tests/interop/test_dgl_port.py::test_readme_dgl_snippet"), namespace)
    _, output_nodes, blocks = next(iter(namespace["train_dataloader"]))
    assert all(b.is_block for b in blocks) and "feat" in blocks[0].srcdata and "label" in blocks[-1].dstdata
    assert namespace["pmap"].num_parts == 1


if __name__ == "__main__":  # rewrite the DGL guide's diff block (and its count) from the two files
    NODE_PORT.rewrite_guide()
