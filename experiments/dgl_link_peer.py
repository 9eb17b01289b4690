"""DGL peer of ``gsplit train --task link``: DGL 2.1's own link prediction loop, on CPU ranks.

Runs under ``.venv-dgl`` (DGL 2.1 needs torch 2.2; this script never imports gsplit).
``experiments/link_vs_dgl.py`` calls it; it can also run alone:

    .venv-dgl/bin/python experiments/dgl_link_peer.py --data DIR --ranks 2 --json out.json [--embeddings h.npy]

The loop is DGL's (``examples/pytorch/graphsage/link_pred.py`` and the multi-GPU link prediction example):
``dgl.dataloading.as_edge_prediction_sampler(NeighborSampler(fanouts), exclude="reverse_id",
reverse_eids=..., negative_sampler=dgl.dataloading.negative_sampler.Uniform(k))``,
``dgl.dataloading.DataLoader(g, train_eids, sampler, batch_size=B, shuffle=True, use_ddp=True)`` (B edges per
rank), a ``dgl.nn.SAGEConv`` model in ``DistributedDataParallel``, the dot product of the endpoints'
embeddings (``fn.u_dot_v``) and the mean binary cross-entropy over the positive and negative pairs, Adam.
CPU ranks over gloo, threads per rank as ``dgl_peer.py`` sets them (``cores // ranks`` for torch and DGL).

After training (``--embeddings``), rank 0 computes every vertex's embedding by layer-wise inference over
all in-edges (DGL's ``MultiLayerFullNeighborSampler(1)`` one layer at a time, as DGL's examples' ``inference``)
and saves them; the gsplit side scores the held-out pairs with the same negatives as gsplit's runs.

Reported per epoch (max over ranks for times, sums for counts): epoch time, time in ``next(loader)``
("sample") and in forward-backward-step ("train"), iterations, edges per layer (``block.num_edges()``) and
input rows (``input_nodes.numel()``).

Graph input (``--data``): ``indptr``, ``indices`` (CSC of the message-passing graph; DGL edge ``e`` is CSC
position ``e``), ``features``, ``train_eids``, ``reverse_eids`` as ``.npy``, written by ``link_vs_dgl.py``.
"""

from __future__ import annotations

import os
import sys
import time

from harness import peer  # noqa: I001  (first: OMP_WAIT_POLICY before torch loads)
import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from dgl_peer import SAGE, count_iteration, end_epoch, free_port


def dot_scores(pairs, h):
    """DGL's way: the pair graph's endpoints' ``h``, ``u_dot_v``."""
    import dgl.function as fn

    with pairs.local_scope():
        pairs.ndata["h"] = h
        pairs.apply_edges(fn.u_dot_v("h", "h", "score"))
        return pairs.edata["score"].reshape(-1)


@torch.no_grad()
def layerwise_embeddings(model: SAGE, g, feats: torch.Tensor, batch_size: int = 4096) -> torch.Tensor:
    """Every vertex's output, one layer at a time over all in-edges (DGL's examples' ``inference``)."""
    import dgl

    model.eval()
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(1)
    loader = dgl.dataloading.DataLoader(g, torch.arange(g.num_nodes()), sampler, batch_size=batch_size,
                                        shuffle=False, drop_last=False, num_workers=0)
    h = feats
    for i, layer in enumerate(model.layers):
        out = torch.empty(g.num_nodes(), layer._out_feats)
        for input_nodes, output_nodes, blocks in loader:
            y = layer(blocks[0], h[input_nodes])
            if i != len(model.layers) - 1:
                y = F.relu(y)
            out[output_nodes] = y
        h = out
    return h


def run_rank(rank: int, world: int, port: int, g, train_eids, reverse_eids, args, header: dict) -> None:
    import dgl
    from dgl.dataloading import DataLoader, NeighborSampler, as_edge_prediction_sampler, negative_sampler

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, peer.cpu_cores() // world))
    dgl.utils.set_num_threads(torch.get_num_threads())
    distributed = world > 1
    if distributed:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    torch.manual_seed(args.seed)
    dgl.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    fanouts = [int(x) for x in args.fanouts.split(",")]
    exclude = None if args.exclude == "none" else args.exclude
    sampler = as_edge_prediction_sampler(NeighborSampler(fanouts, prefetch_node_feats=["feat"]), exclude=exclude,
                                         reverse_eids=reverse_eids if exclude == "reverse_id" else None,
                                         negative_sampler=negative_sampler.Uniform(args.neg_ratio))
    loader = DataLoader(g, train_eids, sampler, batch_size=args.batch_size, shuffle=True, drop_last=False,
                        num_workers=0, use_ddp=distributed, **({"ddp_seed": args.seed} if distributed else {}))
    model = SAGE(g.ndata["feat"].shape[1], args.hidden, args.hidden, len(fanouts), args.dropout)
    net = nn.parallel.DistributedDataParallel(model) if distributed else model
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    epochs = []
    for epoch in range(args.epochs):
        net.train()
        if distributed and hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)  # a new order every epoch (DGL 2.1's use_ddp loader also reshuffles without it)
        rec = {"rank": rank, "iterations": 0, "sample_s": 0.0, "train_s": 0.0, "input_rows": 0,
               "edges": [0] * len(fanouts), "dst_vertices": [0] * len(fanouts)}
        loss_sum = 0.0
        t_epoch = time.perf_counter()
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                input_nodes, pair_graph, neg_pair_graph, blocks = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            h = net(blocks, blocks[0].srcdata["feat"])
            pos, neg = dot_scores(pair_graph, h), dot_scores(neg_pair_graph, h)
            loss = F.binary_cross_entropy_with_logits(torch.cat([pos, neg]),
                                                      torch.cat([torch.ones_like(pos), torch.zeros_like(neg)]))
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
            print(f"dgl link {world} ranks epoch {epoch}: {e['epoch_s']:.2f}s (sample {e['sample_s']:.2f} / "
                  f"fwd-bwd {e['train_s']:.2f}), {e['iterations']} it, loss {e['loss']:.4f}", flush=True)
    if rank == 0:
        if args.embeddings:
            t = time.perf_counter()
            np.save(args.embeddings, layerwise_embeddings(model, g, g.ndata["feat"]).numpy())
            header = {**header, "inference_s": time.perf_counter() - t}
        peer.write_json(args.json, {**header, "epochs": epochs})
    if not distributed:
        return
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as dgl_peer.py: skip exit-time destructors (gloo / DGL threads) that now and then hang


def main(argv=None) -> int:
    p = peer.make_parser(__doc__.splitlines()[0], data_help="folder with indptr/indices/features/train_eids/"
                         "reverse_eids .npy", json_help="write the per-epoch records here")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--fanouts", default="15,10", help="neighbours per layer from the input up")
    p.add_argument("--batch-size", type=int, default=256, help="training edges per rank per iteration")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--max-iters", type=int, default=0, help="stop each epoch after this many iterations (0: all)")
    p.add_argument("--neg-ratio", type=int, default=1)
    p.add_argument("--exclude", default="reverse_id", choices=["reverse_id", "self", "none"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--embeddings", default="", help="save every vertex's final embedding here (.npy)")
    args = p.parse_args(argv)
    if args.ranks < 1:
        raise SystemExit(f"--ranks {args.ranks}: pass at least 1")

    import dgl

    t = time.perf_counter()
    g = peer.csc_graph(args.data)  # DGL edge e = CSC position e = gsplit's edge id e
    g.ndata["feat"] = peer.load(args.data, "features").float()
    train_eids = peer.load(args.data, "train_eids").long()
    reverse_eids = peer.load(args.data, "reverse_eids").long()
    print(f"dgl {dgl.__version__} / torch {torch.__version__}: {g.num_nodes():,} vertices, {g.num_edges():,} "
          f"edges, {train_eids.numel():,} training edges, loaded in {time.perf_counter() - t:.1f}s", flush=True)
    header = {"system": "dgl", "dgl": dgl.__version__, "torch": torch.__version__, "cores": peer.cpu_cores(),
              "config": vars(args), "num_nodes": g.num_nodes(), "num_edges": g.num_edges(),
              "train_edges": int(train_eids.numel())}
    if args.ranks == 1:
        run_rank(0, 1, 0, g, train_eids, reverse_eids, args, header)
    else:
        mp.spawn(run_rank, args=(args.ranks, free_port(), g, train_eids, reverse_eids, args, header),
                 nprocs=args.ranks)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
