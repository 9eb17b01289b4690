"""What split's row copies cost per iteration: the feature shuffle, the layer shuffles and the overlapped assembly,
forward and backward, in this checkout and in another one (issue 20: copies of the shuffle path).

Two ranks (gloo, one CPU thread each) sample ``--batches`` mini-batches of the vs_dgl setting (synthetic graph
of ``--nodes`` vertices, 64 features, fanouts 15,10,5, 1024 targets per rank, the ``edge`` map, overlap plans on)
and time, per batch, the fastest of ``--repeats`` runs after a warm-up (the least disturbed on a shared machine;
the median is in the JSON too), every rank starting together (a barrier); the median over batches is reported:

* ``feature shuffle``: ``shuffle_rows`` of the gathered input rows (what the loader runs);
* ``layer shuffles fwd+bwd (plain path)``: ``gsplit.shuffle``'s autograd function on random hidden rows (256
  wide) before layers 1 and 2, forward and backward (the path GAT and ``--no-overlap`` take);
* ``overlapped assembly fwd+bwd``: ``_SendBoundary`` + ``_Assemble`` of layers 0 and 1, forward and backward
  (the path SAGE takes by default).

Only the copies and the all-to-alls are timed (no layer compute), so the difference between two checkouts is
what their copies cost. Each side runs in a process of its own (``--baseline-repo DIR``: another checkout,
e.g. ``git worktree add /tmp/old 26a9732``), the sides interleaved in each of ``--rounds`` rounds (fair on a
shared machine); per side the median over rounds is reported, with a checksum of the outputs and gradients
(equal checksums: the same rows). The ms are rank 0's; ``ranks_ms`` in the JSON has both.

    python experiments/bench_shuffle_copies.py --baseline-repo /tmp/old
    python experiments/bench_shuffle_copies.py --quick --baseline-repo /tmp/old
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from harness import report, rounds, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch

import gsplit

HIDDEN = 256
FANOUTS = [15, 10, 5]
BATCH = 1024
PARTS = ("feature shuffle", "layer shuffles fwd+bwd (plain path)", "overlapped assembly fwd+bwd")


def _timed(comm, fn, repeats: int):
    """``(fastest, median)`` seconds of ``fn()`` over ``repeats`` runs after one warm-up, ranks starting together.
    On a machine shared with other work the fastest run is the one least disturbed by it."""
    times = rounds.time_repeats(fn, repeats, before=comm.barrier)
    return min(times), statistics.median(times)


def side_rank(rank, world_size, graph_args, owner, batches: int, repeats: int):
    """One rank of one side: ms per iteration of each part (median over batches) and a checksum."""
    from gsplit.comm.shuffle import _Shuffle, shuffle_rows
    from gsplit.minibatch.overlap import AsyncRows, _Assemble, _SendBoundary

    torch.set_num_threads(1)
    ds = setup.load_named("synthetic", *graph_args)
    loader = gsplit.DataLoader(ds.graph, ds.train_idx, gsplit.NeighborSampler(FANOUTS, seed=0), partition=owner,
                               use_ddp=True, batch_size=BATCH, shuffle=True, features=ds.features, labels=ds.labels,
                               overlap=True)
    comm = loader.comm
    gen = torch.Generator().manual_seed(rank)
    per_batch = {p: [] for p in PARTS}
    checksum = 0.0
    sizes = []
    for b, (input_nodes, _, blocks) in enumerate(loader):
        if b == batches:
            break
        local = ds.features.index_select(0, input_nodes)
        x = shuffle_rows(local, blocks[0].shuffle_index, comm)
        checksum += float(x.double().sum())
        per_batch[PARTS[0]].append(_timed(comm, lambda: shuffle_rows(local, blocks[0].shuffle_index, comm), repeats))
        sizes.append([blk.num_src_nodes() for blk in blocks])

        plain = []
        for i in range(1, len(blocks)):
            index = blocks[i].shuffle_index
            h = torch.randn(index.num_local, HIDDEN, generator=gen, requires_grad=True)
            g = torch.randn(index.num_mixed, HIDDEN, generator=gen)

            def step(h=h, g=g, index=index):
                h.grad = None
                _Shuffle.apply(h, index, comm).backward(g)
            step()
            checksum += float(h.grad.double().sum())
            plain.append(_timed(comm, step, repeats))
        per_batch[PARTS[1]].append(tuple(map(sum, zip(*plain))))

        over = []
        for i in range(len(blocks) - 1):
            plan = blocks[i].overlap
            tag = f"{blocks[i + 1].shuffle_index.tag}/overlap"
            hi = torch.randn(plan.num_interior, HIDDEN, generator=gen, requires_grad=True)
            hb = torch.randn(plan.boundary_block.num_dst, HIDDEN, generator=gen, requires_grad=True)
            g = torch.randn(plan.num_mixed, HIDDEN, generator=gen)

            def step(hi=hi, hb=hb, g=g, plan=plan, tag=tag, i=i):
                hi.grad = hb.grad = None
                ex = AsyncRows(comm)
                token = _SendBoundary.apply(hb, plan, ex, tag, None, i)
                out = _Assemble.apply(token, hi, hb, plan, ex, tag)
                out.backward(g)
                return out
            out = step()
            checksum += sum(float(t.detach().double().sum()) for t in (out, hi.grad, hb.grad))
            over.append(_timed(comm, step, repeats))
        per_batch[PARTS[2]].append(tuple(map(sum, zip(*over))))
    return {"ms": {p: 1e3 * statistics.median(f for f, _ in v) for p, v in per_batch.items()},
            "ms_median_of_repeats": {p: 1e3 * statistics.median(m for _, m in v) for p, v in per_batch.items()},
            "checksum": checksum,
            "sources_per_layer": sizes}


def run_side(args) -> dict:
    owner = torch.load(args.owner)
    per_rank = gsplit.launch(side_rank, 2, args=((args.nodes, args.seed), owner, args.batches, args.repeats),
                             devices="cpu", backend="gloo", timeout=1800)
    return {"ranks": per_rank}


def main(argv=None):
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_sized("--nodes", quick=20_000, full=100_000, type=int,
                help="vertices of the synthetic graph (default 100k, quick 20k)")
    p.add_sized("--batches", quick=2, full=4, type=int, help="batches per side (default 4, quick 2)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline-repo", default="", help="another gsplit checkout: adds its side (e.g. /tmp/old)")
    p.add_argument("--owner", default="", help="(internal) the partition map's assignment, saved by the parent")
    p.add_argument("--json", default="", help="(internal, with --owner)")
    args = p.parse_args(argv)
    if args.owner:  # subprocess mode: one side
        report.write_json(args.json, run_side(args))
        return
    ds = setup.load_named("synthetic", args.nodes, args.seed)
    pmap, _, _ = setup.make_map(ds, 2, "edge", FANOUTS, BATCH, args.seed)
    stem = report.output_stem(args, "bench_shuffle_copies")
    with tempfile.TemporaryDirectory() as tmp:
        owner_path = Path(tmp) / "owner.pt"
        torch.save(pmap.assignment, owner_path)
        side_args = ["--owner", owner_path, "--nodes", args.nodes, "--batches", args.batches, "--repeats",
                     args.repeats, "--seed", args.seed]
        sides = {}
        if args.baseline_repo:
            sides["baseline"] = rounds.checkout_env(args.baseline_repo)
        sides["this checkout"] = rounds.checkout_env(setup.REPO)
        by_side = {s: [] for s in sides}
        for r, order in rounds.orders(list(sides), args.rounds, alternate_order=False):
            for s in order:
                by_side[s].append(rounds.run_json([sys.executable, __file__, *side_args], env=sides[s]))
                ms = by_side[s][-1]["ranks"][0]["ms"]
                print(f"round {r + 1}: {s}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items()), flush=True)
    results = {}
    for s, runs in by_side.items():
        results[s] = {"ms": {part: statistics.median(run["ranks"][0]["ms"][part] for run in runs) for part in PARTS},
                      "ms_rounds": [run["ranks"][0]["ms"] for run in runs],
                      "ms_median_of_repeats_rounds": [run["ranks"][0]["ms_median_of_repeats"] for run in runs],
                      "ranks_ms": [[rank["ms"] for rank in run["ranks"]] for run in runs],
                      "checksums": [[rank["checksum"] for rank in run["ranks"]] for run in runs],
                      "sources_per_layer_rank0": runs[-1]["ranks"][0]["sources_per_layer"]}
    names = list(results)
    rows = []
    for part in PARTS + ("total",):
        vals = [sum(results[s]["ms"].values()) if part == "total" else results[s]["ms"][part] for s in names]
        row = [part] + [round(v, 1) for v in vals]
        if "baseline" in results:
            row += [round(vals[0] - vals[-1], 1), round(vals[-1] / vals[0], 2)]
        rows.append(row)
    headers = ["rank 0, ms per iteration"] + names + (["saved", "ratio"] if "baseline" in results else [])
    print(report.format_table(headers, rows))
    for s in names:
        print(f"{s}: checksums per round and rank {results[s]['checksums']}")
    report.save_json(stem, {"config": {"nodes": args.nodes, "batches": args.batches, "repeats": args.repeats,
                                       "rounds": args.rounds, "hidden": HIDDEN, "fanouts": FANOUTS, "batch_size": BATCH,
                                       "baseline_repo": args.baseline_repo}, "results": results})


if __name__ == "__main__":
    main()
