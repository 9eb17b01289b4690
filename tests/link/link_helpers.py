"""Pieces of the link prediction parity tests: the problem, the cases, one rank's training and the reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

import gsplit
from gsplit.link import negative, pair_rows, reverse_edge_ids, split_bce_with_logits
from gsplit.nn import build_model
from gsplit.nn.split import allreduce_gradients, global_sum
from gsplit.sampling.batches import epoch_permutation

NUM_NODES = 120
FEAT_DIM = 5
HIDDEN = 6
BATCH = 7            # edges per rank per iteration
NUM_TRAIN = 61       # no world size divides it into whole global batches: the last one is short
FANOUTS = [3, 2]
DDP_SEED = 5


def make_problem():
    """A symmetric random graph (the last 10 vertices isolated), float64 features, training edges, reverses."""
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(0, NUM_NODES - 10, (300,), generator=gen)
    dst = torch.randint(0, NUM_NODES - 10, (300,), generator=gen)
    graph = gsplit.Graph.from_edges(src, dst, NUM_NODES, symmetric=True, remove_self_loops=True)
    feats = torch.randn(NUM_NODES, FEAT_DIM, generator=gen, dtype=torch.float64)
    train_eids = torch.randperm(graph.num_edges, generator=gen)[:NUM_TRAIN]
    return graph, feats, train_eids, reverse_edge_ids(graph)


def callable_negatives(g, eids):
    """A user's sampler with DGL's protocol, drawing from torch's default generator."""
    src = g.indices[eids].repeat_interleave(2)
    return src, torch.randint(0, g.num_nodes, (src.numel(),))


@dataclass(frozen=True)
class Case:
    model: str
    predictor: str          # "dot" or "mlp"
    exclude: Optional[str]
    negatives: str          # "uniform", "global" or "callable"
    macrobatch: int = 1
    parallel: bool = False  # SplitParallel instead of allreduce_gradients
    dgl_loss: bool = False  # (with parallel) DGL's loop: the wrapper's pair rows, the mean BCE over the rank's pairs

    def name(self) -> str:
        return f"{self.model}/{self.predictor}/{self.exclude}/{self.negatives}/mb{self.macrobatch}" + \
            ("/SplitParallel" if self.parallel else "") + ("/DGL's mean loss" if self.dgl_loss else "")


CASES = [
    Case("sage", "dot", "reverse_id", "uniform"),
    Case("gat", "mlp", "self", "global"),
    Case("gcn", "dot", None, "uniform"),
    Case("sage", "mlp", "reverse_id", "callable"),
    Case("gcn", "mlp", "self", "uniform", macrobatch=2),
    Case("sage", "dot", "reverse_id", "uniform", parallel=True),
    Case("gat", "mlp", "self", "global", parallel=True),   # the predictor's gradients summed beside the wrapper
    Case("sage", "dot", "reverse_id", "callable", parallel=True, dgl_loss=True),
    Case("gcn", "dot", "self", "uniform", macrobatch=2, parallel=True, dgl_loss=True),
]


def negative_sampler(kind: str):
    return {"uniform": lambda: negative.Uniform(2), "global": lambda: negative.GlobalUniform(2),
            "callable": lambda: callable_negatives}[kind]()


def edge_sampler(case: Case, reverse_eids):
    return gsplit.as_edge_prediction_sampler(
        gsplit.NeighborSampler(FANOUTS, seed=9), exclude=case.exclude,
        reverse_eids=reverse_eids if case.exclude == "reverse_id" else None,
        negative_sampler=negative_sampler(case.negatives))


def make_modules(case: Case):
    torch.manual_seed(0)
    model = build_model(case.model, FEAT_DIM, HIDDEN, HIDDEN, num_layers=len(FANOUTS), heads=2).double()
    predictor = torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                                    torch.nn.Linear(HIDDEN, 1)).double() if case.predictor == "mlp" else None
    return model, predictor


def score(predictor, h, u, v):
    return (h[u] * h[v]).sum(1) if predictor is None else predictor(h[u] * h[v]).squeeze(1)


def make_maps(graph, world_size: int):
    """Partition maps: METIS on pre-sampling weights, random, and one whose last rank owns no vertex."""
    maps = {"random": torch.randint(0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(1))}
    if world_size > 1:
        maps["metis"] = gsplit.partition(graph, world_size, method="edge").assignment.long()
        maps["starved"] = maps["random"] % (world_size - 1)
    return maps


def train_split(case: Case, graph, feats, train_eids, reverse_eids, owner, world_size: int) -> dict:
    """One epoch of split training on this rank; per iteration what it scored, its blocks, loss and gradients."""
    model, predictor = make_modules(case)
    params = torch.nn.ModuleList([m for m in (model, predictor) if m is not None])
    opt = torch.optim.SGD(params.parameters(), lr=0.3)
    loader = gsplit.DataLoader(graph, train_eids, edge_sampler(case, reverse_eids), partition=owner,
                               use_ddp=world_size > 1, batch_size=BATCH, shuffle=True, ddp_seed=DDP_SEED,
                               features=feats, macrobatch=case.macrobatch)
    net = gsplit.SplitParallel(model, loader) if case.parallel else model
    out = {"pos": [], "neg": [], "edges": [], "losses": [], "grads": [], "scorers_ok": True}
    for input_nodes, pos, neg, blocks in loader:
        opt.zero_grad()
        if case.dgl_loss:  # as DGL's multi-GPU example: no pair_rows, F's mean over this rank's pairs
            h = net(blocks, blocks[0].srcdata["feat"])
            scores = torch.cat([score(predictor, h, *pos.edges()), score(predictor, h, *neg.edges())])
            labels = torch.cat([torch.ones(pos.num_edges()), torch.zeros(neg.num_edges())]).to(scores)
            loss = F.binary_cross_entropy_with_logits(scores, labels)
        else:
            h = pair_rows(net(blocks, blocks[0].srcdata["feat"]), pos)
            loss = split_bce_with_logits(score(predictor, h, *pos.edges()), score(predictor, h, *neg.edges()),
                                         pos, neg)
        loss.backward()
        if not case.parallel:
            allreduce_gradients(params, loader.comm)
        elif predictor is not None:  # SplitParallel summed the model's; the guide's recipe for the predictor
            allreduce_gradients(predictor, loader.comm)
        out["losses"].append(net.global_loss(loss) if case.dgl_loss else global_sum(loss, loader.comm))
        out["grads"].append({n: p.grad.clone() for n, p in params.named_parameters()})
        for key, pairs in (("pos", pos), ("neg", neg)):
            u, v = pairs.global_edges()
            out[key].append(list(zip(pairs.pair_ids.tolist(), u.tolist(), v.tolist())))
            out["scorers_ok"] &= bool((owner[u] == loader.rank).all()) if world_size > 1 else True
        out["edges"].append([b.edge_ids.tolist() for b in blocks])
        opt.step()
    out["params"] = {n: p.detach().clone() for n, p in params.named_parameters()}
    return out


def train_reference(case: Case, graph, feats, train_eids, reverse_eids, world_size: int) -> dict:
    """One process on each whole global mini-batch: the edge sampler's single-process mini-batch, the model on
    all its targets, and the mean loss over every pair, with no split machinery."""
    model, predictor = make_modules(case)
    params = torch.nn.ModuleList([m for m in (model, predictor) if m is not None])
    opt = torch.optim.SGD(params.parameters(), lr=0.3)
    sampler = edge_sampler(case, reverse_eids)
    order = epoch_permutation(train_eids, DDP_SEED, 0, True)
    gb = BATCH * world_size
    out = {"pos": [], "neg": [], "edges": [], "losses": [], "grads": [], "eids": []}
    for it in range((order.numel() + gb - 1) // gb):
        eids = order[it * gb:(it + 1) * gb]
        batch = sampler.sample(graph, eids, epoch=0, iteration=it)
        seeds = batch.output_nodes
        opt.zero_grad()
        h = model(batch.blocks, feats[batch.blocks[0].src_nodes])
        pos_u, pos_v = batch.pair_graph.global_edges()
        neg_u, neg_v = batch.neg_pair_graph.global_edges()
        local = lambda x: torch.searchsorted(seeds, x)  # noqa: E731
        scores = torch.cat([score(predictor, h, local(pos_u), local(pos_v)),
                            score(predictor, h, local(neg_u), local(neg_v))])
        labels = torch.cat([torch.ones(pos_u.numel()), torch.zeros(neg_u.numel())]).double()
        loss = F.binary_cross_entropy_with_logits(scores, labels)
        loss.backward()
        out["losses"].append(float(loss.detach()))
        out["grads"].append({n: p.grad.clone() for n, p in params.named_parameters()})
        out["pos"].append(list(zip(range(pos_u.numel()), pos_u.tolist(), pos_v.tolist())))
        out["neg"].append(list(zip(range(neg_u.numel()), neg_u.tolist(), neg_v.tolist())))
        out["edges"].append([sorted(b.edge_ids.tolist()) for b in batch.blocks])
        out["eids"].append(eids)
        opt.step()
    out["params"] = {n: p.detach().clone() for n, p in params.named_parameters()}
    return out


def rank_worker(rank: int, world_size: int, cases=None) -> dict:
    graph, feats, train_eids, reverse_eids = make_problem()
    results = {}
    for map_name, owner in make_maps(graph, world_size).items():
        for case in (cases or CASES):
            results[(map_name, case)] = train_split(case, graph, feats, train_eids, reverse_eids, owner, world_size)
    return results
