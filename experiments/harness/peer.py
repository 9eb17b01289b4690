"""The DGL peers' side of the harness (``experiments/dgl_*.py``, run under ``.venv-dgl``: DGL 2.1, torch 2.2).

gsplit needs a newer torch than DGL 2.1 imports with, so a peer never imports gsplit, nor any module of the
harness that does: this module uses only the standard library, numpy, torch and DGL (DGL inside the
functions: importing it needs ``DGLBACKEND``, set here). The gsplit side writes the arrays
(:func:`harness.setup.export_arrays`) and runs the peer (:func:`harness.rounds.run_command` with
:func:`harness.rounds.peer_env`); the peer hands its timings back as JSON (:func:`write_json`).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Union

os.environ.setdefault("DGLBACKEND", "pytorch")  # else DGL's first import writes ~/.dgl/config.json and says so

from .memory import PeakRSS  # noqa: E402,F401  (re-exported: a peer's peak resident memory)
from .report import cpu_cores, read_json, write_json  # noqa: E402,F401  (re-exported: JSON files, core count)


def make_parser(description: str, *, data_help: str = "folder of the exported .npy arrays",
                json_help: str = "write the results here", data_flag: str = "--data") -> argparse.ArgumentParser:
    """The arguments every peer takes: ``--data`` (the arrays the gsplit side exported; ``data_flag`` names it
    otherwise) and ``--json`` (where the peer writes what it measured, :func:`write_json`)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(data_flag, required=True, help=data_help)
    p.add_argument("--json", required=True, help=json_help)
    return p


def load(folder: Union[str, Path], name: str):
    """The exported array ``folder/NAME.npy`` as a torch tensor."""
    import numpy as np
    import torch

    return torch.from_numpy(np.load(Path(folder) / f"{name}.npy"))


def csc_graph(folder: Union[str, Path]):
    """The DGL graph of the exported CSC arrays (``indptr``, ``indices``: the in-edge sources of vertex ``v`` are
    ``indices[indptr[v]:indptr[v+1]]``), every sparse format built once (as DGL's examples do with
    ``g.create_formats_()``), so that what is timed later is sampling or compute only."""
    import dgl
    import torch

    indptr, indices = load(folder, "indptr").long(), load(folder, "indices").long()
    n = indptr.numel() - 1
    g = dgl.graph((indices, torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])), num_nodes=n)
    g.create_formats_()
    return g
