"""Issue 51, items 5 and 6: link prediction, gsplit (split and dp) against DGL 2.1's own link prediction loop.

Three systems train the same model with the same settings (SAGE, dot-product predictor, the same fanouts,
hidden size, learning rate, epochs, edges per rank per iteration, ``Uniform(k)`` negatives and ``exclude``),
on CPU ranks over gloo:

* ``dgl``: DGL's own loop (``as_edge_prediction_sampler`` + ``DataLoader(use_ddp=True)`` + ``dgl.nn.SAGEConv``
  in ``DistributedDataParallel``, ``u_dot_v`` scores), run by ``experiments/dgl_link_peer.py`` under
  ``.venv-dgl`` (DGL needs torch 2.2, gsplit a newer one);
* ``split``: :func:`gsplit.link.train.train_link_rank` (what ``gsplit train --task link`` runs), each global
  mini-batch split by a partition map of the message-passing graph (``gsplit`` method, expected pre-sampling:
  ``gsplit train --task link``'s default), made once per world size outside the timing;
* ``dp``: the same with ``system="dp"`` (``gsplit train --task link --system dp``): each rank samples, loads
  and scores its own slice of the global mini-batch, as DGL's ``use_ddp=True`` does.

**Accuracy** (default mode): on Cora, CiteSeer (``--data-dir``, the shared data folder) and a synthetic graph
(``--nodes``), for each seed the edges are split (5% validation, 10% test, both directions held out of the
message-passing graph) and every system trains on the same split; all three are scored by the same evaluator
on the same held-out edges and negatives (:func:`gsplit.link.train.evaluation_negatives`): test MRR against
``--eval-negatives`` per-edge negatives and Hits@K against 1000 shared negative pairs, from layer-wise
embeddings of every vertex (DGL's peer saves its embeddings, scored here). Reported: mean and standard
deviation over the seeds.

**Speed** (``--speed``): on the synthetic graph, epoch time of each system at ``--speed-ranks`` (2 and 4),
``--rounds`` interleaved rounds (the order reversed on odd rounds), each run two epochs of ``--speed-iters``
iterations (the second reported), and each system's time as a ratio to DGL's in the same round. Beside it the
work per iteration, summed over ranks, from each system's own counters: edges sampled (= computed: every
sampled edge is aggregated once) and input-feature rows loaded.

    python experiments/link_vs_dgl.py --quick                   # smoke test, a few minutes
    python experiments/link_vs_dgl.py                           # accuracy: cora, citeseer, synthetic-100k, 3 seeds
    python experiments/link_vs_dgl.py --speed                   # speed: synthetic-100k, 2 and 4 ranks
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads

import numpy as np
import torch

import gsplit
from gsplit.link.edge_split import split_edges
from gsplit.link.metrics import hits_at_k, mrr
from gsplit.link.sampler import edge_endpoints
from gsplit.link.train import LinkTrainConfig, evaluation_negatives, train_link_rank

SYSTEMS = ("dgl", "split", "dp")
PEER = setup.REPO / "experiments" / "dgl_link_peer.py"


def parse_args(argv=None):
    p = setup.make_parser(__doc__.splitlines()[0], name="link_vs_dgl")
    p.add_argument("--speed", action="store_true", help="the speed rows (item 6) instead of the accuracy rows")
    p.add_sized("--datasets", quick="cora", full="cora,citeseer,synthetic",
                help="comma-separated: cora, citeseer, synthetic (default all three; quick cora)")
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int, help="vertices of the synthetic graph")
    p.add_sized("--seeds", quick=[0], full=[0, 1, 2], type=setup.int_list, help="seeds (default 0,1,2)")
    p.add_argument("--data-dir", default=str(setup.DATA), help=f"the shared data folder (default {setup.DATA})")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of dgl, split, dp")
    p.add_argument("--ranks", type=int, default=2, help="ranks of the accuracy runs (default 2)")
    p.add_argument("--fanouts", default="15,10")
    p.add_argument("--batch-size", type=int, default=256, help="training edges per rank per iteration")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_sized("--epochs", quick=2, full=10, type=int, help="epochs of the accuracy runs")
    p.add_sized("--synthetic-iters", quick=10, full=15, type=int,
                help="iterations per epoch on the synthetic graph in the accuracy runs (its full epoch is ~2,500 "
                     "iterations at 2 x 256 edges); Cora and CiteSeer train full epochs")
    p.add_argument("--synthetic-edge-split", default="0.0025,0.005",
                   help="validation and test fractions of the synthetic graph's edges (default 0.0025,0.005: 1,875 and "
                        "3,750 edges of 100k vertices; each rank's evaluation holds test edges x eval negatives x "
                        "hidden floats); Cora and CiteSeer hold out 0.05,0.1")
    p.add_argument("--neg-ratio", type=int, default=1)
    p.add_argument("--exclude", default="reverse_id", choices=["reverse_id", "self", "none"])
    p.add_argument("--eval-negatives", type=int, default=100)
    p.add_argument("--hits-k", type=int, default=50)
    p.add_sized("--speed-ranks", quick=[2], full=[2, 4], type=setup.int_list, help="world sizes of --speed")
    p.add_sized("--rounds", quick=1, full=3, type=int, help="interleaved rounds of --speed")
    p.add_sized("--speed-iters", quick=5, full=30, type=int, help="iterations per epoch in --speed (2 epochs)")
    setup.add_dgl_python(p)
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed per DGL run")
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    for s in args.systems:
        if s not in SYSTEMS:
            raise SystemExit(f"--systems: unknown system {s!r}; use a subset of {','.join(SYSTEMS)}")
    args.datasets = [d for d in args.datasets.split(",") if d]
    args.synthetic_edge_split = [float(x) for x in args.synthetic_edge_split.split(",")]
    return args


def edge_split(key: str, ds, seed: int, args):
    """The seeded train / validation / test split of the edges (the validation and test edges out of the
    message-passing graph, both directions)."""
    val, test = args.synthetic_edge_split if key == "synthetic" else (0.05, 0.1)
    return split_edges(ds.graph, val, test, seed=seed)


def load_dataset(key: str, args):
    """``(label, dataset)``; ``None`` when its file is absent."""
    if key == "synthetic":
        return setup.label_of(key, args.nodes), gsplit.datasets.load("synthetic", num_nodes=args.nodes, seed=0)
    path = setup.data_file(f"{key}.npz", args.data_dir)
    return None if path is None else (key, gsplit.datasets.load(f"npz:{path}"))


def config(args, seed: int, system: str, max_iters: int, epochs: int) -> LinkTrainConfig:
    return LinkTrainConfig(model="sage", system=system, fanouts=setup.int_list(args.fanouts),
                           batch_size=args.batch_size, hidden=args.hidden, dropout=0.0, epochs=epochs, lr=args.lr,
                           seed=seed, neg_ratio=args.neg_ratio, exclude=None if args.exclude == "none" else args.exclude,
                           predictor="dot", eval_negatives=args.eval_negatives, hits_k=args.hits_k,
                           max_iters=max_iters, device="cpu")


def link_map(split, cfg: LinkTrainConfig, world: int) -> torch.Tensor:
    """The map ``gsplit train --task link`` makes by default: ``gsplit`` method, expected pre-sampling with
    the training edges' endpoints as targets (``gsplit.cli.link_map.make_link_map``)."""
    targets = torch.unique(torch.cat(edge_endpoints(split.graph, split.train_eids)))
    pmap = gsplit.partition(split.graph, world, method="gsplit", train_idx=targets, seed=cfg.seed,
                            sampler=gsplit.NeighborSampler(cfg.fanouts, seed=cfg.seed),
                            batch_size=cfg.batch_size * (2 + cfg.neg_ratio))
    return pmap.assignment.long()


def run_gsplit(cfg: LinkTrainConfig, split, ds, world: int, owner) -> dict:
    t = time.perf_counter()
    out = gsplit.launch(train_link_rank, world, args=(cfg, split, ds.features, ds.graph, owner), devices="cpu",
                        backend="gloo", timeout=3600)[0]
    out["wall_s"] = time.perf_counter() - t
    return out


def export_split(folder: Path, split, ds, meta: dict) -> Path:
    """The arrays ``dgl_link_peer.py`` reads: the message-passing graph (CSC: DGL edge e = gsplit edge e)."""
    rev = split.reverse_eids if split.reverse_eids is not None else torch.arange(split.graph.num_edges)
    return setup.export_arrays(folder, {"indptr": split.graph.indptr, "indices": split.graph.indices,
                                        "features": ds.features.float(), "train_eids": split.train_eids,
                                        "reverse_eids": rev}, meta)


def run_dgl(args, folder: Path, cfg: LinkTrainConfig, world: int, embeddings: Path = None) -> dict:
    cmd = [args.dgl_python, PEER, "--data", folder, "--ranks", world, "--fanouts", args.fanouts,
           "--batch-size", cfg.batch_size, "--hidden", cfg.hidden, "--lr", cfg.lr, "--epochs", cfg.epochs,
           "--max-iters", cfg.max_iters, "--neg-ratio", cfg.neg_ratio, "--exclude", args.exclude, "--seed", cfg.seed]
    if embeddings is not None:
        cmd += ["--embeddings", embeddings]
    t = time.perf_counter()
    doc = rounds.run_json(cmd, env=rounds.peer_env(), timeout=args.timeout, cwd=setup.REPO, capture=True)
    doc["wall_s"] = time.perf_counter() - t
    return doc


def score_embeddings(h: torch.Tensor, split, negatives: dict, hits_k: int) -> dict:
    """MRR and Hits@K of embeddings ``h`` (every vertex), as :func:`gsplit.link.train.evaluate_link` scores
    them for a dot predictor: the same held-out edges and negatives, the same metric functions."""
    out = {}
    for name, (src, dst) in (("val", split.val), ("test", split.test)):
        per_edge, (neg_u, neg_v) = negatives[name]
        pos = (h[src] * h[dst]).sum(-1)
        neg = (h[src].unsqueeze(1) * h[per_edge]).sum(-1)
        out[f"final_{name}_mrr"] = mrr(pos, neg)
        out[f"final_{name}_hits@{hits_k}"] = hits_at_k(pos, (h[neg_u] * h[neg_v]).sum(-1), hits_k)
    return out


def mean_std(values) -> tuple:
    values = [float(v) for v in values]
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


# ---------------------------------------------------------------------------------------- item 5: accuracy
def accuracy(args, scratch: Path, save) -> dict:
    runs = []
    for key in args.datasets:
        loaded = load_dataset(key, args)
        if loaded is None:
            continue
        label, ds = loaded
        iters = args.synthetic_iters if key == "synthetic" else 0
        for seed in args.seeds:
            split = edge_split(key, ds, seed, args)
            cfg = config(args, seed, "split", iters, args.epochs)
            print(f"{label} seed {seed}: {split.train_eids.numel():,} training edges, {split.test[0].numel():,} "
                  f"test edges, {args.ranks} ranks", flush=True)
            owner = link_map(split, cfg, args.ranks) if "split" in args.systems else None
            folder = export_split(scratch / f"{key}-n{ds.num_nodes}-s{seed}", split, ds,
                                  {"dataset": label, "seed": seed, "edges": split.graph.num_edges})
            negatives = evaluation_negatives(split, cfg, ds.graph)
            for system in rounds.alternate(args.systems, seed):
                if system == "dgl":
                    emb = folder / "dgl_embeddings.npy"
                    doc = run_dgl(args, folder, cfg, args.ranks, emb)
                    result = score_embeddings(torch.from_numpy(np.load(emb)), split, negatives, args.hits_k)
                    epochs = doc["epochs"]
                else:
                    doc = run_gsplit(config(args, seed, system, iters, args.epochs), split, ds, args.ranks,
                                     owner if system == "split" else None)
                    result, epochs = {k: v for k, v in doc.items() if k.startswith("final_")}, doc["epochs"]
                row = {"dataset": label, "seed": seed, "system": system, "final_loss": epochs[-1]["loss"],
                       "iterations_per_epoch": epochs[-1]["iterations"], "wall_s": doc["wall_s"], **result}
                runs.append(row)
                save({"partial": True, "runs": runs})  # a run cut short keeps what it measured
                print(f"  {system:5s} test MRR {row['final_test_mrr']:.4f}  Hits@{args.hits_k} "
                      f"{row[f'final_test_hits@{args.hits_k}']:.4f}  loss {row['final_loss']:.4f}  "
                      f"({row['wall_s']:.0f}s)", flush=True)
    k = args.hits_k
    summary, rows = [], []
    for label in dict.fromkeys(r["dataset"] for r in runs):
        for system in args.systems:
            mine = [r for r in runs if r["dataset"] == label and r["system"] == system]
            if not mine:
                continue
            m, s = mean_std(r["final_test_mrr"] for r in mine)
            hm, hs = mean_std(r[f"final_test_hits@{k}"] for r in mine)
            vm, vs = mean_std(r["final_val_mrr"] for r in mine)
            summary.append({"dataset": label, "system": system, "seeds": len(mine), "test_mrr_mean": m,
                            "test_mrr_std": s, f"test_hits@{k}_mean": hm, f"test_hits@{k}_std": hs,
                            "val_mrr_mean": vm, "val_mrr_std": vs})
            rows.append([label, system, len(mine), f"{m:.4f} ± {s:.4f}", f"{hm:.4f} ± {hs:.4f}",
                         f"{vm:.4f} ± {vs:.4f}"])
    print()
    print(report.format_table(["dataset", "system", "seeds", "test MRR", f"test Hits@{k}", "val MRR"], rows))
    return {"runs": runs, "summary": summary}


# ---------------------------------------------------------------------------------------- item 6: speed
def work(epoch: dict) -> dict:
    """Per iteration, summed over ranks: edges sampled (= computed) and input rows loaded."""
    it = max(int(epoch["iterations"]), 1)
    return {"edges_per_it": sum(epoch["edges"]) / it, "input_rows_per_it": epoch["input_rows"] / it,
            "edges_per_layer_per_it": [e / it for e in epoch["edges"]]}


def speed(args, scratch: Path, save) -> dict:
    label, ds = load_dataset("synthetic", args)
    seed = args.seed
    split = edge_split("synthetic", ds, seed, args)
    folder = export_split(scratch / f"synthetic-n{ds.num_nodes}-s{seed}", split, ds,
                          {"dataset": label, "seed": seed, "edges": split.graph.num_edges})
    full_iters = {}
    runs = []
    for world in args.speed_ranks:
        cfg = config(args, seed, "split", args.speed_iters, 2)
        t = time.perf_counter()
        owner = link_map(split, cfg, world) if "split" in args.systems else None
        print(f"{label}, {world} ranks: map in {time.perf_counter() - t:.1f}s", flush=True)
        full_iters[world] = -(-split.train_eids.numel() // (args.batch_size * world))
        for r, order in rounds.orders(args.systems, args.rounds):
            for system in order:
                if system == "dgl":
                    epochs = run_dgl(args, folder, cfg, world)["epochs"]
                else:
                    epochs = run_gsplit(config(args, seed, system, args.speed_iters, 2), split, ds, world,
                                        owner if system == "split" else None)["epochs"]
                last = epochs[-1]
                runs.append({"ranks": world, "round": r, "system": system, "epoch_s": last["epoch_s"],
                             "iterations": last["iterations"], "sample_s": last["sample_s"],
                             "train_s": last["train_s"], **work(last)})
                save({"partial": True, "runs": runs})
                print(f"  round {r} {system:5s} {world} ranks: epoch {last['epoch_s']:.2f}s "
                      f"({last['iterations']} it; sample {last['sample_s']:.2f}s)", flush=True)
    rows, summary = [], []
    for world in args.speed_ranks:
        mine = [r for r in runs if r["ranks"] == world]
        dgl = {r["round"]: r["epoch_s"] for r in mine if r["system"] == "dgl"}
        dp_edges = statistics.median(r["edges_per_it"] for r in mine if r["system"] == "dp") \
            if any(r["system"] == "dp" for r in mine) else None
        for system in args.systems:
            own = [r for r in mine if r["system"] == system]
            ratios = [r["epoch_s"] / dgl[r["round"]] for r in own if r["round"] in dgl]
            e = statistics.median(r["edges_per_it"] for r in own)
            rows_in = statistics.median(r["input_rows_per_it"] for r in own)
            entry = {"ranks": world, "system": system, "epoch_s_median": statistics.median(r["epoch_s"] for r in own),
                     "ratio_to_dgl_median": statistics.median(ratios) if ratios else None,
                     "ratios": ratios, "edges_per_it": e, "input_rows_per_it": rows_in,
                     "full_epoch_iterations": full_iters[world],
                     "edges_per_full_epoch": e * full_iters[world], "input_rows_per_full_epoch": rows_in * full_iters[world]}
            summary.append(entry)
            rows.append([world, system, entry["epoch_s_median"],
                         "-" if not ratios else f"{entry['ratio_to_dgl_median']:.2f} [{min(ratios):.2f}-{max(ratios):.2f}]",
                         f"{e:,.0f}", f"{rows_in:,.0f}", "-" if not dp_edges else f"{e / dp_edges:.2f}"])
    print()
    print(f"{label}: {args.speed_iters} iterations per epoch (second epoch), {args.batch_size} edges per rank, "
          f"{args.rounds} rounds")
    print(report.format_table(["ranks", "system", "epoch s", "x DGL [range]", "edges / it", "input rows / it",
                               "edges x dp"], rows))
    return {"runs": runs, "summary": summary, "dataset": label, "train_edges": int(split.train_eids.numel())}


def main(argv=None) -> int:
    args = parse_args(argv)
    if "dgl" in args.systems:
        setup.check_python(args.dgl_python)
    scratch = setup.scratch(args.out, "link_vs_dgl")
    load_before = report.load_average()
    stem = report.output_stem(args, suffix="_speed" if args.speed else "")

    def save(doc: dict, announce: bool = False) -> None:
        report.save_json(stem, {"experiment": "link prediction: gsplit vs DGL (issue 51 items 5-6)",
                                "mode": "speed" if args.speed else "accuracy", "settings": report.settings(args),
                                "load_before": load_before, "load_after": report.load_average(), **doc}, announce)

    save(speed(args, scratch, save) if args.speed else accuracy(args, scratch, save), announce=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
