"""Where a SAGE / GAT iteration's layer compute goes, op by op, in gsplit and in DGL 2.1 on the SAME blocks (issue 20).

Samples ``--batches`` mini-batches of the vs_dgl setting (synthetic graph of ``--nodes`` vertices, fanouts
15,10,5, ``--batch-size`` targets, as one rank of ``vs_dgl.py`` at 2 ranks), saves their blocks to an
``.npz`` (``layer_ops_models.py`` says the format), and times one process running the model's forward,
cross-entropy and backward on them (``--threads`` torch threads, default 1 = one rank's share of 2 cores;
hidden 256, dropout 0.5, GAT 4 heads), median of ``--repeats`` passes after a warm-up; then one pass under
``torch.profiler`` gives each op's self time per iteration. Every side runs in a process of its own, the sides
interleaved in each of ``--rounds`` rounds; the median over rounds is reported. Sides, all on the same blocks:

* ``gsplit``: this checkout's ``gsplit.nn.SAGE`` / ``GAT`` (fresh ``Block`` objects every step, so anything
  a block caches is paid per step, as in training);
* ``baseline`` (``--baseline-repo DIR``): the same from another checkout (e.g. ``/work/main`` before a change),
  run in a subprocess with its own extension cache folder (``--baseline-extension-dir``, default gsplit's
  usual one: run this checkout with another ``GSPLIT_EXTENSION_DIR`` when its kernels differ);
* ``dgl`` (``--dgl-python``): ``dgl_layer_ops_peer.py``, DGL's ``SAGEConv`` / ``GATConv`` (``dgl_peer.py``'s models).

    GSPLIT_EXTENSION_DIR=~/.cache/gsplit/ext-new python experiments/bench_layer_ops.py \
        --dgl-python /work/main/.venv-dgl/bin/python --baseline-repo /work/main
    python experiments/bench_layer_ops.py --quick
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import numpy as np
import torch

from layer_ops_models import read_blocks, time_and_profile


def save_blocks(path: Path, args) -> dict:
    """Sample the batches and write them to ``path``; returns their sizes."""
    from gsplit.sampling import NeighborSampler

    ds = setup.load_named("synthetic", args.nodes, args.seed)
    fanouts = setup.int_list(args.fanouts)
    sampler = NeighborSampler(fanouts, seed=args.seed)
    perm = ds.train_idx[torch.randperm(ds.train_idx.numel(), generator=torch.Generator().manual_seed(args.seed))]
    arrays = {"meta": np.array([args.batches, len(fanouts), ds.features.shape[1], ds.num_classes])}
    sizes = []
    for b in range(args.batches):
        seeds = perm[b * args.batch_size:(b + 1) * args.batch_size]
        mb = sampler.sample(ds.graph, seeds, epoch=0, iteration=b)
        for l, blk in enumerate(mb.blocks):
            arrays[f"b{b}_l{l}_src"] = blk.edge_src.numpy()
            arrays[f"b{b}_l{l}_dst"] = blk.edge_dst.numpy()
            arrays[f"b{b}_l{l}_ids"] = blk.src_nodes.numpy()
            arrays[f"b{b}_l{l}_n"] = np.array([blk.num_src_nodes(), blk.num_dst])
        arrays[f"b{b}_feat"] = ds.features[mb.blocks[0].src_nodes].numpy()
        arrays[f"b{b}_label"] = ds.labels[mb.output_nodes].numpy()
        sizes.append([[blk.num_src_nodes(), blk.num_dst, blk.num_edges()] for blk in mb.blocks])
    np.savez(path, **arrays)
    return {"in_feats": int(ds.features.shape[1]), "num_classes": ds.num_classes, "blocks_src_dst_edges": sizes}


def gsplit_side(blocks_path: Path, models, args) -> dict:
    """Time and profile this process's gsplit on the saved blocks."""
    from gsplit.nn.models import GAT, SAGE
    from gsplit.runtime.resources import keep_freed_heap
    from gsplit.sampling.block import Block

    torch.set_num_threads(args.threads)
    # As a training rank on a CPU (train_rank, gsplit.launch): freed large temporaries keep their pages. Without
    # it a backward kernel's fresh [sources x width] gradient faults its pages in at every step, which hid a
    # 2x faster kernel here (2026-11-27); DGL's ranks run with glibc's defaults (--systems dgl-keepheap in
    # vs_dgl.py measured that setting at 0.99x for them), so its side keeps them.
    keep_freed_heap()
    data = read_blocks(blocks_path)
    z = np.load(blocks_path)
    for i, b in enumerate(data["batches"]):
        b["ids"] = [torch.from_numpy(z[f"b{i}_l{l}_ids"]) for l in range(data["num_layers"])]

    def run_forward(model, batch):
        # Fresh blocks every step: whatever a Block caches is paid once per step, as in training.
        blocks = [Block(src_nodes=ids, num_dst=nd, edge_src=src, edge_dst=dst, edge_ids=src, layer=l)
                  for l, ((src, dst, _ns, nd), ids) in enumerate(zip(batch["layers"], batch["ids"]))]
        return model(blocks, batch["feat"])

    out = {}
    for name in models:
        torch.manual_seed(0)
        if name == "sage":
            model = SAGE(data["in_feats"], args.hidden, data["num_classes"], data["num_layers"], dropout=args.dropout)
        else:
            model = GAT(data["in_feats"], args.hidden, data["num_classes"], data["num_layers"], heads=args.heads,
                        dropout=args.dropout)
        out[name] = time_and_profile(model, data["batches"], run_forward, args.repeats)
    return out


def side_args(args):
    return ["--models", args.models, "--threads", args.threads, "--repeats", args.repeats, "--hidden", args.hidden,
            "--heads", args.heads, "--dropout", args.dropout]


def print_tables(results: dict, models, top: int) -> None:
    sides = list(results)
    for m in models:
        print(f"\n== {m}: ms per iteration (forward incl. loss / backward), {', '.join(sides)}")
        rows = [[s, results[s][m]["forward_ms"], results[s][m]["backward_ms"],
                 results[s][m]["forward_ms"] + results[s][m]["backward_ms"]] for s in sides]
        ref = rows[-1][3]
        for r in rows:
            r.append(r[3] / ref)
        print(report.format_table(["side", "forward", "backward", "total", f"/ {sides[-1]}"], rows, ".4g"))
        for s in sides:
            ops = results[s][m]["ops"]
            best = sorted(ops.items(), key=lambda kv: -kv[1]["self_ms"])[:top]
            print(f"\n{s}: top ops by self time (ms per iteration, profiled pass)")
            print(report.format_table(["op", "self ms", "total ms", "calls"],
                                      [[k[:70], v["self_ms"], v["total_ms"], v["calls"]] for k, v in best], ".3g"))


def main(argv=None) -> None:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int, help="vertices (default 100000; quick 20000)")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_sized("--batches", quick=2, full=4, type=int, help="mini-batches (default 4; quick 2)")
    p.add_argument("--models", default="sage,gat")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="timed passes per side and round")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each side once per round)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--top", type=int, default=18, help="ops per table")
    setup.add_dgl_python(p, default="", help="interpreter of the DGL venv: adds DGL's side")
    p.add_argument("--baseline-repo", default="", help="another gsplit checkout: adds its side (e.g. /work/main)")
    p.add_argument("--baseline-extension-dir", default=str(Path.home() / ".cache" / "gsplit" / "extensions"),
                   help="the baseline's compiled-kernel cache (its kernels differ from this checkout's: give this "
                        "run another GSPLIT_EXTENSION_DIR, or the two rebuild over each other)")
    p.add_argument("--blocks", default="", help="(internal) time this checkout on saved blocks and write --json")
    p.add_argument("--json", default="", help="(internal, with --blocks)")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    if args.blocks:  # subprocess mode: the baseline checkout's side
        report.write_json(args.json, gsplit_side(Path(args.blocks), models, args))
        return
    stem = report.output_stem(args, "bench_layer_ops")
    blocks_path = stem.with_suffix(".blocks.npz")
    info = save_blocks(blocks_path, args)
    print(f"blocks (src, dst, edges per layer): {info['blocks_src_dst_edges'][0]} ... -> {report.rel(blocks_path)}")
    # Each side runs in its own process, the sides interleaved in every round, so that load drifts on a
    # shared machine hit them alike; per side the median over rounds is reported (the last round's profile).
    sides = {}
    if args.baseline_repo:
        sides["baseline"] = ([sys.executable, __file__, "--blocks", blocks_path, *side_args(args)],
                             rounds.checkout_env(args.baseline_repo, GSPLIT_EXTENSION_DIR=args.baseline_extension_dir))
    sides["gsplit"] = ([sys.executable, __file__, "--blocks", blocks_path, *side_args(args)],
                       rounds.checkout_env(setup.REPO))
    if args.dgl_python:
        sides["dgl"] = ([args.dgl_python, Path(__file__).with_name("dgl_layer_ops_peer.py"), "--blocks", blocks_path,
                         *side_args(args)], rounds.peer_env())
    by_side = {s: [] for s in sides}
    for r, order in rounds.orders(list(sides), args.rounds, alternate_order=False):
        for s in order:
            cmd, env = sides[s]
            got = rounds.run_json(cmd, env=env)
            by_side[s].append(got)
            print(f"round {r + 1}: {s} " + ", ".join(f"{m} {got[m]['forward_ms'] + got[m]['backward_ms']:.0f} ms"
                                                     for m in models), flush=True)
    results = {}
    for s, runs in by_side.items():
        results[s] = {}
        for m in models:
            last = dict(runs[-1][m])
            for key in ("forward_ms", "backward_ms"):
                last[key + "_rounds"] = [run[m][key] for run in runs]
                last[key] = statistics.median(last[key + "_rounds"])
            results[s][m] = last
    print_tables(results, models, args.top)
    blocks_path.unlink()  # large; rerunning samples the same blocks again
    report.save_json(stem, {"blocks": info, "results": results, "sides": list(results)})


if __name__ == "__main__":
    main()
