"""Plain-torch kernels for sampling and relabelling: the reference every other implementation matches.

They run on whatever device their inputs are on (CPU or CUDA). :mod:`gsplit.ops` dispatches to them, or
to the CUDA kernels in :mod:`gsplit.ops.cuda` where those apply.
"""

from __future__ import annotations

from typing import Optional, TYPE_CHECKING, Tuple

import torch

from gsplit.ops import counter_rng

if TYPE_CHECKING:  # annotations only: the graph imports these kernels to pin itself
    from gsplit.data.graph import Graph

def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t.to(device)`` without making the host wait: a host tensor bound for a GPU is pinned first and copied
    asynchronously (a copy from pageable memory blocks the host until the device's queue has drained).

    Example:
        >>> to_device(torch.tensor([1, 2]), torch.device("cpu")).tolist()
        [1, 2]
    """
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _segment_arange(counts: torch.Tensor, total: Optional[int] = None) -> torch.Tensor:
    """``cat([arange(c) for c in counts])`` without a Python loop; ``total = counts.sum()`` when known."""
    total = int(counts.sum()) if total is None else int(total)
    if total == 0:
        return torch.zeros(0, dtype=torch.int64, device=counts.device)
    starts = torch.cumsum(counts, 0) - counts
    return torch.arange(total, device=counts.device) - torch.repeat_interleave(starts, counts, output_size=total)


def relabel(dst_nodes: torch.Tensor, src: torch.Tensor, num_nodes: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Local numbering for a block: ``src_nodes = dst_nodes ++ sorted(new ids in src)``.

    Returns ``(src_nodes, src_local)`` where ``src_nodes[src_local] == src``. ``dst_nodes`` must be unique.
    Given ``num_nodes`` (the graph's), a batch that is large against the graph is relabelled with
    dense per-vertex tables in O(num_nodes) instead of a sort in O(n log n); the result is the same.

    Example:
        >>> relabel(torch.tensor([9, 4]), torch.tensor([4, 7, 1]))[0].tolist()
        [9, 4, 1, 7]
    """
    if _dense_pays_off(dst_nodes.numel() + src.numel(), num_nodes):
        return _relabel_dense(dst_nodes, src, num_nodes)
    nd = dst_nodes.numel()
    uniq, inv = torch.unique(torch.cat([dst_nodes, src]), return_inverse=True)  # the one host sync: its size
    is_dst = torch.zeros(uniq.numel(), dtype=torch.int8, device=uniq.device)
    is_dst[inv[:nd]] = 1
    # dst_nodes are unique, so uniq.numel() - nd ids are new; a stable sort puts their positions first, in
    # order, without the size read of a boolean mask
    new_pos = torch.sort(is_dst, stable=True).indices[: uniq.numel() - nd]
    new_nodes = uniq[new_pos]
    pos = torch.empty(uniq.numel(), dtype=torch.int64, device=uniq.device)
    pos[inv[:nd]] = torch.arange(nd, device=uniq.device)
    pos[new_pos] = torch.arange(nd, nd + new_nodes.numel(), device=uniq.device)
    return torch.cat([dst_nodes, new_nodes]), pos[inv[nd:]]


# Dense relabelling costs ~9 bytes and a scan per graph vertex; worth it when the batch is not tiny
# against the graph (measured: 5-20x faster than torch.unique for 1M ids on a 1M-vertex graph).
_DENSE_RELABEL_FACTOR = 16
_DENSE_RELABEL_SLACK = 1 << 22


def _dense_pays_off(num_ids: int, num_nodes: Optional[int]) -> bool:
    return num_nodes is not None and num_nodes <= _DENSE_RELABEL_FACTOR * num_ids + _DENSE_RELABEL_SLACK


def unique_ids(ids: torch.Tensor, num_nodes: Optional[int] = None) -> torch.Tensor:
    """Sorted distinct values of ``ids`` (like ``torch.unique``), by an O(num_nodes) mask when that is cheaper.

    Example:
        >>> unique_ids(torch.tensor([5, 1, 5, 3]), num_nodes=8).tolist()
        [1, 3, 5]
    """
    if not _dense_pays_off(ids.numel(), num_nodes):
        return torch.unique(ids)
    seen = torch.zeros(num_nodes, dtype=torch.bool, device=ids.device)
    seen[ids] = True
    return seen.nonzero().squeeze(1)


def _relabel_dense(dst_nodes: torch.Tensor, src: torch.Tensor, num_nodes: int) -> Tuple[torch.Tensor, torch.Tensor]:
    dev = src.device
    nd = dst_nodes.numel()
    is_new = torch.zeros(num_nodes, dtype=torch.bool, device=dev)
    is_new[src] = True
    is_new[dst_nodes] = False
    new_nodes = is_new.nonzero().squeeze(1)  # sorted, like torch.unique
    local = torch.empty(num_nodes, dtype=torch.int64, device=dev)
    local[dst_nodes] = torch.arange(nd, device=dev)
    local[new_nodes] = torch.arange(nd, nd + new_nodes.numel(), device=dev)
    return torch.cat([dst_nodes, new_nodes]), local[src]


def sample_neighbors_torch(graph: Graph, nodes: torch.Tensor, fanout: int, replace: bool, key: int
                           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The torch sampler for one layer, given its stream key (``counter_rng.stream_key(seed, epoch, iteration, layer)``).

    The reference that ``kernels/sample.cu`` reproduces; ``graph`` and ``nodes`` on one device.

    Example:
        >>> from gsplit.data.graph import Graph
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> sample_neighbors_torch(g, torch.tensor([0]), 1, False, counter_rng.stream_key(0, 0, 0, 0))[1].tolist()
        [0]
    """
    nodes = nodes.to(torch.int64)
    k = int(fanout)
    start = graph.indptr[nodes]
    deg = graph.indptr[nodes + 1] - start
    dev = nodes.device
    if k == -1:
        counts = deg
        total = int(counts.sum())  # the one host sync: the output size
        dst_index = torch.repeat_interleave(torch.arange(nodes.numel(), device=dev), counts, output_size=total)
        eids = start[dst_index] + _segment_arange(counts, total)
        return graph.indices[eids], dst_index, eids

    n = nodes.numel()
    pos = _pick_positions(nodes, deg, k, replace, key)
    valid = pos >= 0  # a prefix of every row
    counts = valid.sum(1)
    eids = torch.masked_select(start[:, None] + pos, valid)  # the one host sync: the output size
    dst_index = torch.repeat_interleave(torch.arange(n, device=dev), counts, output_size=eids.numel())
    return torch.index_select(graph.indices, 0, eids), dst_index, eids


def _pick_positions(nodes: torch.Tensor, deg: torch.Tensor, k: int, replace: bool, key: int) -> torch.Tensor:
    """``[n, k]`` positions (within each vertex's in-edges, sorted) of the picks of ``nodes``, ``-1`` past a row's
    picks (a prefix of every row is valid); ``deg`` their in-degrees."""
    vkeys = counter_rng.vertex_keys(key, nodes)
    n, dev = nodes.numel(), nodes.device
    cols = torch.arange(k, device=dev)
    if replace:
        picks = counter_rng.draws_below(vkeys, k, deg.clamp_min(1)[:, None].expand(n, k))
        pos = torch.where(deg[:, None] > 0, torch.sort(picks, 1).values, -1)
    else:
        # Floyd's algorithm: a uniform k-subset of [0, d) in k draws, no rejection loop. It runs on every
        # row, also those with deg <= k (overwritten below): one pass over [n, k] tensors beats
        # selecting rows with boolean masks.
        bound = (deg[:, None] - k + 1 + cols[None, :]).clamp_min(1)  # draw i is uniform in [0, j + 1)
        chosen = counter_rng.draws_below(vkeys, k, bound)
        for i in range(1, k):
            taken = (chosen[:, :i] == chosen[:, i:i + 1]).any(1)
            chosen[:, i] = torch.where(taken, bound[:, i] - 1, chosen[:, i])
        everything = torch.where(cols[None, :] < deg[:, None], cols[None, :], -1)
        pos = torch.where((deg <= k)[:, None], everything, torch.sort(chosen, 1).values)
    return pos


# ---------------------------------------------------------------------------------------- sizes on the device
# The *padded* ops below never read a size: each output is a buffer whose length the host knows in advance
# (a bound), its first ``count`` entries (a 0-d device tensor) the result, the rest unspecified. Split sampling
# on a GPU chains them layer after layer and reads every count once at the end (gsplit.split.deferred).

def sample_neighbors_padded(graph: Graph, nodes: torch.Tensor, num_valid: torch.Tensor, fanout: int, replace: bool,
                            key: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sample_neighbors_torch` of ``nodes[:num_valid]`` without a host read: ``(src, dst_index, edge_ids,
    count, bad)``, buffers of ``nodes.numel() * fanout`` entries whose first ``count`` are the edges the plain
    sampler returns; ``bad`` (0-d) is 1 when a valid node is no vertex of the graph. ``fanout`` > 0.

    Example:
        >>> from gsplit.data.graph import Graph
        >>> g = Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> src, dst, eids, count, bad = sample_neighbors_padded(g, torch.tensor([0, 2, 9]), torch.tensor(2), 1,
        ...                                                      False, counter_rng.stream_key(0, 0, 0, 0))
        >>> int(count), dst[:int(count)].tolist(), int(bad)
        (2, [0, 1], 0)
    """
    k, n, dev = int(fanout), nodes.numel(), nodes.device
    if k <= 0:
        raise ValueError(f"fanout = {k}; the padded sampler needs a positive fanout (its output bound is n * fanout)")
    nodes = nodes.to(torch.int64)
    rows = torch.arange(n, device=dev) < num_valid
    in_range = (nodes >= 0) & (nodes < graph.num_nodes)
    bad = (rows & ~in_range).any().to(torch.int64)
    safe = torch.where(rows & in_range, nodes, 0)  # padding and bad rows read vertex 0 and are then emptied
    start = graph.indptr.index_select(0, safe)
    deg = torch.where(rows & in_range, graph.indptr.index_select(0, safe + 1) - start, 0)
    pos = _pick_positions(safe, deg, k, replace, key)
    valid = (pos >= 0).reshape(-1)
    count = valid.sum()
    # the valid cells in row-major order (grouped by destination, CSC order within), then zeros: no size read
    flat = torch.nonzero_static(valid, size=n * k, fill_value=0).squeeze(1)
    cells = torch.arange(n * k, device=dev) < count
    eids = torch.where(cells, (start[:, None] + pos).reshape(-1).index_select(0, flat), 0)
    src = graph.indices.index_select(0, eids) if graph.indices.numel() else torch.zeros_like(eids)
    return src, torch.div(flat, k, rounding_mode="floor"), eids, count, bad


def relabel_padded(dst_nodes: torch.Tensor, num_dst: torch.Tensor, src: torch.Tensor, src_valid: torch.Tensor,
                   num_nodes: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`relabel` of ``dst_nodes[:num_dst]`` and the entries of ``src`` where ``src_valid``, without a host read.

    Returns ``(src_nodes, num_src, src_local)``: ``src_nodes`` a buffer of ``P + Q`` ids (``P``, ``Q`` the lengths
    of ``dst_nodes`` and ``src``) whose first ``num_src`` (0-d) are ``dst_nodes[:num_dst] ++ sorted(new ids)``,
    exactly what :func:`relabel` returns, and ``src_local[i]`` the place of ``src[i]`` in it (where valid). One
    stable sort of ``P + Q`` keys, invalid entries keyed past every vertex (``num_nodes``). With an empty
    ``dst_nodes`` it is ``unique_inverse``: the sorted distinct valid ids and each id's place.

    Example:
        >>> nodes, n, local = relabel_padded(torch.tensor([9, 4, 0]), torch.tensor(2), torch.tensor([4, 7, 1, 3]),
        ...                                  torch.tensor([True, True, True, False]), 10)
        >>> nodes[:int(n)].tolist(), local[:3].tolist()
        ([9, 4, 1, 7], [1, 3, 2])
    """
    p, q, dev = dst_nodes.numel(), src.numel(), src.device
    total = p + q
    # int32 keys where the ids fit: torch sorts them by radix, 3x faster than int64 on the CPU (fewer passes on a GPU)
    kind = torch.int32 if num_nodes < torch.iinfo(torch.int32).max else torch.int64
    keys = torch.cat([torch.where(torch.arange(p, device=dev) < num_dst, dst_nodes.to(kind), num_nodes),
                      torch.where(src_valid, src.to(kind), num_nodes)])
    if total == 0:
        keys = keys.to(torch.int64)
        return keys, num_dst.to(torch.int64), keys
    ordered, perm = torch.sort(keys, stable=True)
    ordered = ordered.to(torch.int64)
    first = torch.ones(total, dtype=torch.bool, device=dev)
    first[1:] = ordered[1:] != ordered[:-1]
    places = torch.arange(total, device=dev)
    # each key's group leader (its first occurrence in sorted order); the stable sort puts a dst entry first
    leader = perm.index_select(0, torch.cummax(torch.where(first, places, 0), 0).values)
    is_dst = leader < p
    new = first & ~is_dst & (ordered < num_nodes)
    new_rank = torch.cumsum(new, 0) - 1
    local_sorted = torch.where(is_dst, leader, num_dst + new_rank)
    local = torch.empty(total, dtype=torch.int64, device=dev).index_copy_(0, perm, local_sorted)
    # new ids land after the destinations; every other entry goes to a place of its own past the end
    out = torch.empty(2 * total, dtype=torch.int64, device=dev)
    out[:p] = dst_nodes
    out.index_copy_(0, torch.where(new, num_dst + new_rank, total + places), ordered)
    return out[:total], num_dst + new.sum(), local[p:]
