"""The rates the floors divide by (parts ``bandwidth``, ``kernels``) and one layer against torch-geometric's
(``layers``)."""
from __future__ import annotations

import time

from harness.rounds import median_ms
import torch

import gsplit
from gsplit.data.feature_store import FeatureStore
from gsplit.ops import cuda, sample_cuda, torch_ops
from gsplit.ops import counter_rng

from gpu import HIDDEN


# ---------------------------------------------------------------------------------------- 4-6. rates
def bandwidth(dev: torch.device, sync, repeats: int, quick: bool) -> dict:
    n = (1 << 28) if dev.type == "cuda" and not quick else (1 << 22)
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


def kernels(ds, dev: torch.device, sync, repeats: int, quick: bool) -> dict:
    """Sampling, relabelling and the feature gather on the benchmark graph; the rates the floors use."""
    gen = torch.Generator().manual_seed(0)
    nodes = ds.graph.num_nodes
    graph = ds.graph.to(dev)
    pinned = ds.graph.pin_memory() if dev.type == "cuda" else None
    uva = pinned is not None and sample_cuda.graph_readable(pinned, dev)
    key = counter_rng.stream_key(0, 0, 0, 0)
    on_gpu = dev.type == "cuda" and cuda.cupy_available()
    rows = []
    for count in ((256, 1024, 4096) if quick else (1024, 8192, 65536)):
        seeds = torch.randperm(nodes, generator=gen)[:count].to(dev)
        ref = torch_ops.sample_neighbors_torch(graph, seeds, 15, False, key)
        row = {"seeds": count, "edges": int(ref[0].numel())}
        row["sample_torch_ms"] = median_ms(lambda: torch_ops.sample_neighbors_torch(graph, seeds, 15, False, key),
                                           repeats, sync)
        row["sample_ms"] = median_ms(lambda: gsplit.ops.sample_neighbors(graph, seeds, 15, False, key), repeats, sync)
        dst = torch.unique(seeds)
        row["relabel_torch_ms"] = median_ms(lambda: torch_ops.relabel(dst, ref[0]), repeats, sync)
        if on_gpu:
            got = sample_cuda.sample_neighbors(graph, seeds, 15, False, key)
            row["sample_same"] = all(torch.equal(a, b) for a, b in zip(got, ref))
            a, b = cuda.relabel(dst, ref[0]), torch_ops.relabel(dst, ref[0])
            row["relabel_same"] = all(torch.equal(u, v) for u, v in zip(a, b))
            row["relabel_kernel_ms"] = median_ms(lambda: cuda.relabel(dst, ref[0]), repeats, sync)
            if uva:
                row["sample_uva_same"] = all(torch.equal(u, v) for u, v in
                                             zip(sample_cuda.sample_neighbors(pinned, seeds, 15, False, key), got))
                row["sample_uva_ms"] = median_ms(lambda: sample_cuda.sample_neighbors(pinned, seeds, 15, False, key),
                                                 repeats, sync)
        row["sampled_edges_per_s"] = row["edges"] / row["sample_ms"] * 1e3
        if "sample_uva_ms" in row:
            row["sampled_edges_per_s_uva"] = row["edges"] / row["sample_uva_ms"] * 1e3
        rows.append(row)
    feats = ds.features
    ids = torch.randint(0, nodes, (20_000 if quick else 200_000,), generator=gen)
    ids_dev = ids.to(dev)
    nbytes = ids.numel() * feats.shape[1] * feats.element_size()
    gather = {"rows": ids.numel(), "width": feats.shape[1]}
    t0 = time.monotonic()
    store = FeatureStore(feats, device=dev, cache_size=0)
    gather["store_setup_s"] = time.monotonic() - t0
    gather["store_mode"] = store.mode
    gather["store_same"] = torch.equal(store.gather(ids_dev).cpu(), feats[ids])
    gather["store_ms"] = median_ms(lambda: store.gather(ids_dev), repeats, sync)
    gather["host_gather_copy_ms"] = median_ms(lambda: feats[ids].to(dev), repeats, sync)
    resident = feats.to(dev)
    gather["resident_index_select_ms"] = median_ms(lambda: resident.index_select(0, ids_dev), repeats, sync)
    for k in ("store", "host_gather_copy", "resident_index_select"):
        gather[f"{k}_GBps"] = nbytes / gather[f"{k}_ms"] / 1e6
    best = rows[-1]  # the most seeds: the rate a large frontier reaches
    rates = {"sample_edges_per_s": best["sampled_edges_per_s"],
             "sample_edges_per_s_uva": best.get("sampled_edges_per_s_uva", best["sampled_edges_per_s"]),
             "gather_Bps": gather["store_GBps"] * 1e9}
    return {"nodes": nodes, "edges": ds.graph.num_edges, "cupy_kernels": on_gpu, "per_seed_count": rows,
            "gather": gather, "rates": rates}


def layers(ds, dev: torch.device, sync, repeats: int, quick: bool) -> dict:
    from gsplit.nn.layers import GATConv, SAGEConv
    from gsplit.ops import aggregate as agg

    gen = torch.Generator().manual_seed(1)
    graph = ds.graph.to(dev)
    seeds = torch.randperm(graph.num_nodes, generator=gen)[:64 if quick else 8192].to(dev)
    block = gsplit.NeighborSampler([15, 10, 5], seed=0).sample_blocks(graph, seeds)[0]
    src, dst = block.edges()
    num_src, num_dst = block.num_src_nodes(), block.num_dst_nodes()
    width = HIDDEN
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
