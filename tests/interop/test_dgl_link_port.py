"""examples/dgl_link_port.py is DGL's examples/pytorch/multigpu/multi_gpu_link_prediction.py with at most 8 changed
code lines, and it trains on 2 CPU ranks.

The diff and the count need no DGL (they run in every environment); running the port needs DGL and runs
where it imports (``./dev test-dgl``). The diff in docs/guides/link-prediction.md is generated from the two
files: run ``python tests/interop/test_dgl_link_port.py`` to rewrite it after changing the port.
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
LINK_PORT = DGLPort(original=ROOT / "tests" / "data" / "dgl_multi_gpu_link_prediction.py.txt",
                    port=ROOT / "examples" / "dgl_link_port.py", guide=ROOT / "docs" / "guides" / "link-prediction.md",
                    dgl_name="dgl/examples/pytorch/multigpu/multi_gpu_link_prediction.py (v2.1.0)")
PORT, GUIDE = LINK_PORT.port, LINK_PORT.guide
MAX_CHANGED = 8


def test_port_changes_at_most_8_code_lines():
    changed, removed, added = LINK_PORT.changed()
    assert 0 < changed <= MAX_CHANGED, f"{changed} changed code lines (-{removed} +{added}); the guide promises <= 8"
    port = PORT.read_text()
    # what the port keeps: DGL's model, its own negative sampler and loss on DGL pair graphs, its evaluation
    for kept in ("class SAGE(nn.Module):", "class NegativeSampler(object):", "self.weights = g.in_degrees()",
                 'pos_graph.ndata["h"] = block_outputs', 'pos_graph.apply_edges(fn.u_dot_v("h", "h", "score"))',
                 "loss = F.binary_cross_entropy_with_logits(score, label.float())", 'exclude="reverse_id",',
                 "lr = lm.LogisticRegression(", "use_ddp=True,"):
        assert kept in port, kept


def test_guide_diff_is_generated_from_the_port():
    LINK_PORT.check_guide("tests/interop/test_dgl_link_port.py")


SHIMS = {
    # stand-ins for what DGL's script imports beyond DGL: no download of ogbn-products here, no scikit-learn
    "ogb/__init__.py": "",
    "ogb/nodeproppred.py": '''
        import dgl, torch, gsplit

        class DglNodePropPredDataset:
            """A synthetic graph in OGB's shape: (graph, labels), idx split. Its edges are laid out as DGL's
            script assumes (the reverse of edge e is e +- |E|/2): every undirected edge u < v, then v -> u."""
            def __init__(self, name, root="dataset"):
                self.name = name
                ds = gsplit.datasets.load("synthetic", num_nodes=3000, avg_degree=8, feature_dim=16, seed=1)
                src, dst = ds.graph.indices, ds.graph.edge_dst()
                u, v = src[src < dst], dst[src < dst]
                self.g = dgl.graph((torch.cat([u, v]), torch.cat([v, u])), num_nodes=ds.num_nodes)
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
    "sklearn/__init__.py": "",
    "sklearn/linear_model.py": '''
        import torch
        import torch.nn.functional as F

        class LogisticRegression:
            """Multinomial logistic regression with sklearn's default L2 penalty (C=1), fitted by L-BFGS."""
            def __init__(self, multi_class="multinomial", max_iter=100, C=1.0):
                self.max_iter, self.C = min(max_iter, 500), C

            def _x(self, x):
                x = torch.as_tensor(x, dtype=torch.float64)
                return torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)

            def fit(self, x, y):
                x, y = self._x(x), torch.as_tensor(y).long()
                self.classes_, y = torch.unique(y, return_inverse=True)
                self.w = torch.zeros(x.shape[1], len(self.classes_), dtype=x.dtype, requires_grad=True)
                opt = torch.optim.LBFGS([self.w], max_iter=self.max_iter, line_search_fn="strong_wolfe")

                def closure():
                    opt.zero_grad()
                    loss = F.cross_entropy(x @ self.w, y, reduction="sum") + (self.w[:-1] ** 2).sum() / (2 * self.C)
                    loss.backward()
                    return loss

                opt.step(closure)
                return self

            def predict(self, x):
                with torch.no_grad():
                    return self.classes_[(self._x(x) @ self.w).argmax(1)].numpy()
    ''',
    "sklearn/metrics.py": '''
        import numpy as np

        def f1_score(y_true, y_pred, average="micro"):
            assert average == "micro"          # micro F1 of single-label classes is the accuracy
            return float(np.mean(np.asarray(y_true).reshape(-1) == np.asarray(y_pred).reshape(-1)))
    ''',
}


@pytest.mark.slow
def test_port_runs_on_two_cpu_ranks(tmp_path):
    """The port as a user runs it (``--gpu cpu,cpu``): DGL's 10 epochs, with its layer-wise evaluation (the F1
    of a logistic regression on every vertex's embedding) after epochs 5 and 10."""
    pytest.importorskip("dgl", reason="DGL is not installed here; ./dev test-dgl runs this test")
    for name, text in SHIMS.items():
        path = tmp_path / "shims" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    env = dict(os.environ, DGLBACKEND="pytorch", DGL_DOWNLOAD_DIR=str(tmp_path / "dgl"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path / "shims"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(PORT), "--gpu", "cpu,cpu", "--mode", "puregpu"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    steps = re.findall(r"^Epoch (\d{5}) \| Step 00000 \| Loss ([\d.]+) \| GPU", proc.stdout, flags=re.M)
    assert [int(e) for e, _ in steps] == list(range(10)), proc.stdout
    losses = [float(loss) for _, loss in steps]
    assert losses[-1] < losses[0], f"the loss did not fall over 10 epochs: {losses}"
    assert len(re.findall(r"^Epoch Time\(s\): [\d.]+$", proc.stdout, flags=re.M)) == 10, proc.stdout
    evals = re.findall(r"^Epoch (\d{5}) \| Eval F1-score ([\d.]+) \| Test F1-Score ([\d.]+)$", proc.stdout, flags=re.M)
    assert [int(e[0]) for e in evals] == [4, 9], proc.stdout
    for _, val, test in evals:
        assert 0.0 < float(val) <= 1.0 and 0.0 < float(test) <= 1.0, proc.stdout


if __name__ == "__main__":  # rewrite the guide's diff block (and its count) from the two files
    LINK_PORT.rewrite_guide()
