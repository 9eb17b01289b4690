"""Issue 14's GPU measurements in one short command: kernels against plain torch, bandwidths, layers against
PyG, the feature cache, and ranks sharing one GPU. Writes JSON and prints one table per part.

    python experiments/gpu_bench.py --out experiments/results/gpu_bench.json            # on a GPU host
    python experiments/gpu_bench.py --device cpu --nodes 20000 --out /tmp/gpu_bench.json  # a dry run

Parts (each stops early when ``--budget`` seconds are spent; what did not run says so in the JSON):

1. ``bandwidth``: the device's copy bandwidth (device-to-device ``copy_``, bytes read + written) and the
   host-to-device bandwidth from pinned memory.
2. ``kernels``: on a uniform random graph of ``--nodes`` vertices (20 in-edges each), for 1,024 / 8,192 /
   65,536 seeds: one layer of sampling (fanout 15) and relabelling, gsplit's CUDA kernels (CuPy) against
   the plain-torch path on the same GPU (same results checked), in ms and sampled edges per second; the
   feature gather of 200,000 rows x 128 floats: gsplit's store from pinned host memory (``uva``) against a
   GPU-resident ``index_select`` and against torch's host gather + copy, in GB/s of rows delivered.
3. ``layers``: layer 0 of a 3-layer mini-batch of 8,192 seeds (fanouts 15,10,5), width 256: gsplit's
   ``SAGEConv`` (mean) and ``GATConv`` (4 heads) against torch-geometric's on the same block, forward +
   backward; the mean aggregation's achieved bandwidth (rows gathered + rows written, bytes per second).
4. ``cache``: ``train_rank`` (split, one rank) on the synthetic graph with the feature cache holding 0 %,
   50 % and 100 % of the features: hit rate and load time per iteration.
5. ``shared``: split and data parallel with 2 and 4 ranks sharing the one GPU over gloo (host staging):
   sample / load / forward-backward ms per iteration. NCCL needs one GPU per rank, so it is not exercised
   here beyond world size 1. The map is ``random`` (no METIS in the time a lease allows).
6. ``macrobatch`` (issue 33): ``train_rank`` on one GPU, no feature cache (every input row read from pinned
   host memory through UVA), split and dp with ``--macrobatches`` (default 1 and 16) mini-batches per
   macrobatch, ``--iters`` iterations: ms per iteration, input rows and host bytes read per iteration (split:
   the feature store's UVA bytes; dp: rows x row bytes of its host gather). For the issue's numbers run it on
   the 2M-vertex graph: ``--parts macrobatch --train-nodes 2000000 --iters 32``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gsplit  # noqa: E402
from gsplit.feature_store import FeatureStore  # noqa: E402
from gsplit.ops import cuda, torch_ops  # noqa: E402
from gsplit.sampling import counter_rng  # noqa: E402
from gpu_first_run import Budget, median_ms  # noqa: E402  (experiments/ is this script's folder)


def machine(dev: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "device": str(dev), "gsplit": gsplit.__version__}
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
        if shutil.which("nvidia-smi"):
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
            info["driver"] = out.splitlines()[0] if out else ""
        try:
            import cupy

            info["cupy"] = cupy.__version__
        except ImportError:
            info["cupy"] = None
    return info


def bandwidth(dev: torch.device, sync, repeats: int) -> dict:
    n = (1 << 28) if dev.type == "cuda" else (1 << 24)  # 1 GiB of floats on a GPU
    x = torch.ones(n, device=dev)
    y = torch.empty_like(x)
    out = {"bytes": 4 * n}
    out["copy_ms"] = median_ms(lambda: y.copy_(x), repeats, sync)
    out["copy_GBps_read_plus_written"] = 2 * 4 * n / out["copy_ms"] / 1e6
    if dev.type == "cuda":
        h = torch.ones(n, pin_memory=True)
        out["h2d_pinned_ms"] = median_ms(lambda: y.copy_(h, non_blocking=True), repeats, sync)
        out["h2d_pinned_GBps"] = 4 * n / out["h2d_pinned_ms"] / 1e6
    return out


def kernels(nodes: int, dev: torch.device, sync, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    host = gsplit.Graph.from_edges(torch.randint(0, nodes, (20 * nodes,), generator=gen),
                                   torch.randint(0, nodes, (20 * nodes,), generator=gen), nodes)
    graph = host.to(dev)
    key = counter_rng.stream_key(0, 0, 0, 0)
    on_gpu = dev.type == "cuda" and cuda.cupy_available()
    rows = []
    for count in (1024, 8192, 65536):
        seeds = torch.randperm(nodes, generator=gen)[:count].to(dev)
        ref = torch_ops.sample_neighbors_torch(graph, seeds, 15, False, key)
        row = {"seeds": count, "edges": int(ref[0].numel())}
        row["sample_torch_ms"] = median_ms(lambda: torch_ops.sample_neighbors_torch(graph, seeds, 15, False, key),
                                           repeats, sync)
        dst = torch.unique(seeds)
        row["relabel_torch_ms"] = median_ms(lambda: torch_ops.relabel(dst, ref[0]), repeats, sync)
        if on_gpu:
            got = cuda.sample_neighbors(graph, seeds, 15, False, key)
            row["sample_same"] = all(torch.equal(a, b) for a, b in zip(got, ref))
            row["sample_kernel_ms"] = median_ms(lambda: cuda.sample_neighbors(graph, seeds, 15, False, key),
                                                repeats, sync)
            a, b = cuda.relabel(dst, ref[0]), torch_ops.relabel(dst, ref[0])
            row["relabel_same"] = all(torch.equal(u, v) for u, v in zip(a, b))
            row["relabel_kernel_ms"] = median_ms(lambda: cuda.relabel(dst, ref[0]), repeats, sync)
        best = min(row.get("sample_kernel_ms", float("inf")), row["sample_torch_ms"])
        row["sampled_edges_per_s"] = row["edges"] / best * 1e3
        rows.append(row)
    feats = torch.randn(nodes, 128, generator=gen)
    ids = torch.randint(0, nodes, (200_000,), generator=gen)
    ids_dev = ids.to(dev)
    nbytes = ids.numel() * 128 * 4
    gather = {"rows": ids.numel(), "width": 128}
    store = FeatureStore(feats, device=dev, cache_size=0)
    gather["store_mode"] = store.mode
    gather["store_same"] = torch.equal(store.gather(ids_dev).cpu(), feats[ids])
    gather["store_ms"] = median_ms(lambda: store.gather(ids_dev), repeats, sync)
    gather["host_gather_copy_ms"] = median_ms(lambda: feats[ids].to(dev), repeats, sync)
    resident = feats.to(dev)
    gather["resident_index_select_ms"] = median_ms(lambda: resident.index_select(0, ids_dev), repeats, sync)
    for k in ("store", "host_gather_copy", "resident_index_select"):
        gather[f"{k}_GBps"] = nbytes / gather[f"{k}_ms"] / 1e6
    return {"nodes": nodes, "edges": host.num_edges, "cupy_kernels": on_gpu, "per_seed_count": rows,
            "gather": gather}


def layers(nodes: int, dev: torch.device, sync, repeats: int) -> dict:
    from gsplit.nn.layers import GATConv, SAGEConv
    from gsplit.ops import aggregate as agg

    gen = torch.Generator().manual_seed(1)
    graph = gsplit.Graph.from_edges(torch.randint(0, nodes, (20 * nodes,), generator=gen),
                                    torch.randint(0, nodes, (20 * nodes,), generator=gen), nodes).to(dev)
    seeds = torch.randperm(nodes, generator=gen)[:8192].to(dev)
    blocks = gsplit.NeighborSampler([15, 10, 5], seed=0).sample_blocks(graph, seeds)
    block = blocks[0]
    src, dst = block.edges()
    num_src, num_dst = block.num_src_nodes(), block.num_dst_nodes()
    width = 256
    h = torch.randn(num_src, width, device=dev, requires_grad=True)
    out = {"num_src": num_src, "num_dst": num_dst, "edges": int(src.numel()), "width": width}

    def fwd_bwd(fn):
        def run():
            h.grad = None
            fn().sum().backward()
        return median_ms(run, repeats, sync)

    mean_bytes = (src.numel() + num_dst) * width * 4
    out["copy_u_mean_fwd_ms"] = median_ms(lambda: agg.copy_u_mean(h.detach(), src, dst, num_dst), repeats, sync)
    out["copy_u_mean_GBps"] = mean_bytes / out["copy_u_mean_fwd_ms"] / 1e6
    torch.manual_seed(0)
    sage, gat = SAGEConv(width, width, "mean").to(dev), GATConv(width, width // 4, num_heads=4).to(dev)
    out["gsplit_sage_ms"] = fwd_bwd(lambda: sage(block, h))
    out["gsplit_gat_ms"] = fwd_bwd(lambda: gat(block, h))
    try:
        import torch_geometric.nn as pyg
    except ImportError as exc:
        out["pyg"] = f"not importable ({type(exc).__name__})"
        return out
    out["pyg"] = __import__("torch_geometric").__version__
    edge_index = torch.stack([src, dst])
    psage = pyg.SAGEConv((width, width), width, aggr="mean").to(dev)
    pgat = pyg.GATConv((width, width), width // 4, heads=4, add_self_loops=False).to(dev)
    size = (num_src, num_dst)
    out["pyg_sage_ms"] = fwd_bwd(lambda: psage((h, h[:num_dst]), edge_index, size=size))
    out["pyg_gat_ms"] = fwd_bwd(lambda: pgat((h, h[:num_dst]), edge_index, size=size))
    out["sage_gsplit_over_pyg"] = out["gsplit_sage_ms"] / out["pyg_sage_ms"]
    out["gat_gsplit_over_pyg"] = out["gsplit_gat_ms"] / out["pyg_gat_ms"]
    return out


def _per_iteration(epoch: dict) -> dict:
    iterations = max(1, min(r["iterations"] for r in epoch["ranks"]))
    row = {"iterations": iterations, "ms_per_iteration": 1e3 * epoch["epoch_s"] / iterations}
    for phase in ("sample_s", "load_s", "train_s"):
        row[phase.replace("_s", "_ms")] = 1e3 * epoch[phase] / iterations
    return row


def cache(ds, dev: torch.device, iters: int, budget: Budget) -> dict:
    from gsplit.trainer import TrainConfig, train_rank

    feature_bytes = ds.features.numel() * ds.features.element_size()
    rows = []
    for fraction in (0.0, 0.5, 1.0):
        if budget.left() < 20:
            rows.append({"fraction": fraction, "status": f"not run: {budget.left():.0f} s of the budget left"})
            continue
        cfg = TrainConfig(system="split", cache_size=str(int(fraction * feature_bytes)), epochs=1, max_iters=iters,
                          eval_every=0, device=str(dev), log_iterations=False, final_eval=False)
        epoch = train_rank(0, 1, cfg, ds, None)["epochs"][0]
        looked_up = epoch["cache_hits"] + epoch["cache_misses"]
        rows.append({"fraction": fraction, "cache_bytes": int(fraction * feature_bytes),
                     "hit_rate": epoch["cache_hits"] / looked_up if looked_up else None, **_per_iteration(epoch)})
    return {"feature_bytes": feature_bytes, "rows": rows}


def shared(ds, dev: torch.device, worlds, iters: int, budget: Budget) -> dict:
    from gsplit.trainer import TrainConfig, train_rank

    rows = []
    for world in worlds:
        owner = gsplit.partition(ds.graph, world, method="random").assignment
        for system in ("split", "dp"):
            if budget.left() < 30:
                rows.append({"world": world, "system": system, "status": f"not run: {budget.left():.0f} s left"})
                continue
            cfg = TrainConfig(system=system, epochs=1, max_iters=iters, eval_every=0, device=str(dev),
                              log_iterations=False, final_eval=False)
            t0 = time.monotonic()
            log = gsplit.launch(train_rank, world, args=(cfg, ds, owner), devices=[dev] * world, backend="gloo",
                                timeout=300, progress_timeout=120)[0]
            rows.append({"world": world, "system": system, "wall_s": time.monotonic() - t0,
                         **_per_iteration(log["epochs"][0])})
    return {"map": "random", "rows": rows}


def macrobatch(ds, dev: torch.device, sizes, iters: int, budget: Budget) -> dict:
    from gsplit.trainer import TrainConfig, train_rank

    row_bytes = ds.features.shape[1] * ds.features.element_size()
    rows = []
    for system in ("split", "dp"):
        for size in sizes:
            if budget.left() < 30:
                rows.append({"system": system, "macrobatch": size, "status": f"not run: {budget.left():.0f} s left"})
                continue
            cfg = TrainConfig(system=system, epochs=1, max_iters=iters, eval_every=0, device=str(dev),
                              macrobatch=size, final_eval=False)
            epoch = train_rank(0, 1, cfg, ds, None)["epochs"][0]
            its = epoch["ranks"][0]["per_iteration"]
            n = max(1, len(its))
            host = sum(it["host_bytes"] for it in its) if system == "split" else epoch["input_rows"] * row_bytes
            rows.append({"system": system, "macrobatch": size, **_per_iteration(epoch),
                         "input_rows_per_iteration": epoch["input_rows"] / n, "host_MB_per_iteration": host / n / 1e6,
                         "host_read": "UVA (feature store)" if system == "split" else "host gather + copy"})
    return {"row_bytes": row_bytes, "rows": rows}


def table(title: str, rows, keys) -> None:
    print(f"\n{title}")
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(f"{row[k]:.3g}" if isinstance(row.get(k), float) else str(row.get(k, "")) for k in keys))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--nodes", type=int, default=1_000_000, help="vertices of the kernel and layer graphs")
    p.add_argument("--train-nodes", type=int, default=0, help="vertices of the synthetic training graph "
                                                              "(default: --nodes)")
    p.add_argument("--iters", type=int, default=10, help="iterations per training run")
    p.add_argument("--worlds", default="2,4", help="ranks sharing the device")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--macrobatches", default="1,16", help="macrobatch sizes of the macrobatch part")
    p.add_argument("--parts", default="bandwidth,kernels,layers,cache,shared,macrobatch")
    p.add_argument("--budget", type=float, default=150.0, help="seconds for everything")
    p.add_argument("--out", default=str(ROOT / "experiments" / "results" / "gpu_bench.json"))
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    budget = Budget(args.budget)
    parts = [s for s in args.parts.split(",") if s]
    result = {"command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "machine": machine(dev), "parts": {}}

    def save():
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))

    ds = None
    for part in parts:
        if budget.left() < 10:
            result["parts"][part] = f"not run: {budget.left():.0f} s of the budget left"
            continue
        t0 = time.monotonic()
        try:
            if part == "bandwidth":
                got = bandwidth(dev, sync, args.repeats)
            elif part == "kernels":
                got = kernels(args.nodes, dev, sync, args.repeats)
            elif part == "layers":
                got = layers(args.nodes, dev, sync, args.repeats)
            elif part in ("cache", "shared", "macrobatch"):
                if ds is None:
                    ds = gsplit.datasets.load("synthetic", num_nodes=args.train_nodes or args.nodes, seed=0)
                if part == "cache":
                    got = cache(ds, dev, args.iters, budget)
                elif part == "shared":
                    got = shared(ds, dev, [int(w) for w in args.worlds.split(",")], args.iters, budget)
                else:
                    got = macrobatch(ds, dev, [int(b) for b in args.macrobatches.split(",")], args.iters, budget)
            else:
                raise SystemExit(f"unknown part {part!r}; parts are bandwidth, kernels, layers, cache, shared, "
                                 "macrobatch")
        except Exception as exc:  # noqa: BLE001 - one failed part must not hide the others' numbers
            got = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        got_seconds = time.monotonic() - t0
        result["parts"][part] = got if isinstance(got, dict) else {"value": got}
        result["parts"][part]["seconds"] = got_seconds
        save()
        print(f"{part}: {got_seconds:.1f} s", flush=True)
        if "error" in got:
            print(f"  FAILED {got['error']}", flush=True)
        elif part == "kernels":
            table("kernels (ms)", got["per_seed_count"], ["seeds", "edges", "sample_kernel_ms", "sample_torch_ms",
                                                          "relabel_kernel_ms", "relabel_torch_ms",
                                                          "sampled_edges_per_s"])
            print("gather", json.dumps(got["gather"]))
        elif part in ("cache", "shared", "macrobatch"):
            table(part, got["rows"], list(got["rows"][0].keys()))
        else:
            print(json.dumps(got))
    save()
    print(f"wrote {args.out}")
    return 1 if any(isinstance(v, dict) and "error" in v for v in result["parts"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
