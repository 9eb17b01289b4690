"""Issue 20, item 6: how much of split's waiting is the map's imbalance and how much is shared cores.

Runs ``gsplit train --system split`` (CPU ranks over gloo) with ``--log`` and reads the last epoch's
``balance`` record (``gsplit.run.trainer.iteration_balance``), summed over the epoch's iterations:

* ``step``: the training step (forward, loss, backward, gradient all-reduce, optimiser), mean over ranks;
* ``in collectives``: the seconds inside the step's collectives (layer shuffles forward and backward,
  gradient all-reduce), mean over ranks: with gloo the transfer plus the waiting for the slowest rank;
* ``compute``: step minus its collectives, per rank; ``compute max/mean`` its imbalance;
* ``gap``: max - mean of the ranks' compute, summed over iterations: what the average rank waits for
  the slowest at least (per iteration; the waits at each layer can add up to more);
* ``map part``: the gap that the ranks' edges explain (mean compute x (edges max/mean - 1), edges of
  every layer summed per rank), ``noise part``: the rest (the same work taking different times on
  shared cores);
* ``shuffles transfer`` / ``shuffles wait``: the layer shuffles' seconds split per collective into the
  least over ranks (the transfer: the last rank to arrive waits for no one) and the mean beyond it
  (waiting for the slowest); the wait can exceed the gap: a rank slower at one layer and faster at the
  next waits at both shuffles while its compute over the iteration evens out (``bench_transport.py``
  measures the transfer alone, in lockstep);
* ``all-reduce``: the gradient all-reduce (in collectives minus the shuffles);
* per layer (``gsplit.runtime.timing.LayerClock``: each layer's forward + backward compute, waits and shuffles left
  out): ``layer s`` the mean over ranks, ``layer max/mean`` its imbalance, ``layer gap s`` max - mean summed
  over iterations (what the faster rank waits at that layer's shuffles, at least), split into ``layer map
  part s`` (the layer's mean time x (its edges max/mean - 1)) and the rest, noise.

``--busy N`` runs N busy-loop processes during training (another job on the cores), to show the noise
part grow while the map part stays. Sampling and loading have their own collectives (id exchanges,
feature shuffle), reported apart as ``ids s`` / ``features s`` (seconds inside them, mean over ranks).

    python experiments/bench_balance.py --quick              # 20k vertices, 5 iterations
    python experiments/bench_balance.py                      # 100k vertices, 30 iterations, quiet and --busy 1
    python experiments/bench_balance.py --busy 0 --model gat
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads

from gsplit.runtime.io import read_run_log


def parse_args(argv=None):
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int,
                help="vertices of the synthetic graph (default 100000; quick 20000)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--model", default="sage", choices=["sage", "gat"])
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--hidden", type=int, default=256)
    p.add_sized("--max-iters", quick=5, full=0, type=int, help="iterations per epoch (default all; quick 5)")
    p.add_sized("--busy", quick=[0], full=[0, 1], type=setup.int_list,
                help="comma-separated busy-loop process counts, one run each (default 0,1; quick 0)")
    return p.parse_args(argv)


def run_once(args, busy: int, scratch: Path) -> dict:
    log = scratch / f"balance-{args.model}-w{args.ranks}-n{args.nodes}-busy{busy}.json"
    cmd = setup.GSPLIT_CLI + ["train", "--dataset", "synthetic", "-D", f"num_nodes={args.nodes}", "--num-ranks",
                              args.ranks, "--system", "split", "--device", "cpu", "--model", args.model, "--fanouts",
                              args.fanouts, "--batch-size", args.batch_size, "--hidden", args.hidden, "--epochs", 2,
                              "--eval-every", 0, "--seed", args.seed, "--log", log,
                              "--partition", scratch / f"map-n{args.nodes}-w{args.ranks}"]
    if args.max_iters:
        cmd += ["--max-iters", args.max_iters]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    load_before = report.load_average()
    try:
        rounds.run_command(cmd, log=log.with_suffix(".log"), cwd=setup.REPO)
    finally:
        for h in hogs:  # only the processes started here, by their handles
            h.kill()
            h.wait()
    epoch = read_run_log(log)["epochs"][-1]
    b = epoch["balance"]
    ranks = epoch["ranks"]
    n = len(ranks)

    def mean_tag(prefix):
        return sum(sum(s for t, s in it["collective_s_by_tag"].items() if t.startswith(prefix))
                   for r in ranks for it in r["per_iteration"]) / n

    step = sum(r["train_s"] for r in ranks) / n
    shuffle_tags = [t for t in b["wait_s_by_tag"] if t.startswith("shuffle/") and t != "shuffle/layer0/fwd"]
    transfer = sum(b["transfer_s_by_tag"][t] for t in shuffle_tags)
    wait = sum(b["wait_s_by_tag"][t] for t in shuffle_tags)
    row = {"busy": busy, "load_average_before": load_before, "iterations": len(b["per_iteration"]),
           "epoch_s": epoch["epoch_s"], "step_s": step, "in_collectives_s": b["step_collective_s_mean"],
           "compute_s": b["compute_s_mean"], "compute_max_over_mean": b["compute_s_max_over_mean"],
           "edges_max_over_mean": b["edges_max_over_mean"], "gap_s": b["compute_gap_s"],
           "map_part_s": b["edges_gap_s"], "noise_part_s": b["noise_gap_s"],
           "shuffles_transfer_s": transfer, "shuffles_wait_s": wait,
           "allreduce_s": b["step_collective_s_mean"] - transfer - wait,
           "ids_s": mean_tag("ids/"), "features_s": mean_tag("shuffle/layer0/fwd"),
           "layer_s_mean": b["layer_s_mean"], "layer_s_max": b["layer_s_max"],
           "layer_s_max_over_mean": b["layer_s_max_over_mean"], "layer_gap_s": b["layer_gap_s"],
           "layer_map_part_s": b["layer_edges_gap_s"], "layer_noise_part_s": b["layer_noise_gap_s"],
           "layer_fwd_s_mean": b["layer_fwd_s_mean"], "layer_bwd_s_mean": b["layer_bwd_s_mean"],
           "torch_threads": [r.get("torch_threads") for r in ranks], "log": report.rel(log)}
    print(f"busy {busy}: epoch {row['epoch_s']:.2f}s, step {step:.2f}s of which in collectives "
          f"{row['in_collectives_s']:.2f}s; gap {row['gap_s']:.3f}s = map {row['map_part_s']:.3f}s + noise "
          f"{row['noise_part_s']:.3f}s; per layer gap {_layers(row['layer_gap_s'])} s = map "
          f"{_layers(row['layer_map_part_s'])} + noise {_layers(row['layer_noise_part_s'])}", flush=True)
    return row


def _layers(values, digits: int = 3) -> str:
    return "/".join(f"{x:.{digits}f}" for x in values)


def main(argv=None) -> int:
    args = parse_args(argv)
    stem = report.output_stem(args, f"bench_balance_{args.model}")
    scratch = setup.scratch(args.out, "bench_balance")
    rows = [run_once(args, busy, scratch) for busy in args.busy]
    f = lambda x: f"{x:.3f}"  # noqa: E731
    table = report.format_table(
        ["busy procs", "load avg", "iterations", "epoch s", "step s", "in collectives s", "compute s",
         "compute max/mean", "edges max/mean per layer", "gap s", "map part s", "noise part s",
         "shuffles transfer s", "shuffles wait s", "all-reduce s", "ids s", "features s",
         "layer s (fwd+bwd)", "layer max/mean", "layer gap s", "layer map part s"],
        [[r["busy"], f"{r['load_average_before'][0]:.1f}" if r["load_average_before"] else "-", r["iterations"],
          f(r["epoch_s"]), f(r["step_s"]), f(r["in_collectives_s"]), f(r["compute_s"]), f(r["compute_max_over_mean"]),
          " ".join(f"{x:.3f}" for x in r["edges_max_over_mean"]), f(r["gap_s"]), f(r["map_part_s"]),
          f(r["noise_part_s"]), f(r["shuffles_transfer_s"]), f(r["shuffles_wait_s"]), f(r["allreduce_s"]),
          f(r["ids_s"]), f(r["features_s"]), _layers(r["layer_s_mean"], 2), _layers(r["layer_s_max_over_mean"]),
          _layers(r["layer_gap_s"]), _layers(r["layer_map_part_s"])] for r in rows])
    head = (f"split, {args.model}, {args.ranks} CPU ranks, synthetic {args.nodes:,} vertices, batch {args.batch_size}"
            f"/rank, fanouts {args.fanouts}, hidden {args.hidden}; epoch 1, seconds summed over its iterations "
            "(mean over ranks)")
    print(f"\n{head}\n{table}")
    report.save_json(stem, {"experiment": "balance: map imbalance vs shared-core noise (issue 20 item 6)",
                            "settings": report.settings(args), "rows": rows,
                            "table": table, "heading": head})
    return 0


if __name__ == "__main__":
    sys.exit(main())
