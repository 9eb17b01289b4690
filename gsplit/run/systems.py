"""The parallel training systems the harness runs, as objects: what each decides (its loaders, its loss,
its inference map, the model it trains); :func:`gsplit.run.trainer.train_rank` does the rest alike.

``split`` (split parallelism, :class:`gsplit.DataLoader`), ``dp`` (the data-parallel baseline,
:class:`gsplit.baselines.DataParallelLoader`) and ``full`` (full-graph training, split-parallel,
:class:`gsplit.FullGraphLoader`); :data:`SYSTEMS` maps ``TrainConfig.system`` to them.
"""

from __future__ import annotations

from typing import Optional

import torch

from gsplit.baselines.data_parallel import DataParallelLoader
from gsplit.fullgraph.cobatch import CoBatchLoader, CoBatchSource, full_graph_loader
from gsplit.fullgraph.loader import FullGraphLoader, layer_dims, recompute_layers
from gsplit.fullgraph.preload import PreloadLoader
from gsplit.minibatch.loader import DataLoader
from gsplit.nn.loss import split_cross_entropy
from gsplit.sampling.block import Block


class System:
    """What a parallel training system decides: its loaders and its loss. The harness does the rest alike."""

    name = ""
    partitioned = False
    """Whether the ranks split each mini-batch by a partition map (and so need one, and form split groups)."""

    def splits_by_host(self, cfg) -> bool:
        """Whether with several hosts (``cfg.ranks_per_host``) each host is a split group of its own (the ranks
        then get ``group=`` their host's group and ``replica_group=`` every rank)."""
        return self.partitioned

    def make_loader(self, cfg, dataset, graph, indices, owner, device, sampler, shuffle: bool, **options):
        """A loader over ``indices`` of ``dataset`` whose graph is ``graph`` (the dataset's, maybe on the GPU);
        ``cfg`` is the run's :class:`gsplit.run.trainer.TrainConfig`."""
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, block: Block, world_size: int) -> torch.Tensor:
        """This rank's loss; its gradients are summed over ranks by :func:`allreduce_gradients`."""
        raise NotImplementedError

    def inference_map(self, owner: Optional[torch.Tensor], num_nodes: int, world_size: int) -> torch.Tensor:
        """Which rank computes each vertex in the final layer-wise evaluation (any map gives the same result)."""
        return torch.arange(num_nodes) * world_size // num_nodes  # contiguous ranges of vertex ids

    def prepare_model(self, cfg, model, loader):
        """The model as this system trains it, checked against the training loader before the first forward."""
        if cfg.recompute:
            recompute_layers(model)
        return model


class SplitSystem(System):
    """Split parallelism: one global mini-batch split by the partition map (:class:`gsplit.DataLoader`)."""

    name = "split"
    partitioned = True

    def make_loader(self, cfg, dataset, graph, indices, owner, device, sampler, shuffle, **options):
        options.setdefault("features", dataset.features)
        # several hosts: options carry group= (this host's split group) and replica_group= (every rank)
        return DataLoader(graph, indices, sampler, partition=owner, device=device, use_ddp=True,
                          ddp_seed=cfg.seed, batch_size=cfg.batch_size, shuffle=shuffle, labels=dataset.labels,
                          **options)

    def loss(self, logits, labels, block, world_size):
        return split_cross_entropy(logits, labels, block)  # sum / global mini-batch: ranks' losses add up

    def inference_map(self, owner, num_nodes, world_size):
        # the training map: each rank computes the vertices it owns, as in training
        return owner if owner is not None else super().inference_map(owner, num_nodes, world_size)


class DataParallelSystem(System):
    """Data parallelism, DGL's ``use_ddp=True`` (:class:`gsplit.baselines.DataParallelLoader`)."""

    name = "dp"

    def make_loader(self, cfg, dataset, graph, indices, owner, device, sampler, shuffle, **options):
        # prefetch and host groups are split parallelism's (dp spans every rank); the features (a shared store),
        # the cache and macrobatches apply to both
        return DataParallelLoader(graph, indices, sampler, device=device, use_ddp=True, ddp_seed=cfg.seed,
                                  batch_size=cfg.batch_size, shuffle=shuffle,
                                  features=options.get("features", dataset.features), labels=dataset.labels,
                                  cache_size=options.get("cache_size", 0), cache_weights=options.get("cache_weights"),
                                  macrobatch=options.get("macrobatch", 1))

    def loss(self, logits, labels, block, world_size):
        if labels.numel() == 0:  # a rank whose micro-batch is empty (end of epoch): the mean would be NaN
            return logits.sum() * 0.0
        # DDP semantics: mean over the micro-batch, gradients averaged (summed, then / world size)
        return torch.nn.functional.cross_entropy(logits, labels) / world_size


class FullGraphSystem(SplitSystem):
    """Full-graph training, split-parallel (:class:`gsplit.FullGraphLoader`): every epoch is one step over all
    vertices and all in-edges; the loss counts the training vertices. ``cfg.fanouts`` give the depth only."""

    name = "full"

    def splits_by_host(self, cfg) -> bool:
        # "span": one split group of every rank of every host; "preload": each host its own (shared preloading)
        return getattr(cfg, "host_mode", "span") == "preload"

    def make_loader(self, cfg, dataset, graph, indices, owner, device, sampler, shuffle, **options):
        features = options.get("features", dataset.features)
        if isinstance(features, CoBatchSource):  # evaluation beside co-batched training: co-batches of its vertices
            targets = features.local_targets(indices)
            return CoBatchLoader(features.graph, len(cfg.fanouts), targets=targets, partition=features.owner,
                                 num_co_batches=min(features.num_co_batches, max(targets.numel(), 1)),
                                 features=features, labels=features.labels, group=options.get("group"),
                                 device=device, seed=cfg.seed)
        if "model" in options and (cfg.co_batches != 1 or cfg.memory_limit is not None):
            # the training loader: the whole share at once where it fits the budget, else co-batches of it
            model = options["model"]
            params = list(model.parameters())
            preload = options.get("replica_group") is not None
            if preload and not self.splits_by_host(cfg):
                raise ValueError("full-graph training over host groups is host_mode='preload'; pass it, or no "
                                 "host groups for one split group spanning every host")
            return full_graph_loader(graph, len(cfg.fanouts), features=features, labels=dataset.labels,
                                     train_idx=indices, dims=layer_dims(model), co_batches=cfg.co_batches,
                                     partition=None if preload else owner, host_map=owner if preload else None,
                                     group=options.get("group"), replica_group=options.get("replica_group"),
                                     device=device, memory_limit=cfg.memory_limit or "auto", recompute=cfg.recompute,
                                     dtype_bytes=params[0].element_size() if params else 4,
                                     external_hops=cfg.external_hops, external_fanout=cfg.external_fanout,
                                     seed=cfg.seed)
        if options.get("replica_group") is not None:
            if not self.splits_by_host(cfg):
                raise ValueError("full-graph training over host groups is host_mode='preload'; pass it, or no "
                                 "host groups for one split group spanning every host")
            # owner: the host map; each host preloads its vertices' halo and splits it over its ranks
            return PreloadLoader(graph, len(cfg.fanouts), host_map=owner, group=options["group"],
                                 replica_group=options["replica_group"], features=features, labels=dataset.labels,
                                 train_idx=indices, device=device, external_hops=cfg.external_hops,
                                 external_fanout=cfg.external_fanout, seed=cfg.seed)
        if self.splits_by_host(cfg):
            raise ValueError("host_mode='preload' trains several hosts, but this job has one (no host groups); "
                             "leave host_mode at 'span' on one host")
        # evaluation loaders get the training loader's feature_store: its built blocks, shared
        return FullGraphLoader(graph, len(cfg.fanouts), partition=owner, features=options.get("features",
                               dataset.features), labels=dataset.labels, train_idx=indices, device=device,
                               group=options.get("group"))

    def prepare_model(self, cfg, model, loader):
        model = super().prepare_model(cfg, model, loader)
        loader.check_model(model)  # split-safe layers, depth, and activations that fit, before allocating them
        return model


SYSTEMS = {s.name: s for s in (SplitSystem(), DataParallelSystem(), FullGraphSystem())}
"""The systems ``TrainConfig.system`` names."""
