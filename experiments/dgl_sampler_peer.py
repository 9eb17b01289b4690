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

import sys
import time

from harness import peer, rounds  # noqa: I001 - first: OpenMP's wait policy (as the gsplit side) and DGL's backend
import torch


def main(argv=None) -> int:
    p = peer.make_parser(__doc__.splitlines()[0], data_help="folder with indptr.npy, indices.npy and batches.npy",
                         json_help="write the timings here")
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
    t = time.perf_counter()
    g = peer.csc_graph(args.data)
    batches = peer.load(args.data, "batches").long()
    build_s = time.perf_counter() - t
    if batches.shape[0] <= args.warmup:
        raise SystemExit(f"batches.npy holds {batches.shape[0]} batches, no more than --warmup {args.warmup}; "
                         "write more batches or lower --warmup")
    fanouts = [int(x) for x in args.fanouts.split(",")]
    sampler = NeighborSampler(fanouts)

    def sample(i, seeds):
        input_nodes, _, blocks = sampler.sample_blocks(g, seeds)
        return blocks, input_nodes.numel()

    timings = rounds.time_batches(sample, batches, args.warmup)
    doc = {"sampler": "dgl", "dgl": dgl.__version__, "torch": torch.__version__, "threads": args.threads,
           "dgl_threads": dgl.utils.get_num_threads(), "fused": bool(sampler.fused and dgl.utils.get_num_threads() > 1),
           "num_nodes": g.num_nodes(), "num_edges": int(g.num_edges()), "graph_build_s": build_s, "fanouts": fanouts,
           "batch_size": int(batches.shape[1]), "warmup": args.warmup, **timings}
    peer.write_json(args.json, doc)
    print(f"dgl {dgl.__version__}: {doc['ms_per_batch']:.1f} ms/batch (median of {doc['num_batches']}), "
          f"{doc['edges_per_batch']:,.0f} edges, {args.threads} thread(s), fused={doc['fused']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
