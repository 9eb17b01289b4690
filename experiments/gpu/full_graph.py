"""Full-graph training against torch-geometric's full-batch GraphSAGE (part ``full_graph``) and each rank's
share of the split plans timed on the device, fitted into a device profile (part ``shares``)."""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Optional

from harness import report, runs
from harness.rounds import Budget, median_ms
import torch

import gsplit

from gpu import HIDDEN


# ---------------------------------------------------------------------------------------- 8. full graph
def full_graph(nodes: int, dev: torch.device, sync, epochs: int, precision: str = "fp32") -> dict:
    """Part 8 (``precision="fp32"``) and ``full_graph_bf16`` (``"bf16"``: bfloat16 features, both models under
    bfloat16 autocast): ms per epoch and peak device memory of gsplit's full-graph system and PyG's GraphSAGE."""
    ds = gsplit.datasets.load("synthetic", num_nodes=nodes, feature_dim=128, seed=1,
                              feature_dtype="bfloat16" if precision == "bf16" else "float32")
    out = {"nodes": nodes, "edges": ds.graph.num_edges, "hidden": HIDDEN, "layers": 3, "precision": precision,
           "feature_dtype": str(ds.features.dtype).removeprefix("torch.")}
    for system in ("gsplit", "pyg"):
        try:
            out[system] = _timed_epochs(runs.full_graph_step(system, ds, dev, HIDDEN, precision=precision), epochs,
                                        sync, dev)
        except ImportError as exc:
            out[system] = {"status": f"not importable ({type(exc).__name__})"}
        except torch.cuda.OutOfMemoryError as exc:
            out[system] = {"status": f"out of memory: {str(exc)[:200]}"}
    if "ms_per_epoch" in out["pyg"]:
        import torch_geometric

        out["pyg"]["version"] = torch_geometric.__version__
    if "ms_per_epoch" in out["gsplit"] and "ms_per_epoch" in out["pyg"]:
        out["gsplit_over_pyg"] = out["gsplit"]["ms_per_epoch"] / out["pyg"]["ms_per_epoch"]
    return out


def _timed_epochs(step, epochs: int, sync, dev: torch.device) -> dict:
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    out = {"ms_per_epoch": median_ms(step, epochs, sync), "status": "ok"}  # the first epoch (the warm-up) builds
    if dev.type == "cuda":
        out["peak_device_GiB"] = torch.cuda.max_memory_allocated(dev) / 2**30
    return out

def sample_call_floor_s(kernels_part: Optional[dict]) -> Optional[float]:
    """Seconds of one sampled layer's kernels (sampling and relabelling) at the smallest size the kernels part timed:
    on a GPU what a layer costs whatever its size (2026-11-27, H100: 0.55 ms at 1,024 seeds, 0.66 ms at 65,536),
    which the shares, all of three layers, cannot tell from their per-row cost. ``None`` without that part.

    Example:
        >>> sample_call_floor_s({"per_seed_count": [{"seeds": 8192, "sample_ms": 0.3, "relabel_kernel_ms": 0.4},
        ...                                         {"seeds": 1024, "sample_ms": 0.2, "relabel_kernel_ms": 0.3}]})
        0.0005
    """
    rows = [r for r in (kernels_part or {}).get("per_seed_count", ()) if "sample_ms" in r]
    if not rows:
        return None
    row = min(rows, key=lambda r: r["seeds"])
    relabel = row["relabel_kernel_ms"] if "relabel_kernel_ms" in row else row["relabel_torch_ms"]  # CuPy's, else torch's
    return (row["sample_ms"] + relabel) * 1e-3


def shares(ds, dev: torch.device, iters: int, budget: Budget, out: str, kernels_part: Optional[dict] = None) -> dict:
    """Issue 34: each rank's share of the 1/2/4/8-rank split plans timed on this device; a fitted device profile
    (its per-layer sampling cost held at the kernels part's :func:`sample_call_floor_s` when that part ran)."""
    from gsplit.estimate import ModelShape
    from gsplit.estimate.calibrate import fit_device, time_shares, time_steps
    from gsplit.run.trainer import TrainConfig

    sampler = gsplit.NeighborSampler([15, 10, 5], seed=0)
    owners = {1: None, **{w: gsplit.partition(ds.graph, w, method="edge").assignment for w in (2, 4, 8)}}
    records, steps, shapes = {}, {}, {}
    for model in ("sage", "gat"):
        if budget.left() < 40:
            break
        shapes[model] = ModelShape(model, ds.feature_dim, 256, ds.num_classes, 3)
        records[model] = time_shares(ds, shapes[model], sampler, 1024, owners, iterations=1, device=str(dev),
                                     repeats=5, input_features="shuffle")
        cfg = TrainConfig(model=model, system="split", hidden=256, epochs=1, max_iters=max(iters, 3), eval_every=0,
                          final_eval=False, device=str(dev), overlap=False)
        steps[model] = time_steps(ds, cfg)
    call_s = sample_call_floor_s(kernels_part)
    profile, load, quality = fit_device(f"{torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}",
                                        records, shapes, steps, source=f"experiments/gpu_bench.py --parts shares on {dev}",
                                        sample_call_s=call_s)
    if dev.type == "cuda":  # for gsplit estimate's check that a rank's graph and batch fit the card
        profile.memory_bytes = torch.cuda.get_device_properties(dev).total_memory
    path = Path(out).with_name(Path(out).stem + "_profile.json")
    report.write_json(path, {"device": profile.to_dict(), "load": load, "fit_quality": quality, "steps": steps,
                             "shapes": {m: dataclasses.asdict(sh) for m, sh in shapes.items()},
                             "sample_call_s": call_s, "records": records})
    return {"profile_file": str(path), "load": load,
            "fit_median_error_pct": {k: round(v["median_pct"], 1) for k, v in quality.items()},
            "step_ms": {m: round(v["step_s"] * 1e3, 2) for m, v in steps.items()},
            "sample_ms_median": statistics.median(r["sample_s"] for rs in records.values() for r in rs) * 1e3}
