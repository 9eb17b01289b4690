"""What several commands do alike: load the dataset, build the kernels, check an output folder, print a
map's split statistics, and (``eval``, ``predict``) load a trained model and run layer-wise inference."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gsplit.cli.options import CliError, check_dataset_options, parse_dataset_options


def _load_dataset(args):
    from gsplit import datasets

    opts = parse_dataset_options(args.dataset_opts)
    check_dataset_options(args.dataset, opts)
    print(f"loading dataset {args.dataset} {opts if opts else ''}".rstrip(), flush=True)
    t = time.perf_counter()
    ds = datasets.load(args.dataset, feature_dtype=getattr(args, "feature_dtype", None), **opts)
    print(f"  {ds.describe()} ({time.perf_counter() - t:.1f}s)", flush=True)
    return ds


def _say(message: str) -> None:
    print(message, flush=True)


def _print_stats(stats: dict) -> None:
    print(f"{'layer':>6} {'cross-split edges':>18} {'edge imbalance':>15} {'vertex imbalance':>17}")
    for layer, (cross, imb, vimb) in enumerate(zip(stats["cross_edge_fraction"], stats["edge_imbalance"],
                                                   stats["vertex_imbalance"])):
        print(f"{layer:>6} {cross:>18.3f} {imb:>15.3f} {vimb:>17.3f}")
    print(f"input-feature imbalance {stats['input_imbalance']:.3f}")


def check_output_folder(path: str, option: str) -> Path:
    """Check, before the work that fills it, that files can be written in folder ``path``.

    A folder that has to be created for the check is removed again, so that a run stopped before its
    output (a later check, too little memory) leaves nothing behind; the writers create it themselves.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CliError(f"{option} {p} is a file, not a folder; pass a folder path (it is created if absent)")
    created = [d for d in [p, *p.parents] if not d.exists()]  # deepest first
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".write-test.{os.getpid()}.tmp"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise CliError(f"cannot write into {option} {p} ({e.strerror or e}); pass a folder on a writable file "
                       f"system") from None
    finally:
        for d in created:
            with contextlib.suppress(OSError):
                d.rmdir()
    return p


def _print_full_graph_stats(stats) -> None:
    """Per rank: vertices, in-edges, halo rows (received per layer), rows sent per layer; cut and balance."""
    print(f"{'rank':>5} {'vertices':>10} {'in-edges':>11} {'halo rows':>10} {'sent rows':>10}")
    for r in range(stats.num_parts):
        print(f"{r:>5} {stats.vertices[r]:>10} {stats.in_edges[r]:>11} {stats.halo_rows[r]:>10} {stats.sent_rows[r]:>10}")
    print(f"cut edges {stats.cut_edges} of {stats.num_edges} ({stats.cut_fraction:.3f}); imbalance (max/mean): "
          f"vertices {stats.vertex_imbalance:.3f}, in-edges {stats.edge_imbalance:.3f}, halo {stats.halo_imbalance:.3f}")


def default_num_ranks() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def _prepare_kernels() -> None:
    """Build or load the compiled CPU kernels now, before any timed work, and say how it went, once."""
    from gsplit import ops
    from gsplit.ops import aggregate, cpu_ext, sample_cpu

    if os.environ.get("GSPLIT_NO_EXTENSIONS"):
        return
    kernels = ((sample_cpu.NAME, sample_cpu.SOURCES), (aggregate._EXT_NAME, aggregate._EXT_SOURCES))
    if not all(cpu_ext.is_built(name, sources) for name, sources in kernels):  # a cached load says only its line
        print(f"preparing the compiled CPU kernels (the first build takes {cpu_ext.BUILD_TIME}, then they are "
              "cached) ...", flush=True)
    report = ops.prepare_kernels()
    if report.ready:
        state = "built" if report.seconds > 3 else "loaded from the cache"
        print(f"  compiled CPU kernels {', '.join(report.ready)} {state} in {report.seconds:.1f}s", flush=True)
    for name, reason in report.failed.items():
        print(f"gsplit: warning: compiled CPU kernel {name} is unavailable ({reason}); running the plain-torch "
              f"kernels instead (same results, slower)", file=sys.stderr, flush=True)
    if report.failed:  # the ranks (spawned: they inherit the environment) neither retry nor warn again
        os.environ["GSPLIT_SKIP_EXTENSIONS"] = ",".join(report.failed)


def _read_ids(path: str, num_nodes: int, dataset=None) -> torch.Tensor:
    """The vertex indices ``--ids FILE`` names. With ``dataset`` its ids are the dataset's source ids
    (:meth:`gsplit.datasets.Dataset.vertices`: an edge list's own ids); a boolean mask is one entry per vertex."""
    from gsplit.data.graph import as_vertex_ids
    from gsplit.runtime.io import load_npy

    if not Path(path).is_file():
        raise CliError(f"--ids {path}: no such file")
    if path.endswith(".npy"):
        arr = load_npy(Path(path), "pass a .npy of vertex ids or a boolean mask")
    else:
        try:
            arr = np.loadtxt(path, dtype=np.int64, ndmin=1)
        except ValueError as e:
            raise CliError(f"--ids {path}: not one integer vertex id a line ({e})") from e
    ids = torch.from_numpy(np.asarray(arr))
    if dataset is not None and ids.dtype != torch.bool:
        return dataset.vertices(ids, f"--ids {path}")
    return as_vertex_ids(ids, num_nodes, f"--ids {path}")


def _model_and_dataset(args, mf=None):
    """The model file (``mf`` when the caller has read it already: it is read and its digest checked once) and
    the dataset it is scored on."""
    from gsplit import datasets
    from gsplit.run.model_io import describe, load_model
    from gsplit.run.predict import check_model_fits

    if mf is None:
        mf = load_model(args.checkpoint, trust=args.trust_model)
    if mf.train_config.get("task") == "link":  # its outputs are embeddings, not class scores
        raise CliError(f"{args.checkpoint} holds a link prediction model (gsplit train --task link), whose outputs "
                       "are vertex embeddings; gsplit eval scores its held-out edges (MRR / Hits@K)")
    print(f"model {args.checkpoint}: {describe(mf)}", flush=True)
    if args.dataset is not None:
        ds = _load_dataset(args)
    else:
        if args.dataset_opts:
            raise CliError("-D needs --dataset (without it the dataset and options come from model.pt)")
        spec = mf.dataset
        if not spec.get("name"):
            raise CliError(f"{args.checkpoint} does not say which dataset it was trained on; pass --dataset")
        print(f"loading dataset {spec['name']} {spec.get('options') or ''} (from model.pt)".rstrip(), flush=True)
        ds = datasets.load(spec["name"], **spec.get("options", {}))
    check_model_fits(mf.spec, ds, warn=False)  # before the kernels are prepared (evaluate_model warns)
    return mf, ds


def _run_inference(args, ds, id_sets, predict_ids=None):
    from gsplit.run.predict import evaluate_model

    ranks = args.num_ranks or default_num_ranks()
    _prepare_kernels()
    print(f"layer-wise inference on {ranks} rank(s)", flush=True)
    path = args.checkpoint if not Path(args.checkpoint).is_dir() else str(Path(args.checkpoint) / "model.pt")
    return evaluate_model(path, ds, id_sets, predict_ids, num_ranks=ranks, device=args.device,
                          batch_size=args.batch_size, trust=args.trust_model)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """The trained model and the dataset of ``eval`` and ``predict``."""
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="the --checkpoint folder of a finished gsplit train run (its model.pt) or a model file")
    p.add_argument("--dataset", default=None,
                   help="dataset to run on (default: the one model.pt was trained on, with its -D options)")
    p.add_argument("-D", dest="dataset_opts", action="append", metavar="KEY=VALUE",
                   help="dataset option with --dataset, repeatable")
    p.add_argument("--trust-model", action="store_true",
                   help="load a model file whose digest is missing, of an older gsplit (weights only) or does not "
                        "match (a file you edited yourself); its description is still checked")


def _add_inference_args(p: argparse.ArgumentParser) -> None:
    """How ``eval`` and ``predict`` run the layers."""
    p.add_argument("--num-ranks", type=int, default=None,
                   help="ranks that split the inference (default: all GPUs, else 2 CPU processes)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where the layers run")
    p.add_argument("--batch-size", type=int, default=4096, help="vertices per rank per inference chunk")
