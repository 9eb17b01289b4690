"""``SplitParallel``: to split parallelism what ``DistributedDataParallel`` is to data parallelism.

Wrap an unchanged DGL- or PyG-style model (one whose forward runs ``h = layer(block, h)`` over the
blocks) and train it with its ordinary mean loss::

    model = gsplit.SplitParallel(model, loader)
    for input_nodes, output_nodes, blocks in loader:
        loss = F.cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"])
        opt.zero_grad(); loss.backward(); opt.step()

The wrapper does the four things that make N ranks take the step one process would take on the whole
global mini-batch:

1. **Same start**: parameters and buffers are broadcast from rank 0 when the wrapper is built.
2. **Shuffles**: a forward pre-hook on every submodule called as ``layer(block, h)`` replaces ``h``
   (this rank's rows: one per vertex it owns) with ``gsplit.shuffle(h, block)`` (one row per source of
   the block, the *mixed frontier*) for every block above the first. A model that shuffles for itself
   (``gsplit.shuffle`` / ``gsplit.sp_forward`` in its forward, as the README's PyG model does) is
   recognised by the rows it passes (``gsplit.shuffle`` marks them) and left alone; modules marked
   ``split_aware = True`` (gsplit's own models) get no hooks at all. The DGL blocks
   of a ``gsplit.DataLoader`` over a ``DGLGraph`` work the same: their plans are looked up in
   :mod:`gsplit.interop.dgl`.
3. **Loss scale**: each rank's mean loss covers only its local targets. The gradient of the wrapper's
   output is scaled by ``local targets / global targets``, so the ranks' gradients add up to the
   gradient of the global mini-batch's mean loss. In full-graph training the targets are the training
   vertices (``blocks[-1].num_loss_rows`` of the rank, labelled; the rest carry ``ignore_index``).
   Link prediction mini-batches (:mod:`gsplit.link`) score pairs, not output rows: the wrapper returns the
   rank's *pair rows* (its output rows and the other ranks' rows its pairs need, one exchange), so DGL's
   ``pair_graph.ndata["h"] = model(blocks, x)`` scores them unchanged, and scales for a mean over the rank's
   pairs (pairs here / pairs of the global mini-batch); a loss made by
   :func:`gsplit.link.split_bce_with_logits`, already a share of the global mean, is left unscaled.
4. **Gradient sum**: parameter gradients are all-reduced in buckets overlapped with backward by a
   ``torch.nn.parallel.DistributedDataParallel`` on a process group of its own (its all-reduces never
   interleave with the shuffles' all-to-alls); DDP's averaging is folded into the scale of step 3.

With several hosts (a loader built with ``replica_group=``, or ``replica_group=`` given here) the
split group is the host's and DDP's group spans every rank of the job; the scale of step 3 uses the
size of the union of the hosts' mini-batches.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from gsplit.data.precision import model_input
from gsplit.comm import Communicator
from gsplit.comm import shuffle as _comm_shuffle
from gsplit.comm import teardown
from gsplit.interop import dgl as _dgl_interop  # imports no dgl
from gsplit.interop.pyg import check_block_layer  # imports no torch_geometric
from gsplit.link.scoring import wrapper_pair_rows
from gsplit.sampling.block import Block

log = logging.getLogger(__name__)

__all__ = ["SplitParallel"]


@dataclass
class _ForwardState:
    """What the hooks need to know during one forward of the wrapper (dropped when it returns)."""

    blocks: List[Block]
    """The blocks the wrapper's forward received, input layer first."""
    position: Dict[int, int]
    """``id(block) -> index`` in ``blocks``: tells a hook which layer a call is for."""
    shuffled: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """``(block index, id(h)) -> (h, shuffled h)``: a tensor fed twice to the same block is shuffled once."""
    produced: Dict[int, List[torch.Tensor]] = field(default_factory=dict)
    """Block index -> shuffle outputs made for it (an inner layer may receive one unchanged)."""
    depth: int = 0
    """Module calls with a block as first argument now running: only the outermost one is shuffled for."""


def _plan_block(x: Any) -> Optional[Block]:
    """The gsplit block behind a layer's block argument (it holds the shuffle plan), else None.

    ``x`` itself for a gsplit :class:`Block`; for a DGL block yielded by a ``gsplit.DataLoader`` over a
    ``DGLGraph``, the gsplit block it was made from (:func:`gsplit.interop.dgl.block_of`).
    """
    return x if isinstance(x, Block) else _dgl_interop.block_of(x)


def _is_block(x: Any) -> bool:
    return _plan_block(x) is not None


def _find_blocks(inputs: tuple, kwargs: dict) -> List[Block]:
    """The (gsplit) blocks of a forward call: the first positional argument (or ``blocks=``), as in DGL."""
    first = inputs[0] if inputs else kwargs.get("blocks")
    if _is_block(first):
        return [_plan_block(first)]
    if isinstance(first, (list, tuple)) and first and all(_is_block(b) for b in first):
        return [_plan_block(b) for b in first]
    items = list(first) if isinstance(first, (list, tuple)) else [first]
    if any(_dgl_interop.is_dgl_block(b) and not _is_block(b) for b in items):
        raise ValueError("SplitParallel got DGL blocks that no gsplit.DataLoader yielded (DGL's own loader, or "
                         "blocks rebuilt with dgl.create_block / dgl.to_block, which have no shuffle plan); pass "
                         "the blocks of gsplit.DataLoader(dgl_graph, ...) (block.to(device) copies are fine)")
    raise TypeError(f"SplitParallel's forward expects the list of blocks as its first argument, as in "
                    f"model(blocks, x), got {type(first).__name__}; call the wrapper the way the model is "
                    f"called on gsplit.DataLoader's blocks")


def _remove_handles(handles) -> None:
    for h in handles:
        h.remove()


def _ddp_group(comm: Communicator):
    """A new process group with ``comm``'s ranks and backend, for DDP's gradient all-reduces.

    ``new_group`` is collective: every process of the job calls it (for a subgroup, every member), in
    the same order relative to other ``new_group`` calls.
    """
    group = comm.group
    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    return dist.new_group(ranks=ranks, backend=dist.get_backend(group),
                          use_local_synchronization=group is not None)


class SplitParallel(nn.Module):
    """Run an unchanged block-based GNN split-parallel, the way DDP runs a model data-parallel.

    Args:
        module: the model. Its forward takes the blocks first (``module(blocks, x, ...)``) and calls
            its layers as ``layer(block, h)`` with ``h`` positional; it returns one output row per
            target of this rank (``blocks[-1].num_dst_nodes()`` rows). gsplit's models
            (``gsplit.nn.SAGE``/``GAT``/``GCN``) and any module with ``split_aware = True`` shuffle
            themselves and get no hooks.
        loader: the rank's ``gsplit.DataLoader``; its ``comm`` is the split group (the shuffles' group).
        group: the split group when no loader is given: a ``torch.distributed`` process group or a
            :class:`gsplit.Communicator`; default: the default group if initialised, else world size 1.
        replica_group: several hosts, when no loader is given: every rank of the job (e.g. the second
            value of :func:`gsplit.host_groups`); gradients are summed over it. With a loader, the
            loader's ``replica_group`` is used.
        device_ids, output_device: accepted so that a DDP call site ports by changing only the class
            name; each must be ``None`` or name the module's device (the loader already delivers
            blocks and features there).
        **ddp_kwargs: passed to ``DistributedDataParallel`` (e.g. ``bucket_cap_mb``,
            ``find_unused_parameters``, ``gradient_as_bucket_view``).

    With more than one rank, every rank of the split group must build its wrapper, in the same order
    as its other process groups (the wrapper creates one for DDP), and every rank must run every
    forward and backward, also one that owns no target of the mini-batch. Such a rank's
    ``F.cross_entropy`` of an empty batch is ``nan`` in value, but its gradient is empty, so
    ``loss.backward()`` is safe; log :meth:`global_loss` instead of the local value.

    The loss must be the mean over the wrapper's output rows (``F.cross_entropy(out, y)``, the
    default ``reduction="mean"``). On a link prediction mini-batch the output is the rank's pair rows
    (which ``pair_graph.edges()`` index) and the loss the mean over the pairs it scores, as in DGL
    (or :func:`gsplit.link.split_bce_with_logits`); a predictor's own parameters then need
    ``split_bce_with_logits`` and their gradients summed beside the wrapper. On blocks that are not
    split (single process, data-parallel loaders) there is no shuffle and no scale: it is exactly DDP
    (at world size 1: the module).

    Example (one process, no process group: the wrapper changes nothing):
        >>> import gsplit, torch.nn.functional as F
        >>> from gsplit.nn import SAGEConv
        >>> class Net(torch.nn.Module):           # a DGL-style model, unchanged
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.layers = torch.nn.ModuleList([SAGEConv(4, 8), SAGEConv(8, 3)])
        ...     def forward(self, blocks, x):
        ...         h = x
        ...         for l, (layer, block) in enumerate(zip(self.layers, blocks)):
        ...             h = layer(block, h)
        ...             if l != len(self.layers) - 1:
        ...                 h = F.relu(h)
        ...         return h
        >>> g = gsplit.Graph.from_edges([0, 1, 2, 3], [1, 2, 3, 0], symmetric=True)
        >>> blocks = gsplit.NeighborSampler([2, 2]).sample_blocks(g, torch.tensor([0, 2]))
        >>> model = gsplit.SplitParallel(Net())
        >>> model.world_size
        1
        >>> loss = F.cross_entropy(model(blocks, torch.randn(blocks[0].num_src_nodes(), 4)),
        ...                        torch.tensor([1, 2]))
        >>> loss.backward()
        >>> model.global_loss(loss) == loss.item()
        True

    With ``gsplit.launch``, inside each rank::

        model = gsplit.SplitParallel(Net().to(device), loader)    # doctest: +SKIP
    """

    split_aware = True
    """The wrapper shuffles for its module: a model holding a wrapped submodule adds no hooks inside it."""

    def __init__(self, module: nn.Module, loader=None, group: Union[None, "dist.ProcessGroup", Communicator] = None,
                 *, replica_group: Union[None, "dist.ProcessGroup", Communicator] = None,
                 device_ids: Optional[Sequence] = None, output_device=None, **ddp_kwargs):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"SplitParallel wraps a torch.nn.Module, got {type(module).__name__}")
        if isinstance(module, (SplitParallel, torch.nn.parallel.DistributedDataParallel)):
            raise ValueError(f"the module is already a {type(module).__name__}; wrap the model itself once "
                             f"(SplitParallel also does what DistributedDataParallel does)")
        if loader is not None and (group is not None or replica_group is not None):
            raise ValueError("pass either loader (its comm is the split group, its replica_comm every rank) or "
                             "group / replica_group, not both")
        self.module = module
        self.group = loader.comm if loader is not None else group
        """The split group as given (a process group, a Communicator, or None for the default one)."""
        self.comm = self.group if isinstance(self.group, Communicator) else Communicator(self.group)
        """This rank's communicator on the split group (rank, world size)."""
        if loader is not None:
            replica_group = getattr(loader, "replica_comm", None)
        self.replica_comm = self.comm if replica_group is None else (
            replica_group if isinstance(replica_group, Communicator) else Communicator(replica_group))
        """Every rank whose gradients are summed (the split group, or every host's ranks); logs the loss."""
        self._check_device_args(device_ids, output_device)
        self._state: Optional[_ForwardState] = None
        self._last_rows: Optional[int] = None
        self._hooks = []
        self._hooked = self._install_hooks(module)
        self._ddp = None
        if dist.is_available() and dist.is_initialized():
            # Ranks started by torch.multiprocessing.spawn (DGL's examples, the DGL port) end with their own
            # destroy_process_group(), which under torch 2.2 can deadlock with gloo's workers right after the
            # last collective (gsplit.comm.teardown): give it the settle gsplit.launch gives its ranks.
            teardown.guard_destroy()
        if self.replica_comm.world_size > 1:
            ddp = torch.nn.parallel.DistributedDataParallel(module, process_group=_ddp_group(self.replica_comm),
                                                            **ddp_kwargs)
            # Not registered as a submodule: the parameters and state_dict keys stay ``module.*`` only.
            object.__setattr__(self, "_ddp", ddp)
        elif ddp_kwargs:
            log.debug("world size 1: DistributedDataParallel options %s are not used", sorted(ddp_kwargs))

    # ------------------------------------------------------------------ set-up
    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    def _check_device_args(self, device_ids, output_device) -> None:
        params = list(self.module.parameters())
        dev = params[0].device if params else torch.device("cpu")
        named = list(device_ids or []) + ([] if output_device is None else [output_device])
        for d in named:
            d = torch.device(d) if not isinstance(d, int) else torch.device("cuda", d)
            if d.type != dev.type or (d.index is not None and dev.index is not None and d.index != dev.index):
                raise ValueError(f"device_ids/output_device name {d} but the module is on {dev}; move the module "
                                 f"with .to(device) first (SplitParallel does not move inputs)")

    def _install_hooks(self, module: nn.Module) -> int:
        """Pre/post hooks on every submodule outside split-aware subtrees; returns how many were hooked.

        The hooks hold the wrapper weakly and are removed when it is collected, so re-wrapping a module
        leaves no stale wrapper (and no stale DDP reducer) alive behind it.
        """
        ref = weakref.ref(self)

        def pre(layer, args):
            wrapper = ref()
            return None if wrapper is None else wrapper._pre_hook(layer, args)

        def post(layer, args, output):
            wrapper = ref()
            return None if wrapper is None else wrapper._post_hook(layer, args, output)

        seen = set()
        stack = [module]
        while stack:
            m = stack.pop()
            if id(m) in seen or getattr(m, "split_aware", False):
                continue
            seen.add(id(m))
            self._hooks.append(m.register_forward_pre_hook(pre))
            self._hooks.append(m.register_forward_hook(post, always_call=True))
            stack.extend(m.children())
        weakref.finalize(self, _remove_handles, self._hooks)
        return len(seen)

    # ------------------------------------------------------------------ hooks
    def _shuffle(self, h: torch.Tensor, block: Block) -> torch.Tensor:
        """The one call of the shuffle, on the wrapper's group."""
        return _comm_shuffle(h, block, self.group)

    def _pre_hook(self, layer: nn.Module, args: tuple):
        state = self._state
        if state is None or not args or not _is_block(args[0]):
            return None
        check_block_layer(layer, "the model")
        state.depth += 1
        if state.depth > 1:  # inside a layer that was already given the mixed rows
            return None
        block = _plan_block(args[0])
        i = state.position.get(id(block))
        index = block.shuffle_index
        if i is None or i == 0 or index is None:
            # Not one of this forward's blocks, the first layer (its input rows are the mixed frontier
            # already) or an unsplit block: nothing to exchange.
            return None
        name = type(layer).__name__
        if len(args) < 2 or not isinstance(args[1], torch.Tensor):
            got = "nothing" if len(args) < 2 else type(args[1]).__name__
            raise TypeError(f"{name} was called for blocks[{i}] with {got} as its second positional argument; "
                            f"SplitParallel shuffles h when a layer is called as layer(block, h) with one tensor h")
        h = args[1]
        if any(h is out for out in state.produced.get(i, ())) or getattr(h, "gsplit_shuffled_for", None) is index:
            return None  # shuffled already: by this wrapper for an outer module, or by the model itself
        done = state.shuffled.get((i, id(h)))
        if done is not None:
            return (args[0], done[1]) + args[2:]
        if h.shape[0] != index.num_local:
            if h.shape[0] == index.num_mixed:
                hint = ("h already has one row per source of the block: if the model shuffles itself, pass "
                        "gsplit.shuffle's output to the layer unchanged (SplitParallel then recognises it), or "
                        "set split_aware = True on the model's class")
            else:
                hint = "pass the previous layer's output (one row per destination of blocks[i-1]) unchanged"
            raise ValueError(f"{name} was called for blocks[{i}] with h of {h.shape[0]} rows, but this rank holds "
                             f"{index.num_local} rows of that level (its local frontier) and the block has "
                             f"{index.num_mixed} sources (its mixed frontier); {hint}")
        out = self._shuffle(h, block)
        state.shuffled[(i, id(h))] = (h, out)
        state.produced.setdefault(i, []).append(out)
        return (args[0], out) + args[2:]

    def _post_hook(self, layer: nn.Module, args: tuple, output):
        state = self._state
        if state is not None and args and _is_block(args[0]):
            state.depth -= 1
        return None

    # ------------------------------------------------------------------ forward
    def forward(self, *inputs, **kwargs):
        blocks = _find_blocks(inputs, kwargs)
        # half-precision features reach the module's layers in its weights' dtype (exactly), as in sp_forward
        inputs = tuple(model_input(x, [self.module]) if isinstance(x, torch.Tensor) else x for x in inputs)
        self._state = _ForwardState(blocks=blocks, position={id(b): i for i, b in enumerate(blocks)})
        try:
            if self._ddp is not None and torch.is_grad_enabled():
                out = self._ddp(*inputs, **kwargs)
            else:
                # No gradient, no DDP: evaluation does not join DDP's collectives (or buffer broadcasts).
                out = self.module(*inputs, **kwargs)
        finally:
            self._state = None
        return self._scale_output(out, blocks[-1])

    def _scale_output(self, out, top: Block):
        split = top.shuffle_index is not None
        if split and len(top.shuffle_index.send_counts) != self.world_size:
            raise ValueError(f"the blocks are split over {len(top.shuffle_index.send_counts)} ranks but the wrapper's "
                             f"group has {self.world_size}; pass the loader (or its group) to SplitParallel")
        rows = top.num_dst_nodes()
        if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != rows:
            if split and self.world_size > 1:
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(f"the module returned {shape} but blocks[-1] has {rows} destinations on this rank; "
                                 f"SplitParallel scales the gradient of one output row per target, so return "
                                 f"the logits of blocks[-1]'s destinations")
            self._last_rows = None
            return out
        if top.pairs is not None:  # link prediction: the pair rows, scaled for the mean over the rank's pairs
            out, self._last_rows = wrapper_pair_rows(out, top.pairs, self.group, self.replica_comm.world_size)
            return out
        # rows the rank's mean loss averages over: all of them, or (full-graph training) its labelled ones
        rows = rows if top.num_loss_rows is None else top.num_loss_rows
        self._last_rows = rows
        if not out.requires_grad:
            return out
        # The rank's mean loss is sum / rows; the global mean is sum / global rows (global: the union of
        # every host's mini-batch). DDP then divides the summed gradients by its group's size, which the
        # factor ddp_size undoes.
        total = top.global_num_dst if split and top.global_num_dst is not None else rows
        scale = (self.replica_comm.world_size * rows / total if split else 1.0) if total else 0.0
        if scale != 1.0:
            out.register_hook(lambda grad: grad * scale)
        return out

    # ------------------------------------------------------------------ helpers
    def global_loss(self, loss: torch.Tensor) -> float:
        """The global mini-batch's mean loss from this rank's mean ``loss`` (for logging; no autograd).

        Every rank must call it (one all-reduce on the split group) after the forward that produced
        ``loss``. A rank that owns no target contributes nothing, also when its ``loss`` is ``nan``.

        Example:
            >>> print(f"loss {model.global_loss(loss):.4f}")     # doctest: +SKIP
        """
        if self._last_rows is None:
            raise RuntimeError("global_loss needs the row count of the last forward; call it after model(blocks, x) "
                               "on a module that returns one row per target")
        rows = self._last_rows
        value = loss.detach().reshape(()).to("cpu", torch.float64) * rows if rows else torch.zeros((), dtype=torch.float64)
        t = torch.stack([value, torch.tensor(float(rows), dtype=torch.float64)])
        if self.replica_comm.world_size > 1:
            self.replica_comm.all_reduce_(t)
        return float(t[0] / t[1]) if t[1] > 0 else float("nan")

    @contextlib.contextmanager
    def no_sync(self):
        """As ``DistributedDataParallel.no_sync``: accumulate gradients locally for the backwards inside."""
        if self._ddp is None:
            yield
        else:
            with self._ddp.no_sync():
                yield

    def extra_repr(self) -> str:
        return f"rank={self.rank}, world_size={self.world_size}, hooked_modules={self._hooked}"
