"""DGL peer of ``experiments/full_graph.py``: DGL's single-process full-graph GCN on the same graph and split.

Runs under the DGL environment (``.venv-dgl``, built by ``./dev dgl-env``: DGL needs its own torch, so this
script never imports gsplit). The loop follows DGL's ``examples/pytorch/gcn/train.py``: the whole graph in one
``DGLGraph``, ``model(g, features)`` over every vertex, ``F.cross_entropy(logits[train_mask],
labels[train_mask])``, Adam, evaluation with the model in eval mode on the whole graph. The model is
gsplit's ``GCN`` (``gsplit.nn.GCN``) written with ``dgl.nn.GraphConv``: ``norm="right"`` (mean over
in-edges; gsplit refuses ``norm="both"`` on split blocks), no self loops added, ReLU and dropout between
layers, no dropout on the input, no weight decay, so the two train the same model (their dropout masks
and initial weights come from different random streams, so accuracy agrees only statistically).

    .venv-dgl/bin/python experiments/dgl_full_graph_peer.py --data DIR --json out.json

``DIR`` holds ``indptr``, ``indices`` (CSC in-edges), ``features``, ``labels``, ``train_idx``, ``val_idx``
and ``test_idx`` as ``.npy`` files (written by ``full_graph.py``). Reported: median epoch time after the
first epoch, peak resident memory (sampled every 2 ms by a thread) and its rise during training,
validation and test accuracy after the last epoch.
"""

from __future__ import annotations

import json
import statistics
import time

from harness import peer  # noqa: I001 - first: it sets OpenMP's wait policy and DGL's backend before torch loads
import torch
import torch.nn as nn
import torch.nn.functional as F


class GCN(nn.Module):
    def __init__(self, in_feats, hidden, classes, layers, dropout):
        import dgl.nn as dglnn

        super().__init__()
        dims = [in_feats] + [hidden] * (layers - 1) + [classes]
        self.layers = nn.ModuleList([dglnn.GraphConv(dims[i], dims[i + 1], norm="right", allow_zero_in_degree=True)
                                     for i in range(layers)])
        self.dropout = nn.Dropout(dropout)

    def forward(self, g, h):
        for i, layer in enumerate(self.layers):
            h = layer(g, h)
            if i < len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


def main(argv=None) -> int:
    p = peer.make_parser(__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import dgl

    g = peer.csc_graph(args.data)
    load = lambda name: peer.load(args.data, name)  # noqa: E731
    feats, labels = load("features").float(), load("labels").long()
    train, val, test = load("train_idx").long(), load("val_idx").long(), load("test_idx").long()
    torch.manual_seed(args.seed)
    model = GCN(feats.shape[1], args.hidden, int(labels.max()) + 1, args.layers, args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    rss = peer.PeakRSS()
    start = rss.reset()
    epoch_s = []
    for _ in range(args.epochs):
        t = time.perf_counter()
        model.train()
        logits = model(g, feats)
        loss = F.cross_entropy(logits[train], labels[train])
        opt.zero_grad()
        loss.backward()
        opt.step()
        epoch_s.append(time.perf_counter() - t)
    peak = rss.stop()
    model.eval()
    with torch.no_grad():
        pred = model(g, feats).argmax(1)
    acc = lambda idx: float((pred[idx] == labels[idx]).float().mean()) if idx.numel() else float("nan")  # noqa: E731
    timed = epoch_s[1:] if len(epoch_s) > 1 else epoch_s
    out = {"epoch_s": statistics.median(timed), "first_epoch_s": epoch_s[0], "peak_rss_mib": peak / 2**20,
           "train_extra_mib": (peak - start) / 2**20, "val_acc": acc(val), "test_acc": acc(test),
           "final_loss": float(loss.detach()), "dgl": dgl.__version__, "torch": torch.__version__,
           "threads": torch.get_num_threads()}
    peer.write_json(args.json, out)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
