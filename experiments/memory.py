"""Memory at scale: a model of host and GPU memory from gsplit's own data structures, checked by measurement.

The model (:func:`memory_model`) counts the bytes of what gsplit keeps, with the element sizes taken from
the library itself: ``Graph`` (int64 ``indptr`` [N+1] and ``indices`` [E]), ``Dataset`` (float32
features [N, F], int64 labels [N], int64 split ids), ``PartitionMap.assignment`` (the narrow integer
type, int8 up to 127 ranks: the one owner array per device), ``FeatureStore`` (int32 cache slot per
vertex when a cache is used), and the per-rank transients of loader construction (``_owned``: a bool
mask [N] and int64 ids [N / ranks]; the chunked NaN check: 64 MB). Ranks started by ``gsplit.launch``
receive the dataset in shared memory, so the graph, features, labels and owner map are held once per
host; the model's per-rank private memory is the process itself (python, torch, gsplit, its compiled
kernels, the communicator; measured, it is not a byte count) plus those transients.

The measurement trains ``--ranks`` CPU ranks through ``gsplit.run.trainer.train_rank`` (what ``gsplit train``
runs) on a synthetic graph of ``--nodes`` vertices with 128-d features, and records, while it runs,
every process's RSS and PSS (``/proc/PID/smaps_rollup`` through psutil; PSS splits shared pages among the
processes that map them, so the sum of PSS is the host's memory without double counting) and, at the end,
each rank's peak RSS (``getrusage``). A first run on a tiny graph measures the fixed cost of a rank
process. The table compares measured and predicted numbers; ``papers100m`` in the JSON is the model at
Papers100M scale (the README's "Memory at scale").

    python experiments/memory.py             # 4M vertices, 60M edges, 2 ranks (~7 min on 2 busy cores)
    python experiments/memory.py --quick     # 300k vertices
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Dict

from harness import memory, report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import psutil
import torch

import gsplit
from gsplit.partitioning.partition_map import PartitionMap
from gsplit.run.trainer import TrainConfig, train_rank

GB = 1e9
PAPERS100M = {"num_nodes": 111_059_956, "directed_edges": 1_615_685_872, "feature_dim": 128, "ranks": 8,
              "train": 1_207_179, "val": 125_265, "test": 214_338}
"""ogbn-papers100M's sizes (OGB); gsplit's loader stores the symmetric graph (both directions of each edge)."""


def element_sizes(ranks: int) -> Dict[str, int]:
    """Bytes per element of each structure, asked of gsplit itself (not assumed)."""
    g = gsplit.Graph.from_edges([0], [1])
    return {"graph": g.indices.element_size(), "feature": torch.empty(0, dtype=torch.float32).element_size(),
            "label": 8, "ids": 8,
            "owner": PartitionMap(torch.zeros(2, dtype=torch.int64), num_parts=ranks).assignment.element_size(),
            "cache_slot": 4}


def memory_model(num_nodes: int, num_edges: int, feature_dim: int, ranks: int, split_ids: int,
                 rank_process_bytes: float, batch_bytes: float = 0, saved_bytes: float = 0, cache_bytes: int = 0, uva: bool = False,
                 gpu: bool = True, extra_host_bytes: int = 0) -> Dict[str, Dict[str, float]]:
    """Bytes per host and per rank, by structure (see the module docstring for what each row is)."""
    s = element_sizes(ranks)
    n, e = num_nodes, num_edges
    graph = (n + 1) * s["graph"] + e * s["graph"]
    shared = {"graph (indptr + indices, int64)": graph, "features (float32)": n * feature_dim * s["feature"],
              "labels (int64)": n * s["label"], "train/val/test ids (int64)": split_ids * s["ids"],
              f"owner map (PartitionMap.assignment, {s['owner']} B)": n * s["owner"]}
    if extra_host_bytes:
        shared["other dataset tensors"] = extra_host_bytes
    transient = n * 1 + (n // ranks) * 8 + (64 << 20)  # FeatureStore._owned mask + ids; chunked NaN check
    rank_host = {"process (python, torch, gsplit, communicator; measured)": rank_process_bytes,
                 "loader construction transients (peak)": transient}
    batch = {"largest mini-batch (MiniBatch.tensors(), measured)": batch_bytes} if batch_bytes else {}
    if saved_bytes:
        batch["activations autograd saves for backward (saved_tensors_hooks, measured)"] = saved_bytes
    if not gpu:  # on a GPU rank the mini-batch lives on the GPU
        rank_host.update(batch)
    if cache_bytes:
        rank_host["cache ranking transients (in-degree float64, sort)"] = n * 8 + (n // ranks) * 16
    if gpu:  # loaders handed the GPU owner array keep a host copy to pick targets without a device sync
        rank_host["host owner copies of the two evaluation loaders"] = 2 * n * s["owner"]
    rank_gpu = {}
    if gpu:
        rank_gpu.update(batch)
        rank_gpu["graph copy (none with uva)"] = 0 if uva else graph
        rank_gpu["owner map, one array shared by the loaders"] = n * s["owner"]
        if cache_bytes:
            rank_gpu["feature cache"] = cache_bytes
            rank_gpu["cache slot per vertex (int32)"] = n * s["cache_slot"]
    host_total = sum(shared.values()) + ranks * sum(rank_host.values())
    return {"host_shared": shared, "rank_host": rank_host, "rank_gpu": rank_gpu,
            "totals": {"host_shared": sum(shared.values()), "rank_host": sum(rank_host.values()),
                       "host_total": host_total, "rank_gpu": sum(rank_gpu.values())}}


def papers100m(rank_process_bytes: float) -> dict:
    """The model at Papers100M scale, 8 ranks on one host, for the graph as gsplit loads it and the directed one."""
    p = PAPERS100M
    out = {}
    for name, edges in (("symmetric", 2 * p["directed_edges"]), ("directed", p["directed_edges"])):
        for uva in (False, True):
            out[f"{name}{'_uva' if uva else ''}"] = memory_model(
                p["num_nodes"], edges, p["feature_dim"], p["ranks"], p["train"] + p["val"] + p["test"],
                rank_process_bytes, uva=uva)
    n, e = p["num_nodes"], 2 * p["directed_edges"]
    graph = (n + 1 + e) * 8
    pow2 = lambda b: 1 << (int(b) - 1).bit_length()  # noqa: E731 - torch's pinned allocator rounds up
    out["launch_transient"] = {"features copied into shared memory by the launching process": n * p["feature_dim"] * 4}
    out["before_this_fix_per_rank"] = {
        "fingerprint: device graph copied back to host": graph,
        "NaN check: full-size bool temporary": n * p["feature_dim"],
        "use_uva: pinned copy of indptr + indices, rounded to powers of two": pow2((n + 1) * 8) + pow2(e * 8),
        "GPU: three int64 owner arrays": 3 * n * 8,
    }
    return out


# ---------------------------------------------------------------------------------------- measurement
def measured_rank(rank: int, world_size: int, cfg: TrainConfig, dataset, owner) -> dict:
    """Train, then report this rank's peak RSS (the kernel's own high-water mark), its pid and the bytes of
    the largest mini-batch its loader delivered (every tensor of the ``MiniBatch``, features and labels too)."""
    from gsplit.minibatch import loader as loader_module

    deliver, largest, saved, largest_saved = loader_module.DataLoader._deliver, [0], {}, [0]

    def counting_deliver(self, *args):  # (macrobatch, k) since macrobatches; (item) before
        batch = deliver(self, *args)
        largest[0] = max(largest[0], sum(t.numel() * t.element_size() for t in batch.tensors()))
        saved.clear()  # a new iteration: count its saved activations afresh
        in_batch.clear()
        in_batch.update(t.untyped_storage().data_ptr() for t in batch.tensors())
        return batch

    in_batch = set()

    def pack(t):  # every tensor autograd keeps for backward, once per storage, the batch's own left out
        if t.untyped_storage().data_ptr() not in in_batch:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            largest_saved[0] = max(largest_saved[0], sum(saved.values()))
        return t

    loader_module.DataLoader._deliver = counting_deliver
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        log = train_rank(rank, world_size, cfg, dataset, owner)
    uss_end = psutil.Process().memory_full_info().uss
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what of the private memory is only kept by the allocator
    return {"rank": rank, "pid": os.getpid(), "peak_rss": memory.vm_hwm(), "uss_end": uss_end,
            "uss_after_malloc_trim": psutil.Process().memory_full_info().uss,
            "batch_bytes": largest[0], "saved_bytes": largest_saved[0],
            "iterations": sum(e["ranks"][rank]["iterations"] for e in log["epochs"]) if rank == 0 else None}


def run(num_nodes: int, ranks: int, cfg: TrainConfig, seed: int) -> dict:
    t0 = time.perf_counter()
    parent_before = psutil.Process().memory_info().rss
    ds = setup.load_named("synthetic", num_nodes, seed, feature_dim=128)
    generate_s = time.perf_counter() - t0
    owner = gsplit.partition(ds.graph, ranks, method="random", seed=seed).assignment
    tensors = {"indptr": ds.graph.indptr, "indices": ds.graph.indices, "features": ds.features, "labels": ds.labels,
               "train": ds.train_idx, "val": ds.val_idx, "test": ds.test_idx, "owner": owner}
    if ds.communities is not None:
        tensors["communities"] = ds.communities
    nbytes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    parent_loaded = psutil.Process().memory_info().rss
    t1 = time.perf_counter()
    with memory.ProcessTree() as mon:
        results = gsplit.launch(measured_rank, ranks, args=(cfg, ds, owner), devices="cpu", backend="gloo", timeout=600)
    train_s = time.perf_counter() - t1
    pids = {r["pid"]: r["rank"] for r in results}
    per_rank = [{"rank": r["rank"], "peak_rss": r["peak_rss"], "batch_bytes": r["batch_bytes"],
                 "saved_bytes": r["saved_bytes"], "uss_end": r["uss_end"],
                 "uss_after_malloc_trim": r["uss_after_malloc_trim"], **{f"peak_{k}": mon.peak.get(r["pid"], {}).get(k, 0)
                                                                  for k in ("pss", "uss")}} for r in results]
    parent = {**{k: v for k, v in mon.root_peak().items() if k in ("rss", "pss", "uss")}, "parent": True}
    others = sum(v["pss"] for pid, v in mon.peak.items() if pid not in pids and not v["root"])
    return {"num_nodes": ds.graph.num_nodes, "num_edges": ds.graph.num_edges, "feature_dim": 128, "ranks": ranks,
            "generate_s": generate_s, "train_s": train_s, "iterations": results[0]["iterations"], "bytes": nbytes,
            "parent_rss_before_data": parent_before, "parent_rss_with_data": parent_loaded,
            "parent_peak": parent, "per_rank": per_rank, "other_children_peak_pss": others,
            "host_peak_pss": mon.peak_host_pss, "monitor_samples": mon.samples}


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0])
    p.add_sized("--nodes", quick=300_000, full=4_000_000, type=int,
                help="vertices of the measured graph (default 4M; 300k quick)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_sized("--iters", quick=5, full=20, type=int, help="training iterations (default 20; 5 quick)")
    args = p.parse_args(argv)
    nodes, iters = args.nodes, args.iters
    torch.set_num_threads(1)
    cfg = TrainConfig(fanouts=[15, 10, 5], batch_size=1024, epochs=1, max_iters=iters, eval_every=0, device="cpu",
                      log_iterations=False, seed=args.seed)
    print(f"baseline: {args.ranks} ranks on a 2,000-vertex graph (the fixed cost of a rank process)", flush=True)
    base = run(2000, args.ranks, cfg, args.seed)
    rank_process = max(r["peak_rss"] for r in base["per_rank"])
    print(f"measured: {args.ranks} ranks on {nodes:,} vertices, 128-d features, {iters} iterations", flush=True)
    big = run(nodes, args.ranks, cfg, args.seed)
    b = big["bytes"]
    split_ids = (b["train"] + b["val"] + b["test"]) // 8
    batch = max(r["batch_bytes"] for r in big["per_rank"])
    saved = max(r["saved_bytes"] for r in big["per_rank"])
    model = memory_model(big["num_nodes"], big["num_edges"], 128, args.ranks, split_ids, rank_process, batch_bytes=batch,
                         saved_bytes=saved, gpu=False, extra_host_bytes=b.get("communities", 0))
    shared = model["totals"]["host_shared"]
    parent_private = big["parent_rss_before_data"]  # the launching process without data: python, torch, gsplit
    # Two peaks: at launch the parent moves each tensor into shared memory by copying it (torch's
    # share_memory_), so for a moment the largest one (the features) is held twice; later the ranks train.
    largest = max(b.values())
    predicted_host = shared + parent_private + max(largest, args.ranks * model["totals"]["rank_host"])
    # a rank reads every feature (the NaN check) and the whole owner map; of the graph, what sampling touches
    rss_low = model["totals"]["rank_host"] + b["features"] + b["owner"]
    rss_high = rss_low + b["indptr"] + b["indices"] + b["labels"]
    rows = [["dataset + owner map in shared memory (byte count)", shared / GB, sum(b.values()) / GB]]
    for r in big["per_rank"]:
        rows.append([f"rank {r['rank']} peak RSS (VmHWM; incl. shared pages it read)",
                     f"{rss_low / GB:.2f}-{rss_high / GB:.2f}", r["peak_rss"] / GB])
        rows.append([f"rank {r['rank']} peak private (USS)", model["totals"]["rank_host"] / GB, r["peak_uss"] / GB])
        rows.append([f"rank {r['rank']} private at the end / after malloc_trim", None,
                     f"{r['uss_end'] / GB:.2f} / {r['uss_after_malloc_trim'] / GB:.2f}"])
    rows.append(["launching process, peak PSS (model: itself + data + the launch copy of the features)",
                 (parent_private + shared + largest) / GB, big["parent_peak"].get("pss", 0) / GB])
    rows.append(["launching process: RSS after making the data (before the launch)", (shared + parent_private) / GB,
                 big["parent_rss_with_data"] / GB])
    rows.append(["host: sum of PSS of every process (peak)", predicted_host / GB, big["host_peak_pss"] / GB])
    table = report.format_table(["quantity (GB)", "model", "measured"], rows, floatfmt=".2f")
    print(table)
    paper = papers100m(rank_process)  # its mini-batch working set is on the GPUs: not a host term
    print("\nPapers100M, 8 ranks, symmetric graph (as gsplit loads it), GB:")
    for section in ("host_shared", "rank_host", "rank_gpu"):
        for k, v in paper["symmetric"][section].items():
            print(f"  {section:11s} {k:60s} {v / GB:8.2f}")
    stem = report.output_stem(args, "memory")
    report.save_json(stem, {"baseline": base, "measured": big, "model_measured_graph": model,
                            "predicted_host_bytes": predicted_host, "predicted_rank_rss_bytes": [rss_low, rss_high],
                            "rank_process_bytes": rank_process, "papers100m": paper, "table": table})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
