"""The command line's arguments: the options several commands share, their parsing and checks, help texts.

Every check here runs before any data is loaded or any rank starts; a bad value is a :class:`CliError`
(one line on stderr, exit code 2).
"""

from __future__ import annotations

import argparse
import math
from typing import Dict, List, Optional

import torch


class CliError(Exception):
    """A user mistake the CLI reports in one line."""


def parse_fanouts(text: str) -> List[int]:
    try:
        fanouts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--fanouts {text!r} is not a comma-separated list of integers; e.g. --fanouts 15,10,5")
    if not fanouts:
        raise CliError("--fanouts is empty; pass one fanout per layer, e.g. --fanouts 15,10,5")
    bad = [f for f in fanouts if f < 1 and f != -1]
    if bad:
        raise CliError(f"--fanouts {text!r} holds {bad[0]}; each fanout must be >= 1 (or -1: all neighbours)")
    return fanouts


def layer_fanouts(fanouts: Optional[str], layers: Optional[int], full_graph: bool) -> str:
    """The ``--fanouts`` of ``gsplit train`` once ``--layers`` is applied: with ``--layers N`` one fanout is used for
    every layer, ``N`` fanouts as given, and full-graph training needs none (every in-edge); without it the fanouts
    (default ``15,10,5``) give the number of layers.

    Example:
        >>> layer_fanouts("5", 4, False), layer_fanouts(None, 3, True), layer_fanouts(None, None, False)
        ('5,5,5,5', '-1,-1,-1', '15,10,5')
    """
    if layers is None:
        return fanouts if fanouts is not None else "15,10,5"
    if layers < 1:
        raise CliError(f"--layers must be positive, got {layers}")
    if fanouts is None:
        if full_graph:
            return ",".join(["-1"] * layers)
        raise CliError(f"--layers {layers} needs --fanouts for mini-batch training: one fanout for every layer "
                       f"(e.g. --fanouts 5) or {layers} of them; or train the full graph (--full-graph)")
    values = parse_fanouts(fanouts)
    if len(values) == 1:
        return ",".join([str(values[0])] * layers)
    if len(values) != layers:
        raise CliError(f"--layers {layers} but --fanouts {fanouts!r} has {len(values)} values; give one fanout for "
                       f"all layers (e.g. --fanouts {values[0]}) or {layers} of them")
    return fanouts


def _parse_scalar(value: str) -> object:
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            continue
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def parse_dataset_options(pairs: List[str]) -> Dict[str, object]:
    """``-D key=value`` pairs, values parsed as int, float, bool, a list of numbers (``0.6,0.2,0.2``) or
    left as strings."""
    opts: Dict[str, object] = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise CliError(f"-D {pair!r} is not key=value; e.g. -D num_nodes=100000")
        key, value = pair.split("=", 1)
        parsed = _parse_scalar(value)
        if isinstance(parsed, str) and "," in value:
            items = [_parse_scalar(v.strip()) for v in value.split(",")]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
                parsed = items
        opts[key.strip().replace("-", "_")] = parsed
    return opts


def check_dataset_options(dataset: str, opts: Dict[str, object]) -> None:
    """Refuse ``-D`` options the dataset does not take, or whose value has the wrong type (before loading)."""
    from gsplit import datasets

    names = datasets.option_names(dataset)
    unknown = sorted(set(opts) - set(names))
    if unknown:
        raise CliError(f"-D {', '.join(unknown)}: not an option of dataset {dataset!r}; it accepts {', '.join(names)}")
    defaults = datasets.option_defaults(dataset)
    for key, value in opts.items():
        default = defaults.get(key)
        if isinstance(default, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif isinstance(default, int):
            ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif isinstance(default, float):
            ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        elif isinstance(default, (tuple, list)):
            ok, kind = isinstance(value, list), "a comma-separated list of numbers"
        else:
            continue
        if not ok:
            raise CliError(f"-D {key}={value if not isinstance(value, list) else ','.join(map(str, value))}: "
                           f"{key} takes {kind} (default {default}); e.g. -D {key}="
                           f"{','.join(map(str, default)) if isinstance(default, (tuple, list)) else default}")


def _add_dataset_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", default="synthetic",
                   help="synthetic (default), npz:PATH, edgelist:PATH, folder:PATH (gsplit prepare --dataset-out) "
                        "or ogbn-NAME")
    p.add_argument("-D", dest="dataset_opts", action="append", metavar="KEY=VALUE",
                   help="dataset option, repeatable (e.g. -D num_nodes=100000 -D avg_degree=20)")
    p.add_argument("--feature-dtype", choices=("float32", "bfloat16", "float16"),
                   help="store and move the input features in this dtype (bfloat16/float16: half the bytes per "
                        "row; the model upcasts them at its first layer); default: as the dataset holds them")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fanouts", default="15,10,5", help="neighbours per layer from the input up (default 15,10,5)")
    p.add_argument("--batch-size", type=int, default=1024, help="targets per rank per iteration (default 1024)")
    p.add_argument("--seed", type=int, default=0)


def _add_presample_args(p: argparse.ArgumentParser) -> None:
    from gsplit.partitioning.presample import PRESAMPLE_METHODS

    p.add_argument("--presample", default="expected", choices=PRESAMPLE_METHODS,
                   help="pre-sampling weights: expected (closed form, default) or sampled (run the sampler)")
    p.add_argument("--presample-epochs", type=int, default=10, help="epochs of --presample sampled (default 10)")


# Help for the options whose add_argument has none (kept apart so that the option lines stay short).
_HELP = {
    "seed": "seed of the model's initialisation, the global order of the targets and the sampler",
    "method": "partition method: gsplit (pre-sampled weights + METIS), node, edge or random",
    "model": "GNN model", "hidden": "hidden features per layer", "heads": "attention heads of GAT's hidden layers",
    "dropout": "dropout between layers (vertex-keyed: split training equals one process)",
    "epochs": "passes over the training vertices", "lr": "Adam learning rate",
    "system": "split (gsplit's split parallelism) or dp (the data-parallel baseline)",
    "device": "auto (this rank's GPU when there is one, else CPU), cpu or cuda",
    "partition": "partition folder (gsplit prepare --out)", "fanouts": "fanouts (default: the map's)",
    "num_batches": "mini-batches to measure", "batches": "mini-batches to time",
}


def _document_defaults(parser: argparse.ArgumentParser) -> None:
    """Give every option of every subcommand a help line that shows its default (argparse's %(default)s)."""
    parsers = [parser] + [a.choices[name] for a in parser._actions if isinstance(a, argparse._SubParsersAction)
                          for name in a.choices]
    for p in parsers:
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            if action.help is None:
                action.help = _HELP.get(action.dest)
            if action.help is None or action.help == argparse.SUPPRESS:
                continue
            if action.required:
                if "required" not in action.help:
                    action.help += " (required)"
            elif "default" not in action.help:
                default = action.default
                shown = "off" if default is False else ("none" if default is None else "%(default)s")
                action.help += f" (default: {shown})"


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is a :class:`CliError` (one line, exit 2) like every other user mistake."""

    def error(self, message):
        raise CliError(message)


def _positive(v) -> bool:
    return v >= 1


def _non_negative(v) -> bool:
    return v >= 0


def _finite_positive(v) -> bool:
    return math.isfinite(v) and v > 0


def _finite_non_negative(v) -> bool:
    return math.isfinite(v) and v >= 0


# Every numeric option, checked in this process before any data is loaded or any rank starts.
_NUMBER_RULES = {
    "batch_size": (_positive, "must be positive"),
    "num_parts": (_positive, "must be positive"),
    "presample_epochs": (_positive, "must be positive"),
    "hidden": (_positive, "must be positive"),
    "heads": (_positive, "must be positive"),
    "num_batches": (_positive, "must be positive"),
    "batches": (_positive, "must be positive"),
    "epochs": (_non_negative, "must be >= 0"),
    "num_ranks": (_positive, "must be >= 1 (leave it out for all GPUs, else 2 CPU ranks)"),
    "max_iters": (_non_negative, "must be >= 0 (0: whole epochs)"),
    "eval_every": (_non_negative, "must be >= 0 (0: no evaluation)"),
    "seed": (_non_negative, "must be >= 0"),
    "lr": (_finite_positive, "must be a positive finite number"),
    "dropout": (lambda v: 0 <= v < 1, "must be in [0, 1) (a probability of dropping; 1 would drop everything)"),
    "timeout": (_finite_positive, "must be a positive finite number of seconds"),
    "progress_timeout": (_finite_non_negative, "must be a finite number of seconds >= 0 (0 disables it)"),
    "checkpoint_every": (_non_negative, "must be >= 0 (0: at the end of every epoch)"),
    "ranks_per_host": (_non_negative, "must be >= 0 (0: one host)"),
}


def check_numbers(args) -> None:
    """Raise :class:`CliError` for the first numeric option outside its range (NaN included)."""
    for name, (ok, rule) in _NUMBER_RULES.items():
        value = getattr(args, name, None)
        if value is not None and not ok(value):
            raise CliError(f"--{name.replace('_', '-')} {rule}, got {value}")
    if isinstance(getattr(args, "fanouts", None), str):
        parse_fanouts(args.fanouts)
    if getattr(args, "resume", False) and not getattr(args, "checkpoint", None):
        raise CliError("--resume needs --checkpoint DIR: the folder to resume from")
    if getattr(args, "uva", False) and (args.device == "cpu" or not torch.cuda.is_available()):
        raise CliError("--uva samples a pinned host graph from the GPUs, but "
                       + ("--device is cpu" if args.device == "cpu" else "this machine has no CUDA GPU")
                       + "; leave --uva out")
    if getattr(args, "cache_size", None) is not None:
        from gsplit.data.feature_store import parse_size
        parse_size(args.cache_size, "--cache-size")


def _values_that_look_like_options(argv: List[str]) -> List[str]:
    """``--fanouts -1,5`` as ``--fanouts=-1,5``: argparse takes a value starting with ``-`` for an option
    unless it is a plain negative number, and -1 (all neighbours) is a documented fanout."""
    out: List[str] = []
    it = iter(argv)
    for a in it:
        if a == "--fanouts":
            value = next(it, None)
            if value is not None and value.startswith("-") and value[1:2].isdigit():
                out.append(f"--fanouts={value}")
                continue
            out.append(a)
            if value is not None:
                out.append(value)
            continue
        out.append(a)
    return out
