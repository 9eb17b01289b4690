"""The links between the ranks of one host, and between a GPU and host memory: one small table, every number sourced.

A collective costs a per-call latency plus bytes over a bandwidth, with NCCL's "bus bandwidth" convention
(nccl-tests, ``doc/PERFORMANCE.md``): an all-to-all in which every rank sends ``b`` bytes to the others takes
``b / busbw``; an all-reduce of ``S`` bytes over ``n`` ranks takes ``2 (n - 1) / n * S / busbw``. Loading
input features from pinned host memory through UVA costs bytes over ``host_bw`` per GPU.

Sources (public figures; "measured" means this project's own runs):

[nv-h100]  NVIDIA H100 Tensor Core GPU datasheet / NVLink page: fourth-generation NVLink, 18 links,
           900 GB/s bidirectional per GPU (450 GB/s each way) through NVSwitch in HGX/DGX H100 8-GPU hosts.
[nvlink-wiki] en.wikipedia.org/wiki/NVLink (mirror wikimili.com/en/NVLink): NVLink 2.0 on V100 SXM2, 6 links
           x 50 GB/s = 300 GB/s bidirectional per GPU; NVLink 4.0 on H100, 18 links = 900 GB/s.
[dell-v100] Dell EMC Ready Solutions for AI, Deep Learning with NVIDIA, reference guide v1.0, p. 17: V100-SXM2
           "NVLink uni-direction bandwidth 150 GB/s"; each NVLink 25 GB/s per direction; PCIe 3 x16 16 GB/s.
[nccl-2169] github.com/NVIDIA/nccl/issues/2169: nccl-tests ``alltoall_perf``, 4 x H100 80GB HBM3 in one host,
           500 MB: algbw 447-451 GB/s, busbw 335-338 GB/s.
[nccl-tests-272] github.com/NVIDIA/nccl-tests/issues/272: ``all_reduce_perf`` on 8 x H200 (NVLink 4) in one
           host: peak busbw 475 GB/s; [nccl-tests-290] (github.com/NVIDIA/nccl-tests/issues/290), NVIDIA's reply:
           476 GB/s "in the expected range for H100" (NVLink SHARP); [nccl-1374] github.com/NVIDIA/nccl/issues/1374:
           NVLink4 SHARP all-reduce intra-node busbw 480 GB/s (GTC S62129).
[deepep-303] github.com/deepseek-ai/DeepEP/issues/303: nccl-tests all-to-all inside one NVLink host, 128 B to
           4 KB per rank: 10.3-11.1 us per call (the small-message latency floor).
[nccl-tests-68] github.com/NVIDIA/nccl-tests/issues/68: a 4 x V100 SXM2 host (Dell C4140) whose GPUs are all
           pairwise joined by 2 NVLinks (``NV2``): 50 GB/s each way per pair, 150 GB/s to the other three.
[pcie]     PCI-SIG: PCIe 3.0 8 GT/s, 4.0 16 GT/s, 5.0 32 GT/s per lane, 128b/130b: x16 = 15.8 / 31.5 / 63 GB/s
           each way.
[gsplit-h100] measured: experiments/results/gpu_h100/3_gpu_bench.json (2026-11-26, H100 80GB HBM3 on a PCIe 5
           host): pinned host-to-device copy 54.5 GB/s; gsplit's UVA feature gather 41.5 GB/s (76 % of it).

Links between hosts (:data:`INTER_LINKS`, ``gsplit estimate --hosts H --inter-link NAME``): one network port
of a host, its data rate times an efficiency (bytes of an NCCL collective per second of line rate):

[ibta]     InfiniBand Trade Association, InfiniBand roadmap (infinibandta.org): data rate per 4x port: QDR 32 Gb/s
           (40 Gb/s signalling, 8b/10b; the link of GraNNDis's cluster, Song et al., PACT '24, Table 2), EDR
           100, HDR 200, NDR 400 Gb/s (64b/66b already taken out). Adapters: Mellanox ConnectX-3 (QDR/FDR),
           NVIDIA ConnectX-5 (EDR), ConnectX-6 (HDR) and ConnectX-7 (NDR) product pages; a DGX H100 has 8
           ConnectX-7 ports for its compute fabric, one per GPU (NVIDIA DGX H100 user guide): ``--nics-per-host 8``.
[ieee-802.3] IEEE 802.3by (25 Gb/s Ethernet) and 802.3ba/802.3bj (100 Gb/s Ethernet): 25 and 100 Gb/s per port.
[nccl-tests-29] github.com/NVIDIA/nccl-tests/issues/29: NCCL's maintainer: "12.2 GB/s (for a 100Gbps card) is as
           good as you can get" (all-reduce busbw between two hosts over one EDR adapter: 0.98 of 12.5 GB/s).
[nccl-tests-150] github.com/NVIDIA/nccl-tests/issues/150: all_reduce_perf between two A100 hosts over HDR
           InfiniBand, one GPU each: 19-20 us for 8 B to 128 B (the small-message latency across hosts).

Assumed: InfiniBand at 0.9 of its data rate (RDMA, [nccl-tests-29] shows 0.98 at best), Ethernet at 0.8 (RoCE or
NCCL's socket transport; TCP, congestion control), latency 20 us over InfiniBand [nccl-tests-150] and 40 us over
Ethernet (assumed); the ports of a host shared by its GPUs' traffic across hosts, at full rate each (a
non-blocking switch).

What is not sourced is an assumption, said where it is used: the efficiency of all-to-all on V100 and PCIe
hosts (0.8 of the per-GPU link figure), the PCIe all-reduce bus bandwidth, and the small-message latency of
NVLink 2 and PCIe hosts (NCCL's protocol latency, as on NVLink 4, plus a few microseconds).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, Optional

GB = 1e9


@dataclass(frozen=True)
class Collective:
    """Cost of one collective: ``latency_s + bytes / bus_bw``."""

    latency_s: float
    """Seconds per call, whatever the size (protocol, launch, synchronisation)."""
    bus_bw: float
    """Bytes per second in NCCL's bus-bandwidth convention (see the module docstring)."""


@dataclass
class LinkProfile:
    """How the ranks of one host exchange data, and how each loads rows from host memory."""

    name: str
    """Key in :data:`LINKS` (or ``cpu-gloo`` for a calibrated CPU host)."""
    all_to_all: Dict[int, Collective]
    """Per world size: an all-to-all (the id exchanges and shuffles). A world size absent from the table uses
    the nearest one below it (and the largest one above the table)."""
    all_reduce: Dict[int, Collective]
    """Per world size: an all-reduce (the gradients)."""
    host_bw: float
    """Bytes per second one rank gathers input-feature rows from host memory at (GPU: UVA over PCIe; CPU: a gather)."""
    source: str = ""
    """Where the numbers come from."""
    notes: Dict[str, str] = field(default_factory=dict)
    """Assumptions, by field."""

    def _at(self, table: Dict[int, Collective], world_size: int) -> Collective:
        keys = sorted(table)
        below = [k for k in keys if k <= world_size]
        return table[below[-1] if below else keys[0]]

    def all_to_all_s(self, world_size: int, max_bytes: float) -> float:
        """Seconds of one all-to-all in which no rank sends or receives more than ``max_bytes`` (0 at world size 1)."""
        if world_size <= 1:
            return 0.0
        c = self._at(self.all_to_all, world_size)
        return c.latency_s + max_bytes / c.bus_bw

    def all_reduce_s(self, world_size: int, nbytes: float) -> float:
        """Seconds of one all-reduce of ``nbytes`` over ``world_size`` ranks (0 at world size 1)."""
        if world_size <= 1:
            return 0.0
        c = self._at(self.all_reduce, world_size)
        return c.latency_s + 2.0 * (world_size - 1) / world_size * nbytes / c.bus_bw

    def to_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LinkProfile":
        """Inverse of :meth:`to_dict`."""
        return cls(name=d["name"], all_to_all={int(k): Collective(**v) for k, v in d["all_to_all"].items()},
                   all_reduce={int(k): Collective(**v) for k, v in d["all_reduce"].items()}, host_bw=float(d["host_bw"]),
                   source=d.get("source", ""), notes=dict(d.get("notes", {})))


def _uniform(latency_s: float, bus_bw: float) -> Dict[int, Collective]:
    return {2: Collective(latency_s, bus_bw)}


LINKS: Dict[str, LinkProfile] = {
    "nvlink4": LinkProfile(
        name="nvlink4", all_to_all=_uniform(10.5e-6, 335 * GB), all_reduce=_uniform(10.5e-6, 475 * GB),
        host_bw=41.5 * GB,
        source="H100 SXM, NVSwitch (HGX/DGX H100): all-to-all busbw 335 GB/s [nccl-2169], all-reduce busbw "
               "475 GB/s [nccl-tests-272, nccl-tests-290, nccl-1374], 10.5 us small-message latency [deepep-303]; "
               "UVA feature gather 41.5 GB/s over PCIe 5 [gsplit-h100]",
        notes={"all_to_all": "measured at 4 GPUs and 500 MB; assumed the same at 2 and 8 GPUs (NVSwitch: every "
                             "pair at full speed)"}),
    "nvlink2": LinkProfile(
        name="nvlink2",
        # 4 GPUs pairwise NV2 (50 GB/s each way per pair) reach 150 GB/s to the others; x 0.8 efficiency (assumed).
        # 8 GPUs (DGX-1 hybrid cube-mesh, [nvlink-wiki]): each GPU has links to 4 of 7 peers, the other 3 pairs
        # go through PCIe 3 and other GPUs: assumed 4 x 25 GB/s x 0.8 for the linked peers, the slowest pair sets
        # the pace of a balanced all-to-all, so ~8 GB/s per unlinked peer x 7: ~56 GB/s (assumed).
        all_to_all={2: Collective(15e-6, 0.8 * 50 * GB), 4: Collective(15e-6, 0.8 * 150 * GB),
                    8: Collective(20e-6, 56 * GB)},
        all_reduce={2: Collective(15e-6, 0.8 * 50 * GB), 4: Collective(15e-6, 0.8 * 150 * GB),
                    8: Collective(20e-6, 0.8 * 150 * GB)},
        host_bw=0.76 * 15.8 * GB,
        source="V100 SXM2: 6 NVLink 2 links, 150 GB/s each way [dell-v100, nvlink-wiki]; 4-GPU host pairwise NV2 "
               "[nccl-tests-68]; host over PCIe 3 x16 (15.8 GB/s [pcie]) at the 76 % UVA efficiency measured on "
               "the H100 host [gsplit-h100]",
        notes={"all_to_all": "0.8 x the link figure (assumed); 8 GPUs: DGX-1 hybrid cube-mesh, pairs without a "
                             "direct link (assumed ~56 GB/s per rank)",
               "latency": "15-20 us (assumed: NCCL's protocol latency as on NVLink 4, plus a few us)"}),
    "pcie4": LinkProfile(
        name="pcie4", all_to_all=_uniform(20e-6, 0.8 * 31.5 * GB), all_reduce=_uniform(20e-6, 0.8 * 31.5 * GB),
        host_bw=0.76 * 31.5 * GB,
        source="PCIe 4.0 x16: 31.5 GB/s each way [pcie]; GPU-to-GPU through the PCIe switch at 0.8 of it (assumed); "
               "UVA at the 76 % measured on PCIe 5 [gsplit-h100]",
        notes={"all_to_all": "assumes a switch that gives every GPU its full x16 (no shared uplink)",
               "latency": "20 us (assumed)"}),
    "pcie5": LinkProfile(
        name="pcie5", all_to_all=_uniform(20e-6, 0.8 * 63 * GB), all_reduce=_uniform(20e-6, 0.8 * 63 * GB),
        host_bw=41.5 * GB,
        source="PCIe 5.0 x16: 63 GB/s each way [pcie]; GPU-to-GPU at 0.8 of it (assumed); UVA 41.5 GB/s measured "
               "[gsplit-h100]",
        notes={"all_to_all": "assumes a switch that gives every GPU its full x16 (no shared uplink)",
               "latency": "20 us (assumed)"}),
}
"""The GPU hosts ``gsplit estimate --link`` knows. CPU hosts are calibrated (:func:`gsplit.estimate.calibrate.transport_profile`)."""


@dataclass(frozen=True)
class InterLink:
    """A network port between hosts: ``gbit_s`` of data rate at ``efficiency``, ``latency_s`` per collective."""

    name: str
    """Key in :data:`INTER_LINKS`."""
    gbit_s: float
    """Data rate of one port, Gb/s (the generation's name: EDR 100, HDR 200, NDR 400)."""
    efficiency: float
    """Share of the data rate a collective's bytes get (assumed: see the module docstring)."""
    latency_s: float
    """Seconds per collective across hosts, whatever the size."""
    source: str = ""
    """Where the numbers come from."""

    @property
    def bytes_per_s(self) -> float:
        """Effective bytes per second of one port."""
        return self.gbit_s * 1e9 / 8 * self.efficiency


def _ib(gbit: float, generation: str, adapter: str) -> InterLink:
    return InterLink(name=f"ib-{generation.lower()}", gbit_s=gbit, efficiency=0.9, latency_s=20e-6,
                     source=f"InfiniBand 4x {generation} {gbit:g} Gb/s [ibta] ({adapter}); 0.9 of it (assumed; "
                            f"[nccl-tests-29] 0.98 at best); 20 us [nccl-tests-150]")


def _eth(gbit: float, standard: str) -> InterLink:
    return InterLink(name=f"eth-{gbit:g}g", gbit_s=gbit, efficiency=0.8, latency_s=40e-6,
                     source=f"{gbit:g} Gb/s Ethernet, IEEE {standard} [ieee-802.3]; 0.8 of it and 40 us (assumed: "
                            "RoCE or NCCL's sockets)")


INTER_LINKS: Dict[str, InterLink] = {link.name: link for link in (
    _ib(32, "QDR", "ConnectX-3"), _ib(100, "EDR", "ConnectX-5"), _ib(200, "HDR", "ConnectX-6"),
    _ib(400, "NDR", "ConnectX-7"),
    _eth(25, "802.3by"), _eth(100, "802.3ba/802.3bj"))}
"""The links between hosts ``gsplit estimate --hosts H --inter-link`` knows (one port; ``--nics-per-host`` ports)."""


def get_inter_link(name: str) -> InterLink:
    """The link between hosts named ``name`` (a key of :data:`INTER_LINKS`).

    Example:
        >>> get_inter_link("ib-hdr").bytes_per_s / 1e9                  # 200 Gb/s = 25 GB/s, at 0.9
        22.5
    """
    if name not in INTER_LINKS:
        raise ValueError(f"unknown link between hosts {name!r}; choose one of {', '.join(sorted(INTER_LINKS))}")
    return INTER_LINKS[name]


def get_link(name: str) -> LinkProfile:
    """The link named ``name`` (a key of :data:`LINKS`).

    Example:
        >>> round(get_link("nvlink4").all_to_all_s(8, 1e6) * 1e6, 1)     # 1 MB per rank: latency + 1 MB / 335 GB/s
        13.5
    """
    if name not in LINKS:
        raise ValueError(f"unknown link {name!r}; choose one of {', '.join(sorted(LINKS))}")
    return LINKS[name]


def default_device_for(link: str) -> str:
    """The GPU a link comes with in the table: V100 for NVLink 2, H100 otherwise."""
    return "v100" if link == "nvlink2" else "h100"


__all__ = ["Collective", "LinkProfile", "LINKS", "get_link", "default_device_for", "InterLink", "INTER_LINKS",
           "get_inter_link"]


def link_or_none(name: Optional[str]) -> Optional[LinkProfile]:
    """``get_link(name)``, or ``None`` for ``None``."""
    return None if name is None else get_link(name)
