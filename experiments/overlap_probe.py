"""Where overlapped layers save time: one split batch, forward + backward repeated, plain vs overlapped.

Two CPU ranks over gloo; each samples one 3-layer batch (1024 targets per rank, fanouts 15,10,5) with a
plain loader and with ``overlap=True``, then runs the model's forward and backward on it ``--reps`` times
(the first is warm-up). Printed per rank: the median seconds per repetition, the seconds spent inside the
layer shuffles per repetition (blocking all-to-alls: transfer plus waiting; overlapped: only the wait at
the end of each part), and each overlapped layer's (interior, boundary) destination counts.

    python experiments/overlap_probe.py --model sage --nodes 100000
    python experiments/overlap_probe.py --quick        # 20k vertices, 2 repetitions
"""

from __future__ import annotations

import statistics
import sys

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

import gsplit
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.nn import build_model, split_cross_entropy


def probe(rank, world, model_name, nodes, reps, hidden, seed):
    ds = gsplit.datasets.make_synthetic(num_nodes=nodes, seed=seed)
    owner = torch.arange(ds.num_nodes) * world // ds.num_nodes  # contiguous id ranges
    out = {}
    for overlap in (False, True):
        loader = DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler([15, 10, 5]), partition=owner,
                            use_ddp=True, batch_size=1024, shuffle=True, features=ds.features, labels=ds.labels,
                            overlap=overlap)
        _, _, blocks = next(iter(loader))
        torch.manual_seed(seed)
        model = build_model(model_name, ds.features.shape[1], hidden, ds.num_classes, 3, dropout=0.5)

        def step(model=model, blocks=blocks, loader=loader):
            logits = model(blocks, blocks[0].srcdata["feat"], loader.comm)
            split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1]).backward()
            loader.comm.barrier()

        step()  # warm-up, outside the traffic counted below
        loader.comm.traffic.reset()
        times = rounds.time_repeats(step, reps, warmup=0)
        shuffle_s = sum(v for t, v in loader.comm.traffic.seconds.items() if t.startswith(("shuffle/layer1/",
                                                                                              "shuffle/layer2/")))
        out["overlap" if overlap else "plain"] = {"s_per_rep": statistics.median(times),
                                                  "layer_shuffle_s_per_rep": shuffle_s / reps}
        if overlap:
            out["parts"] = [(b.overlap.num_interior, b.overlap.boundary_block.num_dst) for b in blocks[:-1]]
    return out


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="sage", help="sage, gat or gcn")
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int,
                help="vertices of the synthetic graph (default 100000; quick 20000)")
    p.add_sized("--reps", quick=2, full=5, type=int, help="measured repetitions (after one warm-up; default 5, quick 2)")
    p.add_argument("--hidden", type=int, default=128)
    args = p.parse_args(argv)
    ranks = launch(probe, 2, args=(args.model, args.nodes, args.reps, args.hidden, args.seed))
    for rank, r in enumerate(ranks):
        print(f"rank {rank}: plain {r['plain']['s_per_rep']:.3f} s (layer shuffles {r['plain']['layer_shuffle_s_per_rep']:.3f} s), "
              f"overlap {r['overlap']['s_per_rep']:.3f} s (waits {r['overlap']['layer_shuffle_s_per_rep']:.3f} s); "
              f"(interior, boundary) per layer {r['parts']}")
    report.save_json(report.output_stem(args, "overlap_probe"), {"settings": report.settings(args), "ranks": ranks})
    return 0


if __name__ == "__main__":
    sys.exit(main())
