"""The invariant of the whole library: split-parallel training over any world size and any partition map
computes the same mini-batches, losses, gradients and parameters as single-process training.

Each world size is one launch; inside it every rank trains every (model, map) case, so process start-up
is paid once per world size.
"""

from __future__ import annotations


import pytest
import torch

import gsplit
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.sampling.batches import epoch_permutation
from gsplit.nn import build_model
from gsplit.nn.split import allreduce_gradients, global_sum, split_cross_entropy

NUM_NODES = 240
FEAT_DIM = 6
NUM_CLASSES = 3
BATCH = 12          # per rank
ITERS = 3
FANOUTS = [3, -1, 2]  # includes "all neighbours"
DROPOUT = 0.4         # vertex-keyed dropout draws the same masks on every rank


def make_problem():
    """A small graph with isolated vertices, features, labels and training targets (same on every rank)."""
    g = torch.Generator().manual_seed(7)
    n_connected = NUM_NODES - 20  # the last 20 vertices have no edges at all
    src = torch.randint(0, n_connected, (900,), generator=g)
    dst = torch.randint(0, n_connected, (900,), generator=g)
    graph = gsplit.Graph.from_edges(src, dst, NUM_NODES, symmetric=True, remove_self_loops=True)
    feats = torch.randn(NUM_NODES, FEAT_DIM, generator=g, dtype=torch.float64)
    labels = torch.randint(0, NUM_CLASSES, (NUM_NODES,), generator=g)
    train_idx = torch.randperm(NUM_NODES, generator=g)[:150]
    return graph, feats, labels, train_idx


def make_maps(graph, train_idx, world_size):
    """Partition maps to test: METIS on pre-sampling weights, random, and one that starves a rank."""
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    maps = {"random": torch.randint(0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(1))}
    if world_size > 1:
        weights = gsplit.presample(graph, train_idx, sampler, batch_size=BATCH * world_size, epochs=2)
        maps["gsplit"] = gsplit.partition(graph, world_size, method="gsplit", weights=weights).assignment.long()
        starved = maps["random"].clone()
        starved[train_idx] = starved[train_idx] % (world_size - 1)  # the last rank owns no target
        maps["starved"] = starved
    return maps


def train_steps(model_name, graph, feats, labels, train_idx, owner, comm_group_world):
    """Train ITERS steps with the split loader; returns global losses, gradients and final parameters."""
    torch.manual_seed(0)
    model = build_model(model_name, FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2,
                        dropout=DROPOUT).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    loader = DataLoader(graph, train_idx, sampler, partition=owner, use_ddp=comm_group_world > 1,
                        batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats, labels=labels)
    comm = loader.comm
    losses, grads, inputs, edges = [], [], [], []
    for step, (input_nodes, output_nodes, blocks) in enumerate(loader):
        if step == ITERS:
            break
        opt.zero_grad()
        logits = model(blocks, blocks[0].srcdata["feat"])
        loss = split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
        loss.backward()
        allreduce_gradients(model, comm)
        losses.append(global_sum(loss, comm))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        inputs.append(input_nodes.tolist())
        edges.append([sorted(b.edge_ids.tolist()) for b in blocks])
        opt.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params, "inputs": inputs, "edges": edges}


def rank_worker(rank, world_size):
    graph, feats, labels, train_idx = make_problem()
    results = {}
    for map_name, owner in make_maps(graph, train_idx, world_size).items():
        for model_name in ("sage", "gat", "gcn"):
            results[(map_name, model_name)] = train_steps(model_name, graph, feats, labels, train_idx, owner,
                                                          world_size)
    return results


def reference(model_name, world_size):
    """Single-process training on the whole global mini-batch, with no split machinery at all."""
    graph, feats, labels, train_idx = make_problem()
    torch.manual_seed(0)
    model = build_model(model_name, FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2,
                        dropout=DROPOUT).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    order = epoch_permutation(train_idx, 11, 0, True)
    gb = BATCH * world_size
    losses, grads, inputs, edges = [], [], [], []
    for it in range(ITERS):
        seeds = order[it * gb:(it + 1) * gb]
        blocks = sampler.sample_blocks(graph, seeds, epoch=0, iteration=it)
        opt.zero_grad()
        logits = model(blocks, feats[blocks[0].src_nodes])
        loss = torch.nn.functional.cross_entropy(logits, labels[seeds])
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        inputs.append(sorted(blocks[0].src_nodes.tolist()))
        edges.append([sorted(b.edge_ids.tolist()) for b in blocks])
        opt.step()
    return {"losses": losses, "grads": grads, "params": {n: p.detach() for n, p in model.named_parameters()},
            "inputs": inputs, "edges": edges}


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 1e-4) -> float:
    """Relative error; ``floor`` keeps gradients that are zero up to rounding (e.g. a 1-head attention
    vector of the output layer, whose softmax is shift-invariant) from dividing by ~1e-18."""
    return float((a - b).norm() / b.norm().clamp_min(floor))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_split_training_matches_single_process(world_size):
    if world_size == 1:
        per_rank = [rank_worker(0, 1)]  # no process group at all
    else:
        per_rank = launch(rank_worker, world_size)
    for (map_name, model_name), rank0 in per_rank[0].items():
        ref = reference(model_name, world_size)
        case = f"{model_name} on the {map_name} map at world size {world_size}"
        assert len(rank0["losses"]) == ITERS, case
        for it in range(ITERS):
            # the same mini-batch, without redundancy: input nodes disjoint, union = reference inputs;
            # every reference edge computed by exactly one rank
            all_inputs = [v for r in per_rank for v in r[(map_name, model_name)]["inputs"][it]]
            assert len(all_inputs) == len(set(all_inputs)), f"{case}: an input feature was loaded twice"
            assert sorted(all_inputs) == ref["inputs"][it], f"{case}: input nodes differ from the reference"
            for layer in range(len(FANOUTS)):
                all_edges = sorted(e for r in per_rank for e in r[(map_name, model_name)]["edges"][it][layer])
                assert all_edges == ref["edges"][it][layer], f"{case}: layer {layer} edges are not a partition"
            assert abs(rank0["losses"][it] - ref["losses"][it]) <= 1e-10 * abs(ref["losses"][it]), case
            for name, g_ref in ref["grads"][it].items():
                for r, res in enumerate(per_rank):
                    assert rel_err(res[(map_name, model_name)]["grads"][it][name], g_ref) < 1e-10, \
                        f"{case}: gradient of {name} on rank {r} differs at iteration {it}"
        for name, p_ref in ref["params"].items():
            assert rel_err(rank0["params"][name], p_ref) < 1e-10, f"{case}: parameter {name} drifted"


def test_float32_parity_two_ranks():
    """The float32 bound from the issue: relative error below 1e-4 against the reference."""
    per_rank = launch(float32_worker, 2, args=())
    graph, feats, labels, train_idx = make_problem()
    sampler = gsplit.NeighborSampler(FANOUTS, seed=3)
    seeds = epoch_permutation(train_idx, 11, 0, True)[:2 * BATCH]
    blocks = sampler.sample_blocks(graph, seeds, 0, 0)
    torch.manual_seed(0)
    model = build_model("sage", FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS))
    loss = torch.nn.functional.cross_entropy(model(blocks, feats[blocks[0].src_nodes].float()), labels[seeds])
    loss.backward()
    ref_loss = loss.item()
    assert abs(per_rank[0]["loss"] - ref_loss) < 1e-4 * abs(ref_loss)
    for n, p in model.named_parameters():
        assert rel_err(per_rank[1]["grads"][n], p.grad) < 1e-4, n


def float32_worker(rank, world_size):
    graph, feats, labels, train_idx = make_problem()
    torch.manual_seed(0)
    model = build_model("sage", FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS))
    owner = torch.arange(graph.num_nodes) % world_size
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner, use_ddp=True,
                        batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats.float(), labels=labels)
    _, _, blocks = next(iter(loader))
    loss = split_cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"], blocks[-1])
    loss.backward()
    allreduce_gradients(model, loader.comm)
    return {"loss": global_sum(loss, loader.comm), "grads": {n: p.grad for n, p in model.named_parameters()}}


def ddp_worker(rank, world_size):
    """The README's DistributedDataParallel recipe: its own process group, loss scaled by world size."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    graph, feats, labels, train_idx = make_problem()
    torch.manual_seed(0)
    model = build_model("sage", FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), dropout=DROPOUT).double()
    ddp = DistributedDataParallel(model, process_group=dist.new_group())
    owner = torch.arange(graph.num_nodes) % world_size
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner, use_ddp=True,
                        batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats, labels=labels)
    _, _, blocks = next(iter(loader))
    loss = split_cross_entropy(ddp(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"], blocks[-1])
    (loss * world_size).backward()  # DDP averages gradients; split losses must be summed
    return {n: p.grad for n, p in model.named_parameters()}


def test_ddp_recipe_matches_single_process():
    per_rank = launch(ddp_worker, 2)
    ref = reference("sage", 2)
    for name, g_ref in ref["grads"][0].items():
        for r in range(2):
            assert rel_err(per_rank[r][name], g_ref) < 1e-10, f"rank {r}: {name}"


def subgroup_worker(rank, world_size):
    """Split training on an explicit 2-rank process group inside a 3-rank world; rank 2 stays out."""
    import torch.distributed as dist

    group = dist.new_group(ranks=[0, 1])  # every rank must take part in creating it
    if rank == 2:
        return None
    graph, feats, labels, train_idx = make_problem()
    torch.manual_seed(0)
    model = build_model("sage", FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), dropout=DROPOUT).double()
    owner = torch.arange(graph.num_nodes) % 2
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner, use_ddp=True,
                        batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats, labels=labels, group=group)
    assert loader.world_size == 2
    _, _, blocks = next(iter(loader))
    loss = split_cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"], blocks[-1])
    loss.backward()
    allreduce_gradients(model, loader.comm)
    return {n: p.grad for n, p in model.named_parameters()}


def test_explicit_process_group():
    per_rank = launch(subgroup_worker, 3)
    assert per_rank[2] is None
    ref = reference("sage", 2)
    for name, g_ref in ref["grads"][0].items():
        for r in range(2):
            assert rel_err(per_rank[r][name], g_ref) < 1e-10, f"rank {r}: {name}"


def gpu_rank_worker(rank, world_size, graph_on_gpu):
    """Split training with this rank's batches on the GPU (two ranks may share one GPU over gloo)."""
    device = gsplit.current_device()
    graph, feats, labels, train_idx = make_problem()
    if graph_on_gpu:
        graph = graph.to(device)  # sampling and relabelling run on the GPU too
    torch.manual_seed(0)
    model = build_model("sage", FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), dropout=DROPOUT).double().to(device)
    owner = torch.arange(graph.num_nodes) % world_size
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner, device=device,
                        use_ddp=True, batch_size=BATCH, shuffle=True, ddp_seed=11, features=feats, labels=labels)
    _, _, blocks = next(iter(loader))
    assert blocks[0].srcdata["feat"].is_cuda
    loss = split_cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"], blocks[-1])
    loss.backward()
    allreduce_gradients(model, loader.comm)
    return {n: p.grad.cpu() for n, p in model.named_parameters()}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph_on_gpu", [False, True])
def test_two_ranks_sharing_one_gpu_match_single_process(graph_on_gpu):
    """Several processes on one GPU (NCCL needs a GPU per rank, so gloo with host staging)."""
    per_rank = launch(gpu_rank_worker, 2, args=(graph_on_gpu,), devices=["cuda:0", "cuda:0"], backend="gloo")
    ref = reference("sage", 2)
    for name, g_ref in ref["grads"][0].items():
        for r in range(2):
            assert rel_err(per_rank[r][name], g_ref) < 1e-10, f"rank {r}: {name}"
