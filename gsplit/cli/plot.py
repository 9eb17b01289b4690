"""``gsplit plot``: draw a run log's loss, accuracy and per-epoch time breakdown to a PNG."""

from __future__ import annotations

from pathlib import Path

from gsplit.cli.options import CliError
from gsplit.runtime.io import check_writable


def cmd_plot(args) -> int:
    from gsplit.run.plot import plot_run

    src = Path(args.log)
    if not src.is_file():
        raise CliError(f"{args.log}: no such run log (write one with gsplit train --log FILE)")
    out = Path(args.out) if args.out else src.with_suffix(".png")
    check_writable(out, "--out file", replace=True)
    panels = plot_run(src, out)
    print(f"{', '.join(panels)} of {src} drawn to {out}")
    return 0


def add_parser(sub) -> None:
    """``gsplit plot``'s options."""
    p = sub.add_parser("plot", help="draw a run log's loss, accuracy and per-epoch time breakdown to a PNG")
    p.add_argument("log", help="the run log of gsplit train --log")
    p.add_argument("--out", default=None, help="PNG file (default: the log's path with .png)")
    p.set_defaults(func=cmd_plot)
