"""DGL peer of ``bench_layer_ops.py``: DGL 2.1's SAGE / GAT (``dgl_peer.py``'s models) on the SAME saved blocks.

Runs under ``.venv-dgl`` (never imports gsplit); ``bench_layer_ops.py --dgl-python ...`` calls it:

    .venv-dgl/bin/python experiments/dgl_layer_ops_peer.py --blocks B.npz --models sage,gat --json out.json
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("DGLBACKEND", "pytorch")

import torch  # noqa: E402

from dgl_peer import GAT, SAGE  # noqa: E402  (same folder: the vs_dgl peer's models)
from layer_ops_models import read_blocks, time_and_profile  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", required=True)
    p.add_argument("--models", default="sage,gat")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--json", required=True)
    args = p.parse_args()
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
    with open(args.json, "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
