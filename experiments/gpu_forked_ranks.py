"""Forked GPU ranks: two ranks sharing one GPU train the same split-parallel steps when spawned and when forked
from gsplit's fork server; the forked ranks must give the spawned ones' losses.

A CUDA driver initialised before ``fork`` is unusable in the child ("Cannot re-initialize CUDA in forked
subprocess"), so forked GPU ranks work only if nothing in the parent touched CUDA first. The test suite checks
that on the CPU (``tests/launcher/test_launch.py``); this script checks it on a GPU host, where it matters::

    python experiments/gpu_forked_ranks.py                 # a GPU host: both ranks on cuda:0, over gloo
    python experiments/gpu_forked_ranks.py --device cpu    # anywhere (CPU ranks)

It writes ``experiments/results/gpu_forked_ranks.json`` and prints one row per start method.
"""

from __future__ import annotations

import sys
import time

from harness import report, setup  # noqa: I001 - first: it sets OpenMP's wait policy before torch loads
import torch
import torch.nn.functional as F

sys.path.insert(0, str(setup.REPO))  # this checkout's gsplit on a host where it is not installed
import gsplit  # noqa: E402


def run(rank, world_size, ds, sampler, pmap, steps):
    """One rank: ``steps`` split-parallel iterations from seeded weights; returns the global losses."""
    device = gsplit.current_device()
    loader = gsplit.DataLoader(ds.graph, ds.train_idx, sampler, partition=pmap, device=device, use_ddp=True,
                               batch_size=256, shuffle=False, features=ds.features, labels=ds.labels)
    torch.manual_seed(0)
    model = gsplit.nn.SAGE(ds.features.shape[1], 32, ds.num_classes, num_layers=len(sampler.fanouts))
    model = gsplit.SplitParallel(model.to(device), loader)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for step, (_, _, blocks) in enumerate(loader):
        if step == steps:
            break
        logits = model(blocks, blocks[0].srcdata["feat"])
        loss = F.cross_entropy(logits, blocks[-1].dstdata["label"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(model.global_loss(loss)))
    return {"device": str(device), "losses": losses, "cuda_initialized_in_rank": torch.cuda.is_initialized()}


def main(argv=None) -> int:
    p = setup.make_parser(__doc__.splitlines()[0], out_file=setup.RESULTS / "gpu_forked_ranks.json", seed=False)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    ds = gsplit.datasets.load("synthetic", num_nodes=5_000, seed=0)
    sampler = gsplit.NeighborSampler([10, 5])
    pmap = gsplit.partition(ds.graph, num_parts=2, method="random", seed=0)
    devices = [args.device + (":0" if args.device == "cuda" else "")] * 2
    rows = {}
    for method in ("spawn", "forkserver"):  # gsplit's start methods (a bare fork is not one)
        t0 = time.monotonic()
        try:
            got = gsplit.launch(run, 2, args=(ds, sampler, pmap, args.steps), backend="gloo", devices=devices,
                                start_method=method, timeout=120)
            rows[method] = {"seconds": time.monotonic() - t0, "ranks": got}
        except Exception as exc:  # noqa: BLE001 - one start method failing must not hide the others
            rows[method] = {"seconds": time.monotonic() - t0, "error": f"{type(exc).__name__}: {str(exc)[:800]}"}
    ref = rows["spawn"].get("ranks", [{}])[0].get("losses")
    for method, row in rows.items():
        losses = row.get("ranks", [{}])[0].get("losses")
        row["same_losses_as_spawn"] = bool(ref) and losses is not None and \
            all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(losses, ref)) and len(losses) == len(ref)
    result = {"device": args.device, "cuda_initialized_in_parent": torch.cuda.is_initialized(), "rows": rows}
    report.save_json(report.output_stem(args), result)
    print(f"{'start':<11} {'seconds':>8}  same losses as spawn  device / error")
    for method, row in rows.items():
        what = row["ranks"][0]["device"] + "  " + " ".join(f"{x:.4f}" for x in row["ranks"][0]["losses"]) \
            if "ranks" in row else row["error"]
        print(f"{method:<11} {row['seconds']:8.1f}  {str(row['same_losses_as_spawn']):<20}  {what}")
    return 0 if all(r["same_losses_as_spawn"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
