"""DGL's multi-GPU GraphSAGE example, ported to gsplit's split parallelism.

Adapted from DGL's ``examples/multigpu/node_classification_sage.py`` (Apache-2.0). The model class is
DGL's, unchanged: ``dglnn`` is ``gsplit.nn`` here, whose ``SAGEConv(in, out, "mean")`` has DGL's
signature and runs on gsplit's blocks. ``gsplit.SplitParallel`` takes the place of
``DistributedDataParallel`` (same start on every rank, gradient sync) and also inserts the shuffle
before every layer above the first; the loss is DGL's plain ``F.cross_entropy``.

What differs from DGL's script besides: the graph, features, labels and partition map are gsplit
objects passed to ``gsplit.DataLoader`` (DGL keeps them in ``g.ndata``); the partition map is computed
once, offline, in ``__main__``; ``gsplit.launch`` starts the ranks and sets up the process group
(``mp.spawn`` + ``init_process_group`` in DGL); the test accuracy comes from mini-batch evaluation
(DGL's ``model.module.inference`` is layer-wise full-graph inference).

    python dgl_port.py --dataset_name synthetic --num_epochs 3     # 2 CPU ranks, or one per GPU
"""

import argparse
import time

import gsplit
import gsplit.nn as dglnn

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from gsplit import DataLoader, NeighborSampler


class SAGE(nn.Module):
    def __init__(self, in_size, hid_size, out_size):
        super().__init__()
        self.layers = nn.ModuleList()
        # three-layer GraphSAGE-mean
        self.layers.append(dglnn.SAGEConv(in_size, hid_size, "mean"))
        self.layers.append(dglnn.SAGEConv(hid_size, hid_size, "mean"))
        self.layers.append(dglnn.SAGEConv(hid_size, out_size, "mean"))
        self.dropout = nn.Dropout(0.5)
        self.hid_size = hid_size
        self.out_size = out_size

    def forward(self, blocks, x):
        h = x
        for l, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if l != len(self.layers) - 1:
                h = F.relu(h)
                h = self.dropout(h)
        return h


def evaluate(model, dataloader, device):
    """Accuracy over every rank's targets (each rank predicts the targets it owns)."""
    model.eval()
    counts = torch.zeros(2, device=device)  # correct, seen
    with torch.no_grad():
        for _, _, blocks in dataloader:
            y_hat = model(blocks, blocks[0].srcdata["feat"])
            y = blocks[-1].dstdata["label"]
            counts[0] += (y_hat.argmax(1) == y).sum()
            counts[1] += y.numel()
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def make_loader(ds, idx, sampler, pmap, device, shuffle):
    return DataLoader(ds.graph, idx, sampler, partition=pmap, device=device, batch_size=1024, shuffle=shuffle,
                      drop_last=False, use_ddp=True, features=ds.features, labels=ds.labels)


def train(proc_id, device, ds, pmap, model, num_epochs):
    sampler = NeighborSampler([10, 10, 10])
    train_dataloader = make_loader(ds, ds.train_idx, sampler, pmap, device, shuffle=True)
    val_dataloader = make_loader(ds, ds.val_idx, sampler, pmap, device, shuffle=False)
    opt = torch.optim.Adam(model.parameters(), lr=0.001, weight_decay=5e-4)
    for epoch in range(num_epochs):
        t0 = time.time()
        model.train()
        total_loss = 0
        for it, (_, _, blocks) in enumerate(train_dataloader):
            x = blocks[0].srcdata["feat"]
            y = blocks[-1].dstdata["label"]
            y_hat = model(blocks, x)
            loss = F.cross_entropy(y_hat, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += model.global_loss(loss)
        acc = evaluate(model, val_dataloader, device)
        t1 = time.time()
        if proc_id == 0:
            print(f"Epoch {epoch:05d} | Loss {total_loss / (it + 1):.4f} | Accuracy {acc:.4f} | "
                  f"Time {t1 - t0:.4f}", flush=True)
    return sampler


def run(proc_id, ds, pmap, num_epochs):
    device = gsplit.current_device()  # gsplit.launch made the process group and picked the rank's device
    num_classes, in_size = ds.num_classes, ds.features.shape[1]
    model = SAGE(in_size, 256, num_classes).to(device)
    model = gsplit.SplitParallel(
        model, device_ids=[device], output_device=device
    )
    sampler = train(proc_id, device, ds, pmap, model, num_epochs)
    acc = evaluate(model, make_loader(ds, ds.test_idx, sampler, pmap, device, shuffle=False), device)
    if proc_id == 0:
        print(f"Test accuracy {acc:.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nprocs", type=int, default=torch.cuda.device_count() or 2,
                        help="ranks: one per GPU (default: all GPUs), else CPU processes over gloo")
    parser.add_argument("--num_epochs", type=int, default=20)
    parser.add_argument("--dataset_name", default="synthetic",
                        help="synthetic, ogbn-products (pip install 'gsplit[ogb]'), npz:PATH, ...")
    args = parser.parse_args()
    print(f"Training with {args.nprocs} rank(s)")
    ds = gsplit.datasets.load(args.dataset_name)
    # offline, once per dataset and world size: which rank owns which vertex
    weights = gsplit.presample(ds.graph, ds.train_idx, NeighborSampler([10, 10, 10]),
                               batch_size=args.nprocs * 1024, epochs=3)
    pmap = gsplit.partition(ds.graph, num_parts=args.nprocs, method="gsplit", weights=weights)
    gsplit.launch(run, nprocs=args.nprocs, args=(ds, pmap, args.num_epochs))
