"""DGL peer of ``bench_layer_ops.py``: DGL 2.1's SAGE / GAT (``dgl_peer.py``'s models) on the SAME saved blocks.

Runs under ``.venv-dgl`` (never imports gsplit); ``bench_layer_ops.py --dgl-python ...`` calls it:

    .venv-dgl/bin/python experiments/dgl_layer_ops_peer.py --blocks B.npz --models sage,gat --json out.json
"""

from __future__ import annotations

from harness import peer  # noqa: I001 - first: it sets OpenMP's wait policy and DGL's backend before torch loads
import torch

from dgl_peer import GAT, SAGE  # same folder: the vs_dgl peer's models
from layer_ops_models import read_blocks, time_and_profile


def main(argv=None) -> None:
    p = peer.make_parser(__doc__.splitlines()[0], data_flag="--blocks",
                         data_help="the blocks file (.npz) bench_layer_ops.py wrote")
    p.add_argument("--models", default="sage,gat")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.5)
    args = p.parse_args(argv)
    import dgl

    torch.set_num_threads(args.threads)
    dgl.utils.set_num_threads(args.threads)
    data = read_blocks(args.blocks)
    batches = []
    for b in data["batches"]:
        blocks = [dgl.create_block((src, dst), num_src_nodes=ns, num_dst_nodes=nd) for src, dst, ns, nd in b["layers"]]
        batches.append({"blocks": blocks, "feat": b["feat"], "label": b["label"]})
    out = {"dgl": dgl.__version__}
    for name in args.models.split(","):
        torch.manual_seed(0)
        if name == "sage":
            model = SAGE(data["in_feats"], args.hidden, data["num_classes"], data["num_layers"], args.dropout)
        else:
            model = GAT(data["in_feats"], args.hidden, data["num_classes"], data["num_layers"], args.dropout, args.heads)
        out[name] = time_and_profile(model, batches, lambda m, b: m(b["blocks"], b["feat"]), args.repeats)
    peer.write_json(args.json, out)


if __name__ == "__main__":
    main()
