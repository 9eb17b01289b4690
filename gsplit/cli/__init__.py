"""``gsplit prepare | train | stats | bench | estimate | eval | predict | plot``: the command line.

One module per command (:mod:`gsplit.cli.prepare`, :mod:`~gsplit.cli.train`, ...), each with the options
it reads (its ``add_parser``) and what it runs; the options several commands share are
:mod:`gsplit.cli.options`, the steps they share :mod:`gsplit.cli.common`. This module builds the parser
from them and runs the command :func:`main` is given.

The CLI is the only part that prints; the library logs. Bad arguments end with one line on stderr and
exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import List, Optional

import torch

from gsplit.cli import bench, estimate, evaluate, plot, predict, prepare, stats, train
from gsplit.cli.options import CliError, _document_defaults, _Parser, _values_that_look_like_options, check_numbers
from gsplit.runtime.io import file_error_line
from gsplit.launcher import LaunchInterrupted

log = logging.getLogger("gsplit.cli")


def _version_text() -> str:
    import gsplit

    return f"gsplit {gsplit.__version__} (torch {torch.__version__}, python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gsplit", description="split-parallel GNN training")
    parser.add_argument("-v", "--verbose", action="store_true", help="log library messages")
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", required=True)

    for command in (prepare, train, stats, bench, estimate, evaluate, predict, plot):  # as gsplit --help lists them
        command.add_parser(sub)
    _document_defaults(parser)
    return parser


def _stop_on_signal(signum, frame):
    from gsplit.launcher import LaunchInterrupted as Stop

    raise Stop(signum)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    argv = _values_that_look_like_options(list(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except CliError as e:
        print(f"gsplit: error: {e} (see gsplit --help)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    previous = {}
    if _in_main_thread():  # SIGTERM/SIGHUP anywhere (loading, METIS, a save) exit 128 + signal, cleanly
        for s in (getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)):
            previous[s] = signal.signal(s, _stop_on_signal)
    try:
        check_numbers(args)
        _check_environment()
        return args.func(args)
    except (CliError, ValueError, FileNotFoundError, ImportError) as e:
        print(f"gsplit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gsplit: interrupted", file=sys.stderr)
        return 130
    except LaunchInterrupted as e:  # SIGTERM / SIGHUP: the ranks are already stopped
        print(f"gsplit: {e}", file=sys.stderr)
        return e.code
    except (RuntimeError, FloatingPointError, OSError) as e:  # LaunchError and friends name the failing rank
        # a full disk or a vanished folder, here or in a rank: one line with the file and the fix, no traceback
        print(f"gsplit: error: {file_error_line(e) or e}", file=sys.stderr)
        return 1
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _check_environment() -> None:
    """Environment variables the ranks read, checked here, before any rank starts (a bad one would otherwise be
    one rank's traceback after the launch)."""
    from gsplit.comm import shm

    shm.requested()  # GSPLIT_CPU_TRANSPORT: gloo or shm


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
