"""Full-graph training, split-parallel: epoch time, communication and peak memory per rank, and a DGL peer.

For every graph (synthetic graphs of ``--sizes`` vertices, Cora and CiteSeer from ``../shared/data``) and
every rank count of ``--ranks``, trains ``--model`` full-batch with :class:`gsplit.FullGraphLoader` on a
full-graph METIS map (:func:`gsplit.partition_full_graph`; one rank: no map) for ``--epochs`` epochs and
reports, from the code path itself:

* epoch time: median wall time of the epochs after the first (the slowest rank's);
* communication: bytes the rank sent per epoch in the shuffles (forward and backward) and in the gradient
  all-reduce (``Communicator.traffic``); the one-time build (id exchange, feature shuffle) apart;
* peak memory per rank: the process's resident set size, sampled every 2 ms by a thread (CPU ranks have
  no allocator statistics; on a GPU ``torch.cuda.max_memory_allocated`` is reported as well), before
  building the blocks, when training starts and at its peak; ``train_extra_mib`` is peak minus start:
  the activations, gradients and temporaries of training;
* accuracy on the validation and test vertices after the last epoch (one full-graph forward in eval
  mode), which must equal the single-process run's: split training is exact.

``--recompute both`` also runs every case with :func:`gsplit.recompute_layers` (memory for compute);
``--overlap both`` with ``FullGraphLoader(overlap=True)`` and ``loader.forward(model)`` (G3's boundary-first
order, the shuffles overlapped with the interior rows' compute).
``--dgl`` runs the same model with DGL's full-graph training on one process
(``experiments/dgl_full_graph_peer.py`` under ``.venv-dgl``, ``./dev dgl-env``, or ``--dgl-python``), on the
same graph and split, and reports the same columns.

    python experiments/full_graph.py --quick
    python experiments/full_graph.py --sizes 100000 --ranks 1,2 --epochs 10 --recompute both --dgl
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import memory, report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

import gsplit
from gsplit.comm.gradients import GRADIENT_TAG, allreduce_gradients
from gsplit.nn import build_model

PEER = Path(__file__).with_name("dgl_full_graph_peer.py")


def rank_run(rank: int, world: int, ds, owner, cfg: dict) -> dict:
    """Train on one rank; everything measured here."""
    mib = lambda b: b / 2**20  # noqa: E731
    rss = memory.PeakRSS()
    before_build = rss.now()
    torch.manual_seed(cfg["seed"])
    model = build_model(cfg["model"], ds.feature_dim, cfg["hidden"], ds.num_classes, num_layers=cfg["layers"],
                        dropout=cfg["dropout"], heads=cfg["heads"])
    if cfg["recompute"]:
        gsplit.recompute_layers(model)
    t0 = time.perf_counter()
    loader = gsplit.FullGraphLoader(ds.graph, cfg["layers"], partition=owner, features=ds.features,
                                    labels=ds.labels, train_idx=ds.train_idx, overlap=cfg.get("overlap", False))
    build_s = time.perf_counter() - t0
    estimate = loader.check_model(model)
    build_bytes = sum(loader.comm.traffic.snapshot()["bytes"].values())
    loader.comm.traffic.reset()
    model_par = gsplit.SplitParallel(model, loader) if cfg.get("wrapper") else model
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    start = rss.reset()
    epoch_s = []
    for _ in range(cfg["epochs"]):
        t = time.perf_counter()
        for _, _, blocks in loader:
            opt.zero_grad()
            logits = loader.forward(model) if cfg.get("overlap") else model_par(blocks, blocks[0].srcdata["feat"])
            loss = gsplit.split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1])
            loss.backward()
            allreduce_gradients(model, loader.comm)
            opt.step()
        epoch_s.append(time.perf_counter() - t)
    peak = rss.stop()
    traffic = loader.comm.traffic.snapshot()["bytes"]
    grad_bytes = traffic.get(GRADIENT_TAG, 0)
    shuffle_bytes = sum(v for k, v in traffic.items() if k != GRADIENT_TAG)
    # accuracy from one full-graph forward in eval mode, counted by each vertex's owner and summed
    model.eval()
    with torch.no_grad():
        pred = model(blocks, blocks[0].srcdata["feat"]).argmax(1)
    nodes = blocks[-1].dst_nodes
    counts = torch.zeros(4, dtype=torch.float64)
    for k, idx in enumerate((ds.val_idx, ds.test_idx)):
        mine = torch.isin(nodes, idx)
        counts[2 * k] = float((pred[mine] == ds.labels[nodes[mine]]).sum())
        counts[2 * k + 1] = float(mine.sum())
    loader.comm.all_reduce_(counts)
    out = {"rank": rank, "epoch_s": epoch_s, "build_s": build_s, "build_bytes": build_bytes,
           "shuffle_bytes_per_epoch": shuffle_bytes / max(cfg["epochs"], 1),
           "gradient_bytes_per_epoch": grad_bytes / max(cfg["epochs"], 1),
           "rss_before_build_mib": mib(before_build), "rss_train_start_mib": mib(start), "peak_rss_mib": mib(peak),
           "train_extra_mib": mib(peak - start), "estimate_mib": mib(estimate.total),
           "estimate_activations_mib": mib(estimate.activations), "final_loss": float(loss.detach()),
           "val_acc": float(counts[0] / counts[1].clamp_min(1)), "test_acc": float(counts[2] / counts[3].clamp_min(1)),
           "owned": int(nodes.numel()), "halo": int(blocks[0].num_src_nodes() - nodes.numel()),
           "edges": int(blocks[0].num_edges())}
    if torch.cuda.is_available():
        out["cuda_max_allocated_mib"] = mib(torch.cuda.max_memory_allocated())
    return out


def run_case(ds, world: int, cfg: dict) -> dict:
    owner = gsplit.partition_full_graph(ds.graph, world, seed=cfg["seed"]).assignment if world > 1 else None
    if world == 1:
        per_rank = [rank_run(0, 1, ds, owner, cfg)]
    else:
        per_rank = gsplit.launch(rank_run, world, args=(ds, owner, cfg), backend="gloo", devices="cpu")
    epochs = [max(r["epoch_s"][e] for r in per_rank) for e in range(cfg["epochs"])]
    timed = epochs[1:] if len(epochs) > 1 else epochs
    return {"ranks": world, "recompute": cfg["recompute"], "overlap": cfg.get("overlap", False), "epoch_s": statistics.median(timed),
            "first_epoch_s": epochs[0], "build_s": max(r["build_s"] for r in per_rank),
            "shuffle_mib_per_epoch": sum(r["shuffle_bytes_per_epoch"] for r in per_rank) / 2**20,
            "gradient_mib_per_epoch": sum(r["gradient_bytes_per_epoch"] for r in per_rank) / 2**20,
            "build_mib": sum(r["build_bytes"] for r in per_rank) / 2**20,
            "peak_rss_mib_max_rank": max(r["peak_rss_mib"] for r in per_rank),
            "train_extra_mib_max_rank": max(r["train_extra_mib"] for r in per_rank),
            "estimate_mib_max_rank": max(r["estimate_mib"] for r in per_rank),
            "val_acc": per_rank[0]["val_acc"], "test_acc": per_rank[0]["test_acc"], "per_rank": per_rank}


def run_dgl(ds, cfg: dict, python: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = setup.export_arrays(tmp, {"indptr": ds.graph.indptr, "indices": ds.graph.indices,
                                           "features": ds.features, "labels": ds.labels, "train_idx": ds.train_idx,
                                           "val_idx": ds.val_idx, "test_idx": ds.test_idx})
        return rounds.run_json([python, PEER, "--data", folder, "--epochs", cfg["epochs"], "--hidden", cfg["hidden"],
                                "--layers", cfg["layers"], "--dropout", cfg["dropout"], "--lr", cfg["lr"],
                                "--seed", cfg["seed"]], path=folder / "peer.json", env=rounds.peer_env(),
                               timeout=1800)


def load_graphs(args):
    for size in setup.int_list(args.sizes):
        yield from setup.each_dataset("synthetic", size, args.seed, data_dir=args.data_dir)
    yield from setup.each_dataset(args.real, 0, args.seed, data_dir=args.data_dir)


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.split("\n")[0], name="full_graph")
    p.add_argument("--sizes", default="100000", help="synthetic graph sizes, comma-separated (default 100000)")
    p.add_argument("--real", default="cora,citeseer", help="graphs of ../shared/data (default cora,citeseer)")
    p.add_argument("--ranks", default="1,2", help="rank counts, comma-separated (default 1,2)")
    p.add_argument("--model", default="gcn", choices=sorted(gsplit.nn.MODELS))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--recompute", default="off", choices=["off", "on", "both"])
    p.add_argument("--overlap", default="off", choices=["off", "on", "both"],
                   help="boundary-first order with the shuffles overlapped (FullGraphLoader(overlap=True))")
    p.add_argument("--data-dir", default=str(setup.DATA), help=f"folder of cora.npz etc. (default {setup.DATA})")
    p.add_argument("--dgl", action="store_true", help="also run DGL's single-process full-graph training")
    setup.add_dgl_python(p)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.epochs = "20000", min(args.epochs, 5)
    choice = {"off": [False], "on": [True], "both": [False, True]}
    settings = [(r, o) for r in choice[args.recompute] for o in choice[args.overlap]]
    rows, results = [], []
    for _, label, ds in load_graphs(args):
        for world in setup.int_list(args.ranks):
            for recompute, overlap in settings:
                cfg = {"model": args.model, "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                       "dropout": args.dropout, "lr": args.lr, "epochs": args.epochs, "seed": args.seed,
                       "recompute": recompute, "overlap": overlap}
                res = {"graph": label, "system": "gsplit", **run_case(ds, world, cfg)}
                results.append(res)
                rows.append([label, "gsplit", world, "yes" if recompute else "no", "yes" if overlap else "no",
                             res["epoch_s"],
                             res["shuffle_mib_per_epoch"], res["peak_rss_mib_max_rank"],
                             res["train_extra_mib_max_rank"], res["estimate_mib_max_rank"], res["val_acc"],
                             res["test_acc"]])
                print(report.format_table(HEADERS, rows[-1:]), flush=True)
        if args.dgl:
            peer = run_dgl(ds, {"hidden": args.hidden, "layers": args.layers, "dropout": args.dropout,
                                "lr": args.lr, "epochs": args.epochs, "seed": args.seed}, Path(args.dgl_python))
            results.append({"graph": label, "system": "dgl", "ranks": 1, **peer})
            rows.append([label, "dgl", 1, "no", "no", peer["epoch_s"], 0.0, peer["peak_rss_mib"], peer["train_extra_mib"],
                         float("nan"), peer["val_acc"], peer["test_acc"]])
            print(report.format_table(HEADERS, rows[-1:]), flush=True)
    print(report.format_table(HEADERS, rows))
    stem = report.output_stem(args)
    report.save_json(stem, {"config": vars(args), "results": results, "table": [dict(zip(HEADERS, r)) for r in rows]})
    return 0


HEADERS = ["graph", "system", "ranks", "recompute", "overlap", "epoch s", "shuffle MiB/epoch", "peak RSS MiB (max rank)",
           "train extra MiB", "estimate MiB", "val acc", "test acc"]

if __name__ == "__main__":
    sys.exit(main())
