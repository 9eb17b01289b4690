"""What split sampling with its sizes on the device (:mod:`gsplit.split.deferred`, the GPU path) costs on CPU ranks.

2 ranks, one epoch of split sampling on the synthetic graph, the two paths interleaved (ABAB) in one launch:
``exact`` is what CPU ranks run (``sp_sample``: the compiled C++ sampler and relabel, a size read per step, free
on the CPU; with ``--no-extensions`` the torch sampler and relabel, the ops a GPU without the deferred path
runs), ``deferred`` what a GPU with NCCL runs (padded torch ops, slot exchanges, one read per iteration), here
forced on the CPU. Per path: the median epoch's sampling seconds (rank 0) and the iterations whose slots
overflowed (redone exactly). The CPU keeps the exact path: this says what the GPU path would cost it.

    python experiments/deferred_sizes.py --quick
    python experiments/deferred_sizes.py --nodes 100000 --rounds 3 [--no-extensions]
"""

from __future__ import annotations

import os
import statistics
import time

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads

import torch

import gsplit
from gsplit.comm.communicator import Communicator
from gsplit.launcher import launch
from gsplit.sampling.batches import epoch_permutation
from gsplit.split import deferred, local_targets, sp_sample


def rank_main(rank, world_size, nodes, batch, fanouts, rounds, seed):
    ds = gsplit.datasets.load("synthetic", num_nodes=nodes, seed=seed)
    owner = gsplit.partition(ds.graph, world_size, method="edge", train_idx=ds.train_idx).assignment.long()
    sampler = gsplit.NeighborSampler(fanouts, seed=seed)
    comm = Communicator()
    order = epoch_permutation(ds.train_idx, seed, 0)
    seeds_per_it = [order[i:i + batch * world_size] for i in range(0, order.numel(), batch * world_size)]
    sp_sample(ds.graph, seeds_per_it[0], owner, sampler, comm, iteration=0)  # teaches the slot capacities
    times = {"exact": [], "deferred": []}
    overflows = []
    for r in range(rounds):
        for path in ("exact", "deferred"):
            comm.barrier()
            t0, over = time.perf_counter(), 0
            for it, seeds in enumerate(seeds_per_it):
                if path == "exact":
                    sp_sample(ds.graph, seeds, owner, sampler, comm, epoch=r, iteration=it)
                    continue
                mine = local_targets(seeds, owner, rank)
                if deferred.sample_deferred(ds.graph, mine, owner, sampler, comm, r, it) is None:
                    over += 1
                    sp_sample(ds.graph, seeds, owner, sampler, comm, epoch=r, iteration=it)
            times[path].append(time.perf_counter() - t0)
            if path == "deferred":
                overflows.append(over)
    return {"times": times, "overflows": overflows, "iterations": len(seeds_per_it)}


def main():
    p = setup.make_parser(__doc__.splitlines()[0], name="deferred_sizes")
    p.add_argument("--nodes", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--fanouts", type=setup.int_list, default=[15, 10, 5])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-extensions", action="store_true",
                   help="the exact path with torch's sampler and relabel instead of the compiled ones")
    args = p.parse_args()
    if args.no_extensions:
        os.environ["GSPLIT_NO_EXTENSIONS"] = "1"  # the ranks inherit it
        args.name += "_torch"
    if args.quick:
        args.nodes, args.rounds = 20_000, 2
    per_rank = launch(rank_main, 2, args=(args.nodes, args.batch, args.fanouts, args.rounds, args.seed))
    r0 = per_rank[0]
    exact, deferred_s = statistics.median(r0["times"]["exact"]), statistics.median(r0["times"]["deferred"])
    rows = [["exact (torch ops)" if args.no_extensions else "exact (CPU ranks' path)", exact, 1.0, "-"],
            ["deferred (GPU path, forced)", deferred_s, deferred_s / exact, sum(r0["overflows"])]]
    print(report.format_table(["path", "sampling s/epoch (median)", "vs exact", "overflowed iterations"], rows))
    report.save_json(report.output_stem(args), {"settings": report.settings(args), "per_rank": per_rank,
                                                "median_s": {"exact": exact, "deferred": deferred_s},
                                                "ratio": deferred_s / exact, "load": report.load_average()})


if __name__ == "__main__":
    main()
