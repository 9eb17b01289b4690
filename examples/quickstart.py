"""gsplit quick start: GraphSAGE trained split-parallel on a synthetic graph (2 CPU ranks, or one per GPU).

    python quickstart.py
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

import gsplit


def run(rank, ds, sampler, pmap):                             # runs in each rank's process, as with mp.spawn
    device = gsplit.current_device()
    loader = gsplit.DataLoader(ds.graph, ds.train_idx, sampler, partition=pmap, device=device, use_ddp=True,
                               batch_size=256, shuffle=True, features=ds.features, labels=ds.labels)
    test_loader = gsplit.DataLoader(ds.graph, ds.test_idx, sampler, partition=pmap, device=device, use_ddp=True,
                                    batch_size=1024, features=ds.features, labels=ds.labels)
    model = gsplit.nn.SAGE(ds.features.shape[1], 128, ds.num_classes, num_layers=3)  # or your DGL-style model
    model = gsplit.SplitParallel(model.to(device), loader)    # rank 0's weights, shuffles, gradient sync
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(5):
        model.train()
        total_loss = 0.0
        for input_nodes, output_nodes, blocks in loader:
            logits = model(blocks, blocks[0].srcdata["feat"])
            loss = F.cross_entropy(logits, blocks[-1].dstdata["label"])   # this rank's targets
            opt.zero_grad()
            loss.backward()
            opt.step()
            total_loss += model.global_loss(loss)                # the whole mini-batch's mean loss
        acc = accuracy(model, test_loader, device)
        if rank == 0:
            print(f"epoch {epoch}  loss {total_loss / len(loader):.4f}  test accuracy {acc:.3f}", flush=True)


def accuracy(model, loader, device):
    model.eval()
    counts = torch.zeros(2, device=device)                    # correct, seen: summed over ranks below
    with torch.no_grad():
        for _, _, blocks in loader:
            pred = model(blocks, blocks[0].srcdata["feat"]).argmax(1)
            y = blocks[-1].dstdata["label"]
            counts[0] += (pred == y).sum()
            counts[1] += y.numel()
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


if __name__ == "__main__":                                    # offline work, once (not in every rank)
    nprocs = torch.cuda.device_count() or 2
    ds = gsplit.datasets.load("synthetic", num_nodes=20_000, seed=0)   # or "npz:cora.npz", "ogbn-products", ...
    sampler = gsplit.NeighborSampler([10, 10, 5])                      # fanouts, input layer first (as DGL)
    weights = gsplit.presample(ds.graph, ds.train_idx, sampler, batch_size=nprocs * 256, epochs=3)
    pmap = gsplit.partition(ds.graph, num_parts=nprocs, method="gsplit", weights=weights)
    # pmap.save("parts/synthetic-2") keeps it for later runs: gsplit.PartitionMap.load("parts/synthetic-2")
    gsplit.launch(run, nprocs=nprocs, args=(ds, sampler, pmap))        # NCCL on GPUs, gloo on CPUs
