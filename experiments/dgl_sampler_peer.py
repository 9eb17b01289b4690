"""DGL peer of gsplit's sampler benchmark: time ``dgl.dataloading.NeighborSampler.sample_blocks`` per batch.

Runs under ``.venv-dgl`` (``./dev dgl-env``; never imports gsplit). ``experiments/vs_dgl_sampler.py``
calls it with a folder holding ``indptr.npy`` and ``indices.npy`` (CSC: the in-edge sources of vertex
``v`` are ``indices[indptr[v]:indptr[v+1]]``) and ``batches.npy`` (int64 ``[num_batches, batch_size]``,
the seed vertices of each mini-batch, the same ones gsplit's sampler is timed on):

    .venv-dgl/bin/python experiments/dgl_sampler_peer.py --data DIR --warmup 2 --threads 2 --json out.json

Every sparse format of the graph is built before timing (as DGL's examples do with
``g.create_formats_()``), so the timed calls are sampling and block construction only. Both torch's
and DGL's own OpenMP pool get ``--threads`` threads; with more than one, DGL 2.1 uses its fused
CPU sampler (``sample_neighbors_fused``), with one the per-layer ``sample_neighbors`` + ``to_block``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the gsplit side (experiments/common.py)
os.environ.setdefault("DGLBACKEND", "pytorch")

import numpy as np  # noqa: E402
import torch  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="folder with indptr.npy, indices.npy and batches.npy")
    p.add_argument("--json", required=True, help="write the timings here")
    p.add_argument("--fanouts", default="15,10,5", help="neighbours per layer from the input up")
    p.add_argument("--warmup", type=int, default=2, help="leading batches that are run but not timed")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import dgl
    from dgl.dataloading import NeighborSampler

    torch.set_num_threads(args.threads)
    dgl.utils.set_num_threads(args.threads)
    dgl.seed(args.seed)
    folder = Path(args.data)
    t = time.perf_counter()
    indptr = torch.from_numpy(np.load(folder / "indptr.npy")).long()
    indices = torch.from_numpy(np.load(folder / "indices.npy")).long()
    batches = torch.from_numpy(np.load(folder / "batches.npy")).long()
    n = indptr.numel() - 1
    dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    g = dgl.graph((indices, dst), num_nodes=n)
    del dst
    g.create_formats_()
    build_s = time.perf_counter() - t
    if batches.shape[0] <= args.warmup:
        raise SystemExit(f"batches.npy holds {batches.shape[0]} batches, no more than --warmup {args.warmup}; "
                         "write more batches or lower --warmup")
    fanouts = [int(x) for x in args.fanouts.split(",")]
    sampler = NeighborSampler(fanouts)
    times, edges, inputs = [], [], []
    for i, seeds in enumerate(batches):
        t0 = time.perf_counter()
        input_nodes, _, blocks = sampler.sample_blocks(g, seeds)
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(dt)
            edges.append(sum(int(b.num_edges()) for b in blocks))
            inputs.append(int(input_nodes.numel()))
    med = statistics.median(times)
    doc = {"sampler": "dgl", "dgl": dgl.__version__, "torch": torch.__version__, "threads": args.threads,
           "dgl_threads": dgl.utils.get_num_threads(), "fused": bool(sampler.fused and dgl.utils.get_num_threads() > 1),
           "num_nodes": n, "num_edges": int(g.num_edges()), "graph_build_s": build_s, "fanouts": fanouts,
           "batch_size": int(batches.shape[1]), "num_batches": len(times), "warmup": args.warmup,
           "ms_per_batch": 1e3 * med, "ms_mean": 1e3 * statistics.fmean(times), "ms_min": 1e3 * min(times),
           "edges_per_batch": statistics.fmean(edges), "input_nodes_per_batch": statistics.fmean(inputs),
           "ms_all": [1e3 * x for x in times]}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=1))
    print(f"dgl {dgl.__version__}: {doc['ms_per_batch']:.1f} ms/batch (median of {len(times)}), "
          f"{doc['edges_per_batch']:,.0f} edges, {args.threads} thread(s), fused={doc['fused']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
