"""Layer-wise full-graph inference, split-parallel: gsplit's equivalent of DGL's ``model.inference``.

Mini-batch evaluation samples neighbours, so its predictions are noisy, and computing every vertex's
k-hop neighbourhood per target repeats work exponentially in depth. Layer-wise inference instead
computes layer 1 for *every* vertex over *all* its in-edges, then layer 2 from those rows, and so on:
each layer costs one pass over the graph's edges.

Split-parallel, every rank owns the vertices the partition map gives it and computes every layer for
them only. Per layer, it walks its owned vertices in chunks of ``batch_size`` (bounding memory):
all ranks take chunk ``k`` of their owned vertices together, sample the chunk's full in-neighbourhood
(``NeighborSampler([-1])``) with :func:`gsplit.sp_sample`, which exchanges the source ids with their
owners, and one shuffle brings the sources' rows of the previous layer; the layer and what runs
between layers then compute the chunk's rows of the next layer. Each vertex's row is therefore
computed exactly once, by its owner, from the same inputs as on one process: the result equals
single-process layer-wise inference (exactly in float64, up to summation order).

**The model protocol.** A model usable here has

* ``model.layers``: a sequence of modules called as ``layer(block, h)`` (``h`` one row per
  ``block.src_nodes``, output one row per ``block.dst_nodes``), bottom layer first;
* ``model.between(i, h, block)``: what runs after layer ``i`` on the rank's own rows, for every
  layer but the last (activation, dropout, flattening of heads); or ``between=`` given to the call
  (``between(i, h, block)`` or ``between(h)``, e.g. ``torch.relu``; ``None``: nothing);
* optionally ``model.output(h)``: what runs after the last layer (e.g. averaging attention heads);
  identity when absent.

A DGL-style model without ``between`` (DGL's example ``SAGE``, whose forward runs ``F.relu`` and
dropout between its layers) needs nothing more: its forward is run once on a tiny mini-batch, the
rows each layer returns are compared with the rows the next layer receives, and the one activation
(identity, relu, elu, leaky_relu, gelu, silu, tanh, sigmoid, possibly with a ``flatten(1)`` or
``mean(1)`` of attention heads) that maps one onto the other is used (:func:`infer_between`). What was
inferred is the result's ``between`` and a WARNING the first time a process infers it for a model class
(rank 0; INFO after, and on the other ranks): a choice made for the user, which a script with default
logging would not see at INFO. A model whose forward does something else between layers gets an error
asking for ``between=``.

The graph may be a gsplit ``Graph``, a ``DGLGraph`` (features default to ``ndata["feat"]``) or a PyG
``Data`` (``x``). The layers get gsplit blocks, or DGL blocks (``dgl.create_block``) when the graph
is a ``DGLGraph`` or a layer is a ``dgl.nn`` module, so ``dgl.nn`` layers run unchanged.

gsplit's models (:class:`gsplit.nn.SAGE`, ``GAT``, ``GCN``) follow it. Layers must compute a
destination from its own in-edges only (the rule split training already imposes), so a chunk's rows
do not depend on which other vertices share the chunk.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from gsplit.comm.communicator import Communicator, as_communicator
from gsplit.data.graph import Graph, as_vertex_ids
from gsplit.data.precision import model_input
from gsplit.interop import dgl as dgl_interop  # imports no dgl
from gsplit.interop.graphs import graph_input  # DGLGraph / PyG Data in, imports neither library
from gsplit.interop.pyg import check_block_layer  # imports no torch_geometric
from gsplit.partitioning.partition_map import owner_tensor
from gsplit.sampling.block import Block
from gsplit.sampling.neighbor import NeighborSampler

log = logging.getLogger(__name__)

__all__ = ["InferenceResult", "layerwise_inference", "gather_rows", "accuracy"]

# The model's own ``between`` (the default of ``layerwise_inference(between=...)``).
_FROM_MODEL = "model"
# Wrappers whose .module is the model (their forward adds shuffles or gradient sync, nothing layer-wise).
_WRAPPERS = ("SplitParallel", "DistributedDataParallel")


@dataclass
class InferenceResult:
    """One rank's share of layer-wise inference: the final layer's rows of the vertices it owns."""

    nodes: torch.Tensor
    """int64 sorted global ids of the vertices this rank owns (all vertices on a single process)."""
    output: torch.Tensor
    """The model's output for ``nodes``, one row each, in the same order (e.g. logits)."""
    num_nodes: int
    """Vertices of the whole graph (``nodes`` over all ranks are a partition of ``range(num_nodes)``)."""
    between: str = ""
    """What ran between the layers: ``"model.between"``, ``"given"`` (the ``between=`` argument), ``"none"``,
    or what was inferred from the model's forward (``"inferred: relu between layers"``)."""

    def __getitem__(self, ids) -> torch.Tensor:
        """The output rows of ``ids`` on every rank, gathered over the default process group (as DGL's
        ``pred[nid]`` on the output of ``model.inference``): :func:`gather_rows`, so every rank must
        index with the same ``ids``; for another group call ``gather_rows(result, ids, group)``.

        Example:
            >>> r = InferenceResult(nodes=torch.tensor([0, 1]), output=torch.tensor([[5.], [6.]]), num_nodes=2)
            >>> r[torch.tensor([1])].tolist()
            [[6.0]]
        """
        return gather_rows(self, ids)

    def rows_of(self, ids: torch.Tensor):
        """``(positions, rows)``: which entries of ``ids`` this rank owns, and their output rows.

        Example:
            >>> r = InferenceResult(nodes=torch.tensor([1, 4]), output=torch.tensor([[1.], [4.]]), num_nodes=5)
            >>> pos, rows = r.rows_of(torch.tensor([4, 0, 1]))
            >>> pos.tolist(), rows.flatten().tolist()
            ([0, 2], [4.0, 1.0])
        """
        ids = as_vertex_ids(ids, self.num_nodes, "ids").to(self.nodes.device)
        where = torch.searchsorted(self.nodes, ids).clamp_(max=max(self.nodes.numel() - 1, 0))
        mine = (self.nodes[where] == ids) if self.nodes.numel() else torch.zeros_like(ids, dtype=torch.bool)
        positions = mine.nonzero().squeeze(1)
        return positions, self.output[where[positions].to(self.output.device)]


def _as_between(fn):
    """``between(i, h, block)`` from a callable of that form or of one tensor (``torch.relu``, ``F.elu``)."""
    try:
        required = [p for p in inspect.signature(fn).parameters.values()
                    if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        unary = len(required) == 1
    except (TypeError, ValueError):  # a builtin without a signature, such as torch.relu: a function of h
        unary = True
    return (lambda i, h, block: fn(h)) if unary else fn


def _model_parts(model, between):
    """``(layers, between, output)`` of a model that follows the protocol in this module's docstring;
    ``between`` is the string ``"infer"`` when the model has no ``between`` and none was given."""
    layers = getattr(model, "layers", None)
    if layers is None or not isinstance(layers, (Sequence, nn.ModuleList)) or len(layers) == 0:
        raise TypeError(f"layer-wise inference needs the model as a stack of layers, but {type(model).__name__} "
                        "has no non-empty `layers` list; give it `self.layers = nn.ModuleList([...])` of modules "
                        "called as layer(block, h) (see gsplit.minibatch.inference)")
    if isinstance(between, str):
        if between != _FROM_MODEL:
            raise ValueError(f"between={between!r}; pass a callable between(i, h, block), None, or leave the default")
        between = getattr(model, "between", None)
        if between is None:
            between = _INFER
    elif between is not None and not callable(between):
        raise TypeError(f"between must be callable as between(i, h, block) or between(h), or None, got "
                        f"{type(between).__name__}")
    elif between is not None:
        between = _as_between(between)
    output = getattr(model, "output", None)
    if output is not None and not callable(output):
        raise TypeError(f"{type(model).__name__}.output must be a method output(h), got {type(output).__name__}")
    for layer in layers:
        check_block_layer(layer, f"{type(model).__name__}.layers")
    return list(layers), between, output


_INFER = "infer"

# Candidates for what a DGL-style forward does between layers (in eval mode: dropout is the identity).
_ACTIVATIONS = [("identity", lambda h: h), ("relu", F.relu), ("elu", F.elu), ("leaky_relu", F.leaky_relu),
                ("gelu", F.gelu), ("silu", F.silu), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid)]
_RESHAPES = [("", lambda h: h), ("flatten(1)", lambda h: h.flatten(1)), ("mean(1)", lambda h: h.mean(1))]


def _candidates():
    for (an, act) in _ACTIVATIONS:
        for (rn, reshape) in _RESHAPES:
            if not rn:
                yield an, act
                continue
            yield (f"{an}(h.{rn})" if an != "identity" else f"h.{rn}"), (lambda h, a=act, r=reshape: a(r(h)))
            if an != "identity" and rn != "flatten(1)":  # an elementwise activation commutes with flatten
                yield f"{an}(h).{rn}", (lambda h, a=act, r=reshape: r(a(h)))


def _matching(before: torch.Tensor, after: torch.Tensor) -> List[str]:
    """Names of the candidates ``f`` with ``f(before) == after`` (up to float rounding)."""
    found = []
    for name, f in _candidates():
        if "flatten(1)" in name and before.dim() <= 2:
            continue  # a no-op on [rows, features]: the same candidate as without it
        try:
            got = f(before)
        except RuntimeError:
            continue
        if got.shape == after.shape and torch.allclose(got, after, rtol=1e-4, atol=1e-6):
            found.append(name)
    return found


def infer_between(model, layers: Sequence[nn.Module], blocks: list, x: torch.Tensor):
    """``(between, output, description)`` of a DGL-style model, read off one run of its forward on ``blocks``.

    Hooks record what each layer returns and what the next layer (and the forward) receives; for each
    gap the one candidate activation (see this module's docstring) that maps one onto the other is
    taken. Raises ``TypeError`` when none or several different ones fit (pass ``between=`` then).

    Example:
        >>> import gsplit, torch.nn.functional as F
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.layers = torch.nn.ModuleList([gsplit.nn.SAGEConv(4, 8), gsplit.nn.SAGEConv(8, 3)])
        ...     def forward(self, blocks, x):
        ...         return self.layers[1](blocks[1], F.elu(self.layers[0](blocks[0], x)))
        >>> g = gsplit.Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> blocks = gsplit.NeighborSampler([2, 2]).sample_blocks(g, torch.tensor([0, 2]))
        >>> net = Net()
        >>> infer_between(net, net.layers, blocks, torch.randn(blocks[0].num_src_nodes(), 4))[2]
        'elu between layers'
    """
    outs, ins = {}, {}

    def record_input(i, args):
        ins.setdefault(i, args[1] if len(args) > 1 else None)   # returns None: the arguments stay as they are

    def record_output(i, out):
        outs.setdefault(i, out)

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda m, args, i=i: record_input(i, args)))
        handles.append(layer.register_forward_hook(lambda m, args, out, i=i: record_output(i, out)))
    name = type(model).__name__
    try:
        result = model(blocks, x)
    except Exception as e:  # the probe is the model's own forward: any failure means "cannot tell"
        raise TypeError(f"{name} has no `between(i, h, block)` method and running its forward on a probe "
                        f"mini-batch to find what runs between its layers failed ({type(e).__name__}: {e}); pass "
                        "between= (e.g. between=torch.relu, or None when nothing runs between them)") from e
    finally:
        for h in handles:
            h.remove()
    fix = ("pass between= (a callable between(h) or between(i, h, block); None when nothing runs between the "
           "layers), or give the model a between(i, h, block) method")
    if len(outs) != len(layers) or len(ins) != len(layers):
        raise TypeError(f"{name}'s forward did not call each of its {len(layers)} layers once as layer(block, h); "
                        f"layer-wise inference cannot tell what runs between them: {fix}")
    if not (isinstance(ins[0], torch.Tensor) and ins[0].shape == x.shape and torch.equal(ins[0], x)):
        raise TypeError(f"{name}'s forward changes x before its first layer, which layer-wise inference does not "
                        f"repeat; {fix}")
    chosen = []
    for i in range(len(layers) - 1):
        names = _matching(outs[i], ins[i + 1])
        if len(names) != 1:
            what = "no known activation" if not names else f"several activations alike on the probe ({names})"
            raise TypeError(f"{name}: {what} turns layer {i}'s output into layer {i + 1}'s input; {fix}")
        chosen.append(names[0])
    out_names = _matching(outs[len(layers) - 1], result) if isinstance(result, torch.Tensor) else []
    if not out_names:
        raise TypeError(f"{name}'s forward does more after its last layer than a known reshape; give the model an "
                        f"output(h) method")
    table = dict(_candidates())
    funcs = [table[n] for n in chosen]
    between = (lambda i, h, block: funcs[i](h)) if funcs else None
    output = None if out_names[0] == "identity" else table[out_names[0]]
    gaps = sorted(set(chosen))
    desc = (f"{gaps[0]} between layers" if len(gaps) == 1 else f"between layers: {chosen}") + \
        ("" if output is None else f", {out_names[0]} after the last")
    return between, output, desc


def _device_of(model) -> torch.device:
    for p in model.parameters() if isinstance(model, nn.Module) else ():
        return p.device
    return torch.device("cpu")


# ---------------------------------------------------------------------------------------------------
# The only two places that call the split machinery (kept apart so that its signatures can change).

def _sample_chunk(graph: Graph, seeds: torch.Tensor, owner: torch.Tensor, comm: Communicator):
    """``(local_frontier, block)``: this rank's split of the full in-neighbourhood of the global chunk ``seeds``.

    ``block.dst_nodes`` are the seeds this rank owns; ``local_frontier`` the vertices it owns whose rows
    some rank needs as sources; ``block.shuffle_index`` moves those rows to where they are needed.
    """
    from gsplit.split.split_sampling import sp_sample

    batch = sp_sample(graph, seeds, owner, NeighborSampler([-1]), comm)
    return batch.input_nodes, batch.blocks[0]


def _to_sources(h_local: torch.Tensor, block: Block, comm: Communicator) -> torch.Tensor:
    """Rows of the local frontier -> rows of ``block``'s sources (one all-to-all; no autograd)."""
    from gsplit.comm.shuffle import shuffle_rows

    return shuffle_rows(h_local, block.shuffle_index, comm, tag_suffix="inference")
# ---------------------------------------------------------------------------------------------------


@torch.no_grad()
def layerwise_inference(model, graph: Graph, features: Optional[torch.Tensor] = None, *, partition=None, group=None,
                        batch_size: int = 4096, device: Union[str, torch.device, None] = None,
                        buffer_device: Union[str, torch.device, None] = None,
                        between: Union[str, None, Callable[[int, torch.Tensor, Block], torch.Tensor]] = _FROM_MODEL,
                        ) -> InferenceResult:
    """Compute the model's output for every vertex, layer by layer over all in-edges; split-parallel.

    Every rank of ``group`` must call it with the same arguments (the same graph, features and map);
    each gets the rows of the vertices it owns. On one process (no ``partition``, no process group)
    the result covers all vertices.

    Args:
        model: a stack of layers following this module's protocol (``layers``, ``between`` or one
            inferred from the forward, optional ``output``); gsplit's models and DGL's example classes
            do. A ``SplitParallel`` / ``DistributedDataParallel`` wrapper is unwrapped. It runs in eval
            mode (dropout off) and is left in the mode it was in.
        graph: the full graph (every rank holds it): a gsplit ``Graph``, a ``DGLGraph`` or a PyG ``Data``.
        features: ``[num_nodes, in_feats]`` input features (every rank reads only its owned rows);
            default: the DGLGraph's ``ndata["feat"]`` or the Data's ``x``.
        partition: a :class:`gsplit.PartitionMap` or one owner rank per vertex. Any map gives the same
            result; a balanced one balances the work. Default with more than one rank: contiguous,
            equal ranges of vertex ids (no work to make, more rows to exchange than a METIS map).
        group: a ``torch.distributed`` process group or a :class:`gsplit.Communicator`; ``None``: the
            default group when one is initialised, else a single process.
        batch_size: owned vertices per rank per chunk: memory is bounded by the chunk's in-edges.
        device: where the layers run; default the model's parameters' device.
        buffer_device: where the per-layer rows of the owned vertices are kept; default ``device``
            (pass ``"cpu"`` when they do not fit in GPU memory).
        between: the default uses ``model.between``, else infers it from the model's forward (see
            this module's docstring); pass ``None`` when nothing runs between the layers, or a callable
            ``between(i, h, block)`` or ``between(h)`` (e.g. ``torch.relu``).

    Example:
        >>> import gsplit
        >>> ds = gsplit.datasets.load("synthetic", num_nodes=300, seed=0)
        >>> model = gsplit.nn.SAGE(ds.feature_dim, 16, ds.num_classes, num_layers=2)
        >>> res = gsplit.layerwise_inference(model, ds.graph, ds.features, batch_size=100)
        >>> res.output.shape == (300, ds.num_classes), bool((res.nodes == torch.arange(300)).all())
        (True, True)
        >>> round(gsplit.minibatch.inference.accuracy(res, ds.labels, ds.test_idx), 2) <= 1.0
        True
    """
    if isinstance(getattr(model, "module", None), nn.Module) and type(model).__name__ in _WRAPPERS:
        model = model.module
    what_between = "model.between" if isinstance(between, str) else ("none" if between is None else "given")
    layers, between, output = _model_parts(model, between)
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size}; pass a positive number of vertices per rank per chunk")
    source = graph_input(graph)
    graph = source.graph
    if features is None:
        features = source.features
        if features is None:
            where = {"dgl": 'the DGLGraph has no ndata["feat"]', "pyg": "the Data's x is None"}.get(source.kind, "")
            raise ValueError(f"no features were given{' and ' + where if where else ''}; pass features= (one row "
                             "per vertex)")
    if not isinstance(features, torch.Tensor) or features.dim() != 2 or features.shape[0] != graph.num_nodes:
        raise ValueError(f"features has shape {tuple(features.shape)} but the graph has {graph.num_nodes} vertices; "
                         "pass one feature row per vertex")
    comm = as_communicator(group)
    if partition is None and comm.world_size > 1:
        # any map gives the same rows; equal ranges need no work and no agreement between ranks
        partition = torch.arange(graph.num_nodes, device=graph.device) * comm.world_size // graph.num_nodes
        log.info("layer-wise inference: no partition given, rank r computes the r-th of %d equal ranges of "
                 "vertex ids", comm.world_size)
    owner = owner_tensor(partition, graph, comm.world_size).to(graph.device)
    device = torch.device(device) if device is not None else _device_of(model)
    buffer_device = torch.device(buffer_device) if buffer_device is not None else device
    # DGL layers need DGL blocks (dgl.create_block); so does a model written for a DGLGraph
    dgl_blocks = source.kind == "dgl" or any(type(m).__module__.split(".")[0] == "dgl"
                                             for layer in layers for m in layer.modules())

    def as_layer_block(block: Block):
        return dgl_interop.to_dgl_block(block, source.dgl_source) if dgl_blocks else block

    # Every rank derives every rank's owned vertices from the same map, so all agree on the chunks.
    counts = torch.bincount(owner, minlength=comm.world_size).cpu()
    by_owner = torch.argsort(owner, stable=True)          # rank 0's vertices, then rank 1's, ... each sorted
    starts = (torch.cumsum(counts, 0) - counts).tolist()
    counts_l = counts.tolist()
    mine = by_owner[starts[comm.rank]:starts[comm.rank] + counts_l[comm.rank]]
    # position of an owned vertex among this rank's vertices (its row in the per-layer buffers)
    row_of = torch.full((graph.num_nodes,), -1, dtype=torch.int64, device=graph.device)
    row_of[mine] = torch.arange(mine.numel(), device=graph.device)
    bs = int(batch_size)
    num_chunks = -(-max(counts_l) // bs) if counts_l else 0

    was_training = model.training if isinstance(model, nn.Module) else False
    if isinstance(model, nn.Module):
        model.eval()
    try:
        if isinstance(between, str):  # == _INFER: read it off the model's forward on a tiny mini-batch
            probe = NeighborSampler([4] * len(layers)).sample_blocks(
                graph, torch.arange(min(32, graph.num_nodes), device=graph.device))
            probe = [b.to(device) for b in probe]
            x = model_input(features[probe[0].src_nodes.to(features.device)].to(device), layers)
            between, inferred_output, desc = infer_between(model, layers, [as_layer_block(b) for b in probe], x)
            output = output if output is not None else inferred_output
            _say_inferred(type(model).__name__, desc, comm.rank)
            what_between = f"inferred: {desc}"
        h_prev: Optional[torch.Tensor] = None       # rows of the owned vertices at the previous layer
        for i, layer in enumerate(layers):
            h_next: Optional[torch.Tensor] = None
            for k in range(num_chunks):
                seeds = torch.cat([by_owner[s + k * bs: s + min((k + 1) * bs, c)]
                                   for s, c in zip(starts, counts_l)])
                frontier, block = _sample_chunk(graph, seeds, owner, comm)
                block = block.to(device)
                if i == 0:
                    h_local = model_input(features[frontier.to(features.device)].to(device), layers)
                else:
                    h_local = h_prev[row_of[frontier].to(h_prev.device)].to(device)
                layer_block = as_layer_block(block)
                h = layer(layer_block, _to_sources(h_local, block, comm))
                if i < len(layers) - 1:
                    if between is not None:
                        h = between(i, h, layer_block)
                elif output is not None:
                    h = output(h)
                if h_next is None:
                    h_next = h.new_empty((mine.numel(),) + tuple(h.shape[1:]), device=buffer_device)
                h_next[row_of[block.dst_nodes.to(graph.device)].to(buffer_device)] = h.to(buffer_device)
            h_prev = h_next
            log.debug("layer-wise inference: layer %d done in %d chunks", i, num_chunks)
    finally:
        if isinstance(model, nn.Module):
            model.train(was_training)
    return InferenceResult(nodes=mine, output=h_prev, num_nodes=graph.num_nodes, between=what_between)


# (model class, what was inferred) said at WARNING in this process: repeated evaluations say it at INFO
_INFERRED_SAID: Set[Tuple[str, str]] = set()


def _say_inferred(model_name: str, desc: str, rank: int) -> None:
    """Log what was inferred: at WARNING the first time this process infers it for ``model_name`` on rank 0
    (a choice made for the user, which a script's default logging shows only at WARNING), else at INFO."""
    first = rank == 0 and (model_name, desc) not in _INFERRED_SAID
    _INFERRED_SAID.add((model_name, desc))
    log.log(logging.WARNING if first else logging.INFO, "layer-wise inference: %s has no between(i, h, block); "
            "from its forward (run on a probe mini-batch): %s (pass between= to choose it yourself)", model_name, desc)


def gather_rows(result: InferenceResult, ids, group=None) -> torch.Tensor:
    """The output rows of ``ids`` (vertex ids or a boolean mask) on every rank, in ``ids`` order.

    One all-reduce of ``[len(ids), ...]``: each row is filled by its owner and zeros elsewhere, so the
    sum is the row itself, exactly. Every rank of ``group`` must call it with the same ``ids``.

    Example:
        >>> r = InferenceResult(nodes=torch.tensor([0, 1, 2]), output=torch.eye(3), num_nodes=3)
        >>> gather_rows(r, torch.tensor([2, 0])).tolist()
        [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    """
    comm = as_communicator(group)
    ids = as_vertex_ids(ids, result.num_nodes, "ids")
    positions, rows = result.rows_of(ids)
    out = result.output.new_zeros((ids.numel(),) + tuple(result.output.shape[1:]))
    out[positions.to(out.device)] = rows
    return comm.all_reduce_(out)


def accuracy(result: InferenceResult, labels: torch.Tensor, ids, group=None) -> float:
    """Fraction of ``ids`` whose arg-max output equals the label, counted by each owner and summed over ranks.

    ``ids`` are vertex ids or a boolean mask; every rank must call it with the same ``ids`` and gets the
    same number. See :func:`layerwise_inference` for an example.
    """
    comm = as_communicator(group)
    ids = as_vertex_ids(ids, result.num_nodes, "ids")
    positions, rows = result.rows_of(ids)
    if labels.shape[0] != result.num_nodes:
        raise ValueError(f"labels has {labels.shape[0]} entries but the graph has {result.num_nodes} vertices")
    mine = ids[positions.to(ids.device)]
    correct = rows.argmax(1).cpu() == labels[mine.to(labels.device)].cpu()
    correct_total = comm.all_reduce_(correct.sum().reshape(1).to(torch.float64))
    return float(correct_total[0]) / max(ids.numel(), 1)  # ids are the same on every rank
