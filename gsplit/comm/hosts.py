"""Many hosts: one split group per host, hosts as data-parallel replicas of each other.

Each host's ranks form a *split group* (its own process group: id exchanges and shuffles stay inside
the host); the job-wide group (every rank of every host) sums the gradients. :func:`host_groups`
builds the split groups the same way on every rank; :func:`replica_layout` tells a rank how many
replicas there are and which one it belongs to. Neither stores a group anywhere: the caller passes
them where they are used (``gsplit.DataLoader(..., group=host, replica_group=world)``,
``gsplit.allreduce_gradients(model, world)``).
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Tuple

import torch.distributed as dist

from gsplit.comm.communicator import Communicator

__all__ = ["host_groups", "replica_layout", "group_ranks", "check_same_everywhere"]


def group_ranks(group) -> List[int]:
    """The global ranks of ``group`` (a process group, a Communicator or ``None``: the default group).

    Example:
        >>> group_ranks(None)            # no process group initialised: this process alone
        [0]
    """
    if isinstance(group, Communicator):
        group = group.group
    if not (dist.is_available() and dist.is_initialized()):
        return [0]
    return list(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))


def _hosts_from_env(world: int) -> List[List[int]]:
    """Ranks per host as torchrun numbered them: every rank says which node it is on (``GROUP_RANK``)."""
    if "GROUP_RANK" not in os.environ and "LOCAL_WORLD_SIZE" not in os.environ:
        raise ValueError("host_groups() without ranks_per_host reads GROUP_RANK / LOCAL_WORLD_SIZE, which torchrun "
                         "sets; outside torchrun pass ranks_per_host=G (the ranks of one host)")
    key = os.environ.get("GROUP_RANK")
    mine = (int(key) if key is not None else -1, dist.get_rank())
    everyone: List = [None] * world
    dist.all_gather_object(everyone, mine)
    if key is None:  # no node id: contiguous blocks of LOCAL_WORLD_SIZE ranks, torchrun's numbering
        size = int(os.environ["LOCAL_WORLD_SIZE"])
        return [list(range(s, min(s + size, world))) for s in range(0, world, size)]
    hosts: dict = {}
    for node, rank in everyone:
        hosts.setdefault(node, []).append(rank)
    return [sorted(ranks) for _, ranks in sorted(hosts.items(), key=lambda kv: min(kv[1]))]


def host_groups(ranks_per_host: Optional[int] = None) -> Tuple[object, object]:
    """``(host_group, world_group)`` of this rank, after ``torch.distributed.init_process_group``.

    ``host_group`` is a new process group of the ranks on this rank's host (the split group: pass it
    as ``gsplit.DataLoader(group=...)``); ``world_group`` is the default group (every rank: pass it as
    ``replica_group=`` and to :func:`gsplit.allreduce_gradients`). Under torchrun the hosts are its
    nodes (``GROUP_RANK``); ``ranks_per_host=G`` instead cuts the ranks into consecutive blocks of
    ``G`` (e.g. 2 "hosts" of 2 ranks on one machine). It is collective: every rank of the job must
    call it, in the same order relative to its other ``new_group`` calls, and every host must have
    the same number of ranks (the partition map has one part per rank of a host).

    Example:
        >>> host, world = gsplit.host_groups()     # in a script started by torchrun  # doctest: +SKIP
        >>> loader = gsplit.DataLoader(g, train_idx, sampler, partition=pmap, group=host,
        ...                            replica_group=world, use_ddp=True, batch_size=1024)  # doctest: +SKIP
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("host_groups() needs torch.distributed; call torch.distributed.init_process_group first "
                         "(torchrun sets the environment it reads)")
    world = dist.get_world_size()
    if ranks_per_host is not None:
        if ranks_per_host < 1 or world % ranks_per_host:
            raise ValueError(f"ranks_per_host={ranks_per_host} does not divide the {world} ranks of the job; "
                             f"pass the number of ranks of one host")
        hosts = [list(range(s, s + ranks_per_host)) for s in range(0, world, ranks_per_host)]
    else:
        hosts = _hosts_from_env(world)
    sizes = sorted({len(h) for h in hosts})
    if len(sizes) != 1:
        raise ValueError(f"the hosts run different numbers of ranks ({[len(h) for h in hosts]}); start the same "
                         f"number on every host (torchrun --nproc-per-node G): the partition map has one part per rank")
    me = dist.get_rank()
    mine = None
    for ranks in hosts:  # every rank creates every host's group, in the same order
        group = dist.new_group(ranks=ranks)
        if me in ranks:
            mine = group
    return mine, dist.group.WORLD


def replica_layout(group, replica_group) -> Tuple[int, int]:
    """``(num_replicas, replica_rank)``: how many split groups like ``group`` make up ``replica_group``
    and which one this rank's is (replicas numbered by their lowest global rank).

    Collective over ``replica_group`` (one ``all_gather_object``); checks that the split groups are
    disjoint, equally large and cover ``replica_group`` exactly.

    Example:
        >>> replica_layout(None, None)     # no process group: one replica
        (1, 0)
    """
    if replica_group is None and not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    replica_comm = replica_group if isinstance(replica_group, Communicator) else Communicator(replica_group)
    mine = tuple(group_ranks(group))
    groups = sorted(set(tuple(g) for g in replica_comm.all_gather_object(mine)), key=min)
    everyone = sorted(r for g in groups for r in g)
    if everyone != sorted(group_ranks(replica_group)) or len({len(g) for g in groups}) != 1:
        raise ValueError(f"the split groups {groups} do not cut replica_group (ranks {group_ranks(replica_group)}) "
                         f"into disjoint groups of equal size; pass group=<this host's group> and "
                         f"replica_group=<every rank of the job>, e.g. from gsplit.host_groups()")
    return len(groups), groups.index(mine)


def check_same_everywhere(values: Sequence, replica_group, what: str) -> None:
    """Raise if ``values`` (e.g. a partition map's hash) differ between the ranks of ``replica_group``."""
    comm = replica_group if isinstance(replica_group, Communicator) else Communicator(replica_group)
    seen = comm.all_gather_object(tuple(values))
    if len(set(seen)) != 1:
        bad = [r for r, v in enumerate(seen) if v != seen[0]]
        raise ValueError(f"{what} differs between ranks (ranks {bad} disagree with rank 0); give every host the "
                         f"same one, e.g. one file every host reads")
