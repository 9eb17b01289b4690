"""DGL peer of ``gsplit train --system dp``: DGL's multi-GPU GraphSAGE example, on CPU ranks.

Runs under ``.venv-dgl`` (``./dev dgl-env``: DGL 2.1.0 needs torch 2.2.x, gsplit needs torch >= 2.4, so
this script never imports gsplit). ``experiments/vs_dgl.py`` calls it; it can also run alone:

    .venv-dgl/bin/python experiments/dgl_peer.py --data DIR --ranks 2 --model sage --json out.json

``--ranks 1`` trains in this process with a plain model and loader (no process group, no DDP, no
``use_ddp``) and every core: what a CPU user runs without any multi-process setup.

The training loop follows DGL's ``examples/multigpu/node_classification_sage.py``: one process per
rank (``torch.multiprocessing.spawn``), the DGL graph built once in the parent and handed to the
ranks, ``NeighborSampler(fanouts, prefetch_node_feats=["feat"], prefetch_labels=["label"])``,
``dgl.dataloading.DataLoader(g, train_idx, sampler, batch_size=B, shuffle=True, drop_last=False,
use_ddp=True)``, a model of ``dgl.nn`` layers in ``DistributedDataParallel``, Adam and
``F.cross_entropy``. What differs from the example, for CPU ranks and for a like-for-like comparison
with gsplit's trainer:

* backend ``gloo`` instead of ``nccl``; no ``torch.cuda.set_device``, no ``device_ids`` in DDP, no UVA:
  graph, features and model stay on the CPU;
* each rank runs ``torch.set_num_threads(max(1, cores // ranks))`` (unless ``OMP_NUM_THREADS`` is set)
  and the ranks start with ``OMP_WAIT_POLICY=PASSIVE``, as gsplit's launcher does for its CPU ranks; DGL's
  own OpenMP pool (``dgl.utils.set_num_threads``) gets the same count, else every rank would use every
  core for sampling (with one thread DGL 2.1 samples with ``sample_neighbors``, with more with its
  fused sampler);
* no validation pass inside the timed epoch (gsplit's ``epoch_s`` excludes evaluation too), no
  weight decay by default (gsplit's trainer uses plain Adam), and the same model sizes as gsplit's
  (``--hidden``, ``--dropout``; GAT: ``hidden / heads`` per head, heads concatenated in hidden layers,
  one head at the output, as ``gsplit.nn.GAT``); ``GATConv(allow_zero_in_degree=True)``, because
  sampled blocks have destinations without in-edges (isolated vertices), which gsplit's GAT maps to
  zeros plus the bias, as DGL does with that flag.

Reported per epoch: wall time of the epoch loop (max over ranks), and, per rank and summed over
ranks, iterations, edges per layer (``block.num_edges()``), destination vertices per layer, input
feature rows (``input_nodes.numel()``) and the time spent in ``next(loader)`` ("sample"; on CPU with
``num_workers=0`` that includes DGL's slicing of the prefetched features and labels, i.e. gsplit's
sample + load) and in forward-backward-step ("train").

Graph input: a folder of ``.npy`` files: ``indptr`` and ``indices`` (CSC: the in-edge sources of
vertex ``v`` are ``indices[indptr[v]:indptr[v+1]]``), ``features`` (float32), ``labels`` (int64),
``train_idx`` (int64), written by ``vs_dgl.py``.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

# Before torch (and its OpenMP) loads: the package sets OMP_WAIT_POLICY=PASSIVE, so the parent and the spawned
# ranks (which inherit the environment) sleep instead of spinning while waiting, as gsplit's CPU ranks do.
from harness import peer  # noqa: I001
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def load_graph(folder):
    """The DGL graph (in-edges from the CSC arrays) with ``feat`` and ``label``, plus ``train_idx``."""
    g = peer.csc_graph(folder)  # as the example: every sparse format built once in the parent, not in each rank
    g.ndata["feat"] = peer.load(folder, "features")
    g.ndata["label"] = peer.load(folder, "labels").long()
    return g, peer.load(folder, "train_idx").long()


class SAGE(nn.Module):
    """GraphSAGE-mean as in DGL's example: relu + dropout between layers."""

    def __init__(self, in_size: int, hidden: int, out_size: int, num_layers: int, dropout: float):
        import dgl.nn as dglnn

        super().__init__()
        dims = [in_size] + [hidden] * (num_layers - 1) + [out_size]
        self.layers = nn.ModuleList(dglnn.SAGEConv(dims[i], dims[i + 1], "mean") for i in range(num_layers))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h))
        return h


class GAT(nn.Module):
    """GAT with gsplit's sizes: ``hidden // heads`` per head, heads concatenated, one head at the output."""

    def __init__(self, in_size: int, hidden: int, out_size: int, num_layers: int, dropout: float, heads: int):
        import dgl.nn as dglnn

        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not divisible by heads={heads}; pick hidden as a multiple of heads")
        layers, dim = [], in_size
        for _ in range(num_layers - 1):
            layers.append(dglnn.GATConv(dim, hidden // heads, heads, allow_zero_in_degree=True))
            dim = hidden
        layers.append(dglnn.GATConv(dim, out_size, 1, allow_zero_in_degree=True))
        self.layers = nn.ModuleList(layers)
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)                         # [dst, heads, out]
            if i != len(self.layers) - 1:
                h = self.dropout(F.relu(h.flatten(1)))  # concatenate the heads
        return h.mean(1)                                # average the output heads


def run_rank(rank: int, world: int, port: int, g, train_idx, num_classes: int, args, header: dict) -> None:
    import dgl
    from dgl.dataloading import DataLoader, NeighborSampler

    if "OMP_NUM_THREADS" not in os.environ:  # as gsplit's launcher: an explicit setting wins
        torch.set_num_threads(max(1, peer.cpu_cores() // world))
    # DGL's C++ kernels and sampler run on their own OpenMP runtime (the system's libgomp, not torch's),
    # which would otherwise use every core in every rank; give them the same share.
    dgl.utils.set_num_threads(torch.get_num_threads())
    # One rank is what a CPU user runs without any multi-process setup: a plain model and loader in this
    # process, no process group, no DDP (vs_dgl.py's "dgl-1proc" with the global batch and every core).
    distributed = world > 1
    if distributed:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    torch.manual_seed(args.seed)
    # The example leaves sampling and the order unseeded; seeded here for repeatable counts. DGL 2.1's
    # use_ddp loader gives each rank a contiguous slice of train_idx and shuffles it with numpy.
    dgl.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    fanouts = [int(x) for x in args.fanouts.split(",")]
    sampler = NeighborSampler(fanouts, prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = DataLoader(g, train_idx, sampler, batch_size=args.batch_size, shuffle=True, drop_last=False,
                        num_workers=0, use_ddp=distributed, **({"ddp_seed": args.seed} if distributed else {}))
    in_size = g.ndata["feat"].shape[1]
    if args.model == "sage":
        model = SAGE(in_size, args.hidden, num_classes, len(fanouts), args.dropout)
    else:
        model = GAT(in_size, args.hidden, num_classes, len(fanouts), args.dropout, args.heads)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    epochs = []
    for epoch in range(args.epochs):
        model.train()
        rec = {"rank": rank, "iterations": 0, "sample_s": 0.0, "train_s": 0.0, "input_rows": 0,
               "edges": [0] * len(fanouts), "dst_vertices": [0] * len(fanouts),
               "torch_threads": torch.get_num_threads(), "dgl_threads": dgl.utils.get_num_threads()}
        loss_sum = 0.0
        t_epoch = time.perf_counter()
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                input_nodes, _, blocks = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]
            loss = F.cross_entropy(model(blocks, x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            count_iteration(rec, t0, t1, input_nodes, blocks)
            loss_sum += float(loss.detach())
            if args.max_iters and rec["iterations"] >= args.max_iters:
                break
        epochs.append(end_epoch(epoch, rec, t_epoch, loss_sum, world, distributed))
        if rank == 0:
            e = epochs[-1]
            print(f"dgl {args.model} {world} ranks epoch {epoch}: {e['epoch_s']:.2f}s (sample {e['sample_s']:.2f} "
                  f"/ fwd-bwd {e['train_s']:.2f}), {e['iterations']} it, loss {e['loss']:.4f}", flush=True)
    if rank == 0:
        peer.write_json(args.json, {**header, "epochs": epochs})
    if not distributed:
        return
    dist.barrier()
    dist.destroy_process_group()
    # Skip interpreter teardown, as gsplit's launcher does: with 4 ranks a rank now and then hung for
    # good in exit-time destructors (gloo / DGL threads) after its work was done and written.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def count_iteration(rec: dict, t0: float, t1: float, input_nodes, blocks) -> None:
    """Add one iteration to a rank's epoch record: sampling from ``t0`` to ``t1``, training from ``t1`` to now,
    the input rows and each layer's edges and destinations."""
    rec["train_s"] += time.perf_counter() - t1
    rec["sample_s"] += t1 - t0
    rec["iterations"] += 1
    rec["input_rows"] += int(input_nodes.numel())
    for layer, block in enumerate(blocks):
        rec["edges"][layer] += int(block.num_edges())
        rec["dst_vertices"][layer] += int(block.num_dst_nodes())


def end_epoch(epoch: int, rec: dict, t_epoch: float, loss_sum: float, world: int, distributed: bool) -> dict:
    """Close a rank's epoch record and gather every rank's into :func:`summarise`'s record (all ranks call it)."""
    rec["epoch_s"] = time.perf_counter() - t_epoch
    rec["loss"] = loss_sum / max(rec["iterations"], 1)
    per_rank = [None] * world
    if distributed:
        dist.all_gather_object(per_rank, rec)
    else:
        per_rank = [rec]
    return summarise(epoch, per_rank)


def summarise(epoch: int, per_rank) -> dict:
    """One epoch over all ranks: times at their max over ranks (the slowest sets the pace), counts summed."""
    layers = len(per_rank[0]["edges"])
    return {"epoch": epoch, "epoch_s": max(r["epoch_s"] for r in per_rank),
            "sample_s": max(r["sample_s"] for r in per_rank), "train_s": max(r["train_s"] for r in per_rank),
            "iterations": max(r["iterations"] for r in per_rank),
            "input_rows": sum(r["input_rows"] for r in per_rank),
            "edges": [sum(r["edges"][i] for r in per_rank) for i in range(layers)],
            "dst_vertices": [sum(r["dst_vertices"][i] for r in per_rank) for i in range(layers)],
            "loss": sum(r["loss"] for r in per_rank) / len(per_rank), "ranks": per_rank}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = peer.make_parser(__doc__.splitlines()[0], data_help="folder with indptr/indices/features/labels/train_idx .npy",
                         json_help="write the per-epoch records here")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--model", default="sage", choices=["sage", "gat"])
    p.add_argument("--fanouts", default="15,10,5", help="neighbours per layer from the input up")
    p.add_argument("--batch-size", type=int, default=1024, help="targets per rank per iteration")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=2, help="the first is warm-up; vs_dgl.py reports the last")
    p.add_argument("--max-iters", type=int, default=0, help="stop each epoch after this many iterations (0: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.ranks < 1:
        raise SystemExit(f"--ranks {args.ranks}: pass at least 1")

    import dgl

    folder = Path(args.data)
    t = time.perf_counter()
    g, train_idx = load_graph(folder)
    meta = peer.read_json(folder / "meta.json") if (folder / "meta.json").exists() else {}
    num_classes = int(meta.get("num_classes", int(g.ndata["label"].max()) + 1))
    print(f"dgl {dgl.__version__} / torch {torch.__version__}: {g.num_nodes():,} vertices, {g.num_edges():,} "
          f"edges, {train_idx.numel():,} train, loaded in {time.perf_counter() - t:.1f}s", flush=True)
    header = {"system": "dgl", "dgl": dgl.__version__, "torch": torch.__version__, "cores": peer.cpu_cores(),
              "threads_per_rank": torch.get_num_threads() if "OMP_NUM_THREADS" in os.environ
              else max(1, peer.cpu_cores() // args.ranks), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
              "config": vars(args), "num_nodes": g.num_nodes(), "num_edges": g.num_edges(),
              "train": int(train_idx.numel())}
    t = time.perf_counter()
    if args.ranks == 1:  # in this process, as a user without a multi-process setup runs it
        run_rank(0, 1, 0, g, train_idx, num_classes, args, header)
    else:
        mp.spawn(run_rank, args=(args.ranks, free_port(), g, train_idx, num_classes, args, header),
                 nprocs=args.ranks)
    print(f"wrote {args.json} ({args.ranks} ranks ran {time.perf_counter() - t:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
