"""What an experiment reports: Markdown tables, one JSON with the command line, the machine and its load,
and figures.

Standard library at import time (torch and gsplit are asked for their versions inside :func:`machine_info`,
matplotlib loads with the first figure): the DGL peers write their JSON through :func:`write_json`, and the
GPU image need not have matplotlib for a script that draws nothing.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Tuple, Union

from . import LOAD_AT_START
from .setup import REPO


# ---------------------------------------------------------------------------------------- tables
def _fmt(v, floatfmt: str) -> str:
    if isinstance(v, float):
        return format(v, floatfmt)
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def format_table(headers: Sequence[str], rows: Sequence[Sequence], floatfmt: str = ".3g") -> str:
    """A Markdown pipe table (readable in a terminal, pasteable into a README).

    Example:
        >>> print(format_table(["graph", "ms"], [["cora", 1.5], ["bio", 12345]]))
        | graph |     ms |
        |------:|-------:|
        |  cora |    1.5 |
        |   bio | 12,345 |
    """
    cells = [[str(h) for h in headers]] + [[_fmt(v, floatfmt) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


# ---------------------------------------------------------------------------------------- the machine
def cpu_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def load_average() -> Optional[list]:
    """The host's 1/5/15-minute load averages now (other work sharing the cores), or None where unknown."""
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def machine_info() -> dict:
    """Where the numbers were measured: platform, versions, cores, threads, OpenMP's wait policy and the host's
    load averages when the experiment started and now."""
    import torch

    import gsplit

    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cores": cpu_cores(), "cuda": torch.cuda.is_available(), "gsplit": gsplit.__version__,
            "torch_threads_main": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "load_average_start": LOAD_AT_START, "load_average_end": load_average()}


def settings(args, leave_out: Iterable[str] = ("out",)) -> dict:
    """A script's parsed arguments for its JSON, less ``leave_out``."""
    return {k: v for k, v in vars(args).items() if k not in set(leave_out)}


# ---------------------------------------------------------------------------------------- JSON
def rel(path: Union[str, Path]) -> str:
    """``path`` relative to the working folder where it can be (for messages)."""
    try:
        return os.path.relpath(path, Path.cwd())
    except ValueError:
        return str(path)


def _jsonable(x):
    try:
        return float(x)  # numpy and torch scalars
    except (TypeError, ValueError):
        return str(x)


def write_json(path: Union[str, Path], doc, indent: Optional[int] = 1) -> Path:
    """Write ``doc`` as JSON to ``path`` (its folder made if absent); numbers of numpy or torch become floats,
    anything else JSON has no type for its ``str``. What a worker or a peer hands back to its parent."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent, default=_jsonable))
    return path


def read_json(path: Union[str, Path]):
    """The JSON in ``path``."""
    return json.loads(Path(path).read_text())


def output_stem(args, name: Optional[str] = None, suffix: str = "") -> Path:
    """Where a script's JSON (and PNG) go, without the extension, its folder made if absent.

    With ``--out`` a folder: ``OUT/NAME[_quick]SUFFIX`` (``name`` default ``--name``; quick runs never overwrite
    full results). With ``name=None`` and no ``--name``, ``--out`` names the file itself (a script built with
    ``make_parser(out_file=...)``): ``OUT`` less a ``.json`` ending, plus ``suffix``.
    """
    name = name if name is not None else getattr(args, "name", None)
    if name is None:
        out = str(args.out)
        stem = Path((out[:-len(".json")] if out.endswith(".json") else out) + suffix)
    else:
        stem = Path(args.out) / (f"{name}_quick{suffix}" if getattr(args, "quick", False) else f"{name}{suffix}")
    stem.parent.mkdir(parents=True, exist_ok=True)
    return stem


def save_json(stem: Union[str, Path], payload: dict, announce: bool = True) -> Path:
    """Write ``payload`` with the command line, the machine (and its load) and the time to ``stem.json``."""
    out = Path(str(stem) + ".json")
    doc = {"command": "python " + " ".join([os.path.relpath(sys.argv[0], REPO)] + sys.argv[1:]),
           "argv": sys.argv, "machine": machine_info(), "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **payload}
    write_json(out, doc)
    if announce:
        print(f"wrote {rel(out)}")
    return out


# ---------------------------------------------------------------------------------------- figures
def figure(ncols: int, nrows: int = 1, width: float = 4.2, height: float = 3.3):
    """A figure with ``nrows x ncols`` panels (always returned as a flat list)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: figures go straight to PNG files
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def save_figure(fig, stem: Union[str, Path]) -> Path:
    """``fig`` as ``stem.png``."""
    import matplotlib.pyplot as plt

    out = Path(str(stem) + ".png")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {rel(out)}")
    return out


def _finish(ax, ylabel: str, title: str) -> None:
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def _groups(ax, groups: Sequence[str]) -> None:
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=7, rotation=30, ha="right")


def bar_panel(ax, groups: Sequence[str], series: Dict[str, Sequence[float]], ylabel: str, title: str = "",
              log: bool = False) -> None:
    """Grouped bars: one group per entry of ``groups``, one bar per series."""
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    _groups(ax, groups)
    if log:
        ax.set_yscale("log")
    _finish(ax, ylabel, title)


def stacked_panel(ax, groups: Sequence[str], parts: Dict[str, Sequence[float]], ylabel: str, title: str = "") -> None:
    """Stacked bars: one bar per group, one stacked segment per entry of ``parts``."""
    bottom = [0.0] * len(groups)
    for name, values in parts.items():
        ax.bar(range(len(groups)), values, 0.6, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values)]
    _groups(ax, groups)
    _finish(ax, ylabel, title)


def line_panel(ax, curves: Dict[str, Tuple[Sequence[float], Sequence[float]]], xlabel: str, ylabel: str,
               title: str = "") -> None:
    """One line per curve ``name -> (xs, ys)``."""
    for name, (xs, ys) in curves.items():
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
    ax.set_xlabel(xlabel)
    _finish(ax, ylabel, title)
