"""``gsplit bench``: time the sampler on a dataset."""

from __future__ import annotations

from gsplit.cli.common import _load_dataset
from gsplit.cli.options import _add_dataset_args, _add_sampling_args, parse_fanouts


def cmd_bench(args) -> int:
    import gsplit
    from gsplit.sampling.bench import time_sampler

    ds = _load_dataset(args)
    fanouts = parse_fanouts(args.fanouts)
    sampler = gsplit.NeighborSampler(fanouts, seed=args.seed)
    res = time_sampler(ds.graph, ds.train_idx, sampler, args.batch_size, args.batches)
    print(f"sampler: {res['ms_per_batch']:.1f} ms per batch of {args.batch_size} (median of {args.batches}), "
          f"{res['edges_per_s'] / 1e6:.2f} M sampled edges/s")
    return 0


def add_parser(sub) -> None:
    """``gsplit bench``'s options."""
    p = sub.add_parser("bench", help="time the sampler on a dataset")
    _add_dataset_args(p)
    _add_sampling_args(p)
    p.add_argument("--batches", type=int, default=20)
    p.set_defaults(func=cmd_bench)
