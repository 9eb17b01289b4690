"""The shuffles and the overlapped assembly copy rows with ``index_select`` / ``index_copy_`` (or their compiled
CPU versions, :mod:`gsplit.ops.rows`) only.

On the CPU, advanced indexing (``x[idx]``: ``aten::index``; ``out[pos] = v`` and the accumulate it becomes
in backward: ``aten::_index_put_impl_``) is several times slower than ``index_select`` / ``index_copy_``,
and a ``torch.cat`` of a layer's own rows just to gather from them is a whole extra copy. A profiled split
step (two ranks, plain and overlapped layers) shows none of those three ops under the shuffle's and the
assembly's autograd functions (forward and backward) or in the feature shuffle, and a rank's own rows no
longer travel through the all-to-all to itself. Results are unchanged: tests/minibatch/test_split_parity.py and
tests/minibatch/test_overlap_minibatch.py check them.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import gsplit
from gsplit.comm.communicator import Communicator
from gsplit.comm.shuffle import shuffle_rows
from gsplit.launcher import launch
from gsplit.minibatch.loader import DataLoader
from gsplit.nn import build_model
from gsplit.nn.split import split_cross_entropy
from gsplit.sampling.block import ShuffleIndex

from test_split_parity import BATCH, DROPOUT, FANOUTS, FEAT_DIM, NUM_CLASSES, make_problem

SLOW_COPIES = {"aten::index", "aten::_index_put_impl_", "aten::index_put_", "aten::cat"}
"""Ops the row copies of a shuffle must not use (see the module docstring)."""
ROW_COPIES = {"aten::index_select", "aten::index_copy_", "gsplit::gather_rows", "gsplit::scatter_rows_"}
"""The ops they use: torch's, or the compiled copies on the CPU (:mod:`gsplit.ops.rows`)."""
ROW_PATH = ("_Shuffle", "_ShuffleBackward", "_SendBoundary", "_SendBoundaryBackward", "_Assemble",
            "_AssembleBackward", "feature shuffle")
"""The profiled regions of the shuffle path: its autograd functions and the loader's feature shuffle."""


def _region(event):
    """The shuffle-path region an op ran in (its nearest such ancestor), or None."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in ROW_PATH:
            return parent.name
        parent = parent.cpu_parent
    return None


def profiled_step(rank, world_size, overlap, model_name="sage"):
    """One split training step, the feature shuffle and the model's forward and backward under the profiler.

    Returns ``(ops, own)``: ``ops[region]`` counts the ops run in each shuffle-path region (``"(calls)"``: the
    region itself); ``own`` lists, for every blocking all-to-all of rows under a ``shuffle/`` tag, the rows
    this rank sent to itself through it.
    """
    graph, feats, labels, train_idx = make_problem()
    owner = torch.randint(0, world_size, (graph.num_nodes,), generator=torch.Generator().manual_seed(1))
    loader = DataLoader(graph, train_idx, gsplit.NeighborSampler(FANOUTS, seed=3), partition=owner, use_ddp=True,
                        batch_size=BATCH, shuffle=True, features=feats, labels=labels, overlap=overlap)
    comm = loader.comm
    own, plain = [], comm._all_to_all

    def all_to_all(x, send_counts, recv_counts, tag):
        if tag.startswith("shuffle/"):
            own.append(send_counts[comm.rank])
        return plain(x, send_counts, recv_counts, tag)

    comm._all_to_all = all_to_all  # this instance only (the loader's feature shuffle runs on it too)
    input_nodes, _, blocks = next(iter(loader))
    torch.manual_seed(0)
    model = build_model(model_name, FEAT_DIM, 8, NUM_CLASSES, num_layers=len(FANOUTS), heads=2,
                        dropout=DROPOUT).double()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("feature shuffle"):
            x = shuffle_rows(feats.index_select(0, input_nodes), blocks[0].shuffle_index, comm)
        logits = model(blocks, x)
        split_cross_entropy(logits, blocks[-1].dstdata["label"], blocks[-1]).backward()
    assert torch.equal(x, blocks[0].srcdata["feat"]), "the profiled feature shuffle gave other rows than the loader's"
    ops = collections.defaultdict(collections.Counter)
    for event in prof.events():
        region = _region(event)
        if region is not None:
            ops[region][event.name] += 1
        elif event.name in ROW_PATH:
            ops[event.name]["(calls)"] += 1
    return {k: dict(v) for k, v in ops.items()}, own


@pytest.mark.parametrize("overlap", [False, True])
def test_shuffle_path_copies_rows_without_advanced_indexing_or_cat(overlap):
    for rank, (ops, own) in enumerate(launch(profiled_step, 2, args=(overlap,))):
        # the profile did see the path it checks: the feature shuffle and the layers' exchanges
        expected = ({"_Assemble", "_AssembleBackward", "_SendBoundary", "_SendBoundaryBackward"} if overlap
                    else {"_Shuffle", "_ShuffleBackward"}) | {"feature shuffle"}
        assert expected <= set(ops), (rank, sorted(ops))
        slow = {region: {name: n for name, n in counts.items() if name in SLOW_COPIES}
                for region, counts in ops.items()}
        assert not any(slow.values()), f"rank {rank} copies rows with slow ops: {slow}"
        # each region copies its rows (the wait only waits); with two ranks each boundary row goes to one rank, so
        # the between-layer step writes the boundary rows in send order: the send copies nothing either way
        in_send_order = {"_SendBoundary", "_SendBoundaryBackward"}
        for region, counts in ops.items():
            if region in in_send_order:
                assert not ROW_COPIES & set(counts), (rank, region, counts)
            else:
                assert ROW_COPIES & set(counts), (rank, region, counts)
        # a rank's own rows are copied directly, never sent to itself through the all-to-all
        assert own and not any(own), (rank, own)


def test_one_rank_shuffle_is_a_direct_copy():
    """World size 1 (no process group): the plan's rows are copied with no collective and no slow op."""
    h = torch.arange(12.0).reshape(6, 2).requires_grad_()
    index = ShuffleIndex(send_idx=torch.tensor([4, 0, 5, 2]), send_counts=[4], recv_pos=torch.tensor([1, 3, 0, 2]),
                         recv_counts=[4], num_local=6, num_mixed=4)
    comm = Communicator()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = shuffle_rows(h.detach(), index, comm)
    assert not [e.name for e in prof.events() if e.name in SLOW_COPIES]
    expected = torch.empty(4, 2)
    expected[index.recv_pos] = h.detach()[index.send_idx]
    assert torch.equal(out, expected)
    assert comm.traffic.calls == {}


def test_assembly_fields_derived_from_keep_rows():
    """A plan made without the assembly fields (they are optional) gets them from ``keep_idx`` / ``keep_pos``:
    each interior row's one place, then the kept boundary rows in row order."""
    from gsplit.minibatch.overlap import _assembly
    from gsplit.sampling.block import Block, OverlapSplit, split_destinations

    block = Block(src_nodes=torch.arange(6), num_dst=4, edge_src=torch.tensor([4, 5, 4, 5]),
                  edge_dst=torch.tensor([0, 1, 2, 3]), edge_ids=torch.arange(4))
    interior, boundary = split_destinations(block, 2, 2)
    # rows 0, 1 interior; 2, 3 boundary (row 3 goes to rank 1; row 2 is read here too, at place 0)
    plan = OverlapSplit(interior_block=interior, boundary_block=boundary, send_idx=torch.tensor([1]),
                        send_counts=[0, 1], recv_pos=torch.tensor([3]), recv_counts=[0, 1],
                        keep_idx=torch.tensor([2, 1, 0]), keep_pos=torch.tensor([0, 2, 1]), num_mixed=4)
    full = _assembly(plan)
    assert full.interior_pos.tolist() == [1, 2]
    assert full.keep_boundary_idx.tolist() == [0] and full.keep_boundary_pos.tolist() == [0]
    assert _assembly(full) is full
