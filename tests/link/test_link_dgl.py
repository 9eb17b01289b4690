"""Link prediction with a DGLGraph: DGL's edge ids and reverse_eids in, DGL blocks and DGL pair graphs out
(``pair_graph.ndata["h"] = h`` and ``fn.u_dot_v`` work on the pair rows), a DGL-protocol negative sampler
gets the DGLGraph, and two ranks train exactly as one process on the same global mini-batches.

Runs where DGL imports (``./dev test-dgl tests/link/test_link_dgl.py``); skips elsewhere.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("DGLBACKEND", "pytorch")
try:
    import dgl
    import dgl.function as fn
    import dgl.nn as dglnn
except Exception as e:  # not installed, or beside a torch it cannot load
    pytest.skip(f"DGL does not import here ({type(e).__name__}: {e}); ./dev test-dgl runs these tests",
                allow_module_level=True)

import torch.nn.functional as F

import gsplit
from gsplit.link import pair_rows, split_bce_with_logits
from parity_helpers import rel_err

NUM_NODES = 90
BATCH = 6
FANOUTS = [3, 2]


def make_graph():
    """A symmetric DGLGraph whose edge ids are NOT gsplit's (shuffled), with reverse_eids, features."""
    gen = torch.Generator().manual_seed(2)
    src = torch.randint(0, NUM_NODES, (200,), generator=gen)
    dst = torch.randint(0, NUM_NODES, (200,), generator=gen)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    n = src.numel()
    perm = torch.randperm(2 * n, generator=gen)
    all_src, all_dst = torch.cat([src, dst])[perm], torch.cat([dst, src])[perm]
    g = dgl.graph((all_src, all_dst), num_nodes=NUM_NODES)
    where = torch.empty(2 * n, dtype=torch.int64)
    where[perm] = torch.arange(2 * n)                    # where edge i of the unshuffled list went
    reverse = torch.empty(2 * n, dtype=torch.int64)
    reverse[where] = where[(torch.arange(2 * n) + n) % (2 * n)]
    g.ndata["feat"] = torch.randn(NUM_NODES, 4, generator=gen, dtype=torch.float64)
    train_eids = torch.randperm(2 * n, generator=gen)[:40]
    return g, reverse, train_eids


class DegreeNegatives:
    """DGL's multi-GPU example's sampler: sources kept, destinations by degree^0.75 (torch's default RNG)."""

    def __init__(self, g, k):
        self.weights = g.in_degrees().double() ** 0.75
        self.k = k

    def __call__(self, g, eids):
        src, _ = g.find_edges(eids)
        src = src.repeat_interleave(self.k)
        return src, torch.multinomial(self.weights, len(src), replacement=True)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([dglnn.SAGEConv(4, 6, "mean"), dglnn.SAGEConv(6, 6, "mean")])

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i == 0:
                h = F.relu(h)
        return h


def edge_sampler(g, reverse):
    return gsplit.as_edge_prediction_sampler(dgl.dataloading.NeighborSampler(FANOUTS), exclude="reverse_id",
                                             reverse_eids=reverse, negative_sampler=DegreeNegatives(g, 2))


def test_dgl_graph_in_dgl_pair_graphs_out():
    g, reverse, train_eids = make_graph()
    loader = gsplit.DataLoader(g, train_eids, edge_sampler(g, reverse), batch_size=BATCH, shuffle=False)
    for it, (input_nodes, pos, neg, blocks) in enumerate(loader):
        eids = train_eids[it * BATCH:(it + 1) * BATCH]
        assert all(b.is_block for b in blocks) and not pos.is_block
        assert torch.equal(pos.edata[dgl.EID], eids)             # DGL's ids, in the batch's order
        u, v = pos.edges()
        src, dst = g.find_edges(eids)
        assert torch.equal(pos.ndata[dgl.NID][u], src) and torch.equal(pos.ndata[dgl.NID][v], dst)
        nu, _ = neg.edges()
        assert torch.equal(neg.ndata[dgl.NID][nu], src.repeat_interleave(2))
        excluded = torch.cat([eids, reverse[eids]])
        for b in blocks:
            assert not torch.isin(b.edata[dgl.EID], excluded).any()
            s, d = g.find_edges(b.edata[dgl.EID])   # block edges are the DGLGraph's edges under DGL's ids
            assert torch.equal(b.srcdata[dgl.NID][b.edges()[0]], s) and torch.equal(b.dstdata[dgl.NID][b.edges()[1]], d)


def dgl_example_loss(block_outputs, pos_graph, neg_graph):
    """DGL's multi-GPU example's CrossEntropyLoss: the mean over this rank's pairs, no gsplit call."""
    scores = []
    for pairs in (pos_graph, neg_graph):
        with pairs.local_scope():
            pairs.ndata["h"] = block_outputs
            pairs.apply_edges(fn.u_dot_v("h", "h", "score"))
            scores.append(pairs.edata["score"])
    score = torch.cat(scores)
    label = torch.cat([torch.ones_like(scores[0]), torch.zeros_like(scores[1])])
    return F.binary_cross_entropy_with_logits(score, label)


def train(rank, world_size, batch, dgl_loss=False):
    g, reverse, train_eids = make_graph()
    owner = torch.arange(NUM_NODES) % world_size
    loader = gsplit.DataLoader(g, train_eids, edge_sampler(g, reverse), partition=owner, use_ddp=world_size > 1,
                               batch_size=batch, shuffle=True, ddp_seed=3)
    torch.manual_seed(0)
    model = gsplit.SplitParallel(Model().double(), loader)
    losses, grads = [], []
    for input_nodes, pos, neg, blocks in loader:
        model.zero_grad()
        if dgl_loss:  # the wrapper's output straight into DGL's pair graphs
            loss = dgl_example_loss(model(blocks, blocks[0].srcdata["feat"]), pos, neg)
            loss.backward()
            losses.append(model.global_loss(loss))
            grads.append({n: p.grad.clone() for n, p in model.module.named_parameters()})
            continue
        h = pair_rows(model(blocks, blocks[0].srcdata["feat"]), pos)
        scores = []
        for pairs in (pos, neg):                 # DGL's way of scoring pairs
            pairs.ndata["h"] = h
            pairs.apply_edges(fn.u_dot_v("h", "h", "score"))
            scores.append(pairs.edata["score"].squeeze(1))
        loss = split_bce_with_logits(scores[0], scores[1], pos, neg)
        loss.backward()
        losses.append(float(gsplit.global_sum(loss, loader.comm)))
        grads.append({n: p.grad.clone() for n, p in model.module.named_parameters()})
    return losses, grads


@pytest.mark.parametrize("dgl_loss", [False, True], ids=["split-loss", "dgl-example-loss"])
def test_two_ranks_train_as_one_process(dgl_loss):
    """gsplit's split loss, and DGL's example loop as it is (``pos_graph.ndata["h"] = model(blocks, x)``, the mean
    BCE over the rank's pairs: SplitParallel's pair rows and its scale make two ranks' gradients one process's)."""
    one = train(0, 1, 2 * BATCH, dgl_loss)
    two = gsplit.launch(train, 2, args=(BATCH, dgl_loss))
    assert len(one[0]) == len(two[0][0]) == 4
    for it, loss in enumerate(one[0]):
        assert abs(two[0][0][it] - loss) <= 1e-10 * abs(loss)
        for name, g_ref in one[1][it].items():
            for r in range(2):
                assert rel_err(two[r][1][it][name], g_ref) < 1e-10, (it, name, r)
