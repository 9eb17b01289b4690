"""Nothing a single-host run opens is reachable from the network, and no file a user points gsplit at runs code.

Sockets: the ranks read their own listening sockets from ``/proc/net/tcp*`` while the job is alive (the
socket inodes of ``/proc/self/fd``), also with a host name that resolves to a LAN address (a private UTS
and mount namespace with its own ``/etc/hosts``, as root), where gloo used to listen on that address.

Files: every reader of user-pointed files gets a crafted pickle whose ``__reduce__`` would create a
marker file; the reader must refuse it and the marker must not appear.
"""

import os
import pickle
import shutil
import socket
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


# ---------------------------------------------------------------- sockets
def _listening_addresses() -> list:
    """``ip:port`` of every TCP socket of this process in state LISTEN (from /proc/net/tcp and tcp6)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                addr_hex, port_hex = local.split(":")
                raw = bytes.fromhex(addr_hex)
                if width == 8:
                    addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
                else:
                    addr = socket.inet_ntop(socket.AF_INET6, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
                out.append(f"{addr}:{int(port_hex, 16)}")
    return out


def listening_worker(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)  # the gloo pairs are connected: every socket the job opens is open now
    found = _listening_addresses()
    dist.all_reduce(t)
    return {"rank": rank, "listening": found, "hostname": socket.gethostname()}


def _is_loopback(addr_port: str) -> bool:
    addr = addr_port.rsplit(":", 1)[0]
    return addr.startswith("127.") or addr in ("::1", "::ffff:127.0.0.1") or addr.startswith("::ffff:127.")


@linux_only
def test_single_host_ranks_listen_on_loopback_only():
    from gsplit.launcher import launch

    results = launch(listening_worker, 2, devices="cpu", timeout=300)
    for r in results:
        assert r["listening"], r  # the ranks do listen (gloo pairs); otherwise the test proves nothing
        assert all(_is_loopback(a) for a in r["listening"]), r


_NETNS_SCRIPT = textwrap.dedent("""
    import json, socket, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from gsplit.launcher import launch
    from test_security import listening_worker
    if __name__ == "__main__":
        print("RESULT " + json.dumps({{"resolves": socket.gethostbyname(socket.gethostname()),
                                      "ranks": launch(listening_worker, 2, devices="cpu", timeout=300)}}))
""")


def _lan_address():
    """A non-loopback IPv4 address of this machine, or None."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        addr = line.split()[3].split("/")[0]
        if not addr.startswith("127."):
            return addr
    return None


@pytest.mark.slow
@linux_only
def test_a_hostname_that_resolves_to_the_lan_does_not_open_the_ranks_to_it(tmp_path):
    lan = _lan_address()
    if os.geteuid() != 0 or shutil.which("unshare") is None or lan is None:
        pytest.skip("needs root, unshare and a non-loopback address to simulate a server's host name")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{lan} gsplit-test-host\n")
    script = tmp_path / "run.py"
    script.write_text(_NETNS_SCRIPT.format(root=str(ROOT), tests=str(Path(__file__).resolve().parent)))
    shell = (f"hostname gsplit-test-host && mount --bind {hosts} /etc/hosts && "
             f"{sys.executable} {script}")
    proc = subprocess.run(["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "unshare" in proc.stderr and "Operation not permitted" in proc.stderr:
        pytest.skip(f"unshare refused here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["resolves"] == lan  # the simulation holds: the host name points at the LAN address
    for r in result["ranks"]:
        assert r["hostname"] == "gsplit-test-host" and r["listening"], r
        assert all(_is_loopback(a) for a in r["listening"]), r


def test_the_launcher_chooses_the_loopback_interface_for_gloo_and_nccl(monkeypatch):
    import importlib

    launch_mod = importlib.import_module("gsplit.launcher.rendezvous")

    env = {}
    launch_mod._bind_to_loopback("127.0.0.1", env)
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == launch_mod._loopback_interface()
    other = {}
    launch_mod._bind_to_loopback("10.1.2.3", other)  # many hosts: the user's choice (env) stands
    assert other == {}


# ---------------------------------------------------------------- files that must not run code
class _Payload:
    """Unpickling this creates the marker file: what a crafted dataset, map or checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _assert_refused(call, marker: Path, match: str):
    with pytest.raises(ValueError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
    assert not marker.exists(), "the crafted file ran code"


def test_ogb_processed_file_cannot_run_code(tmp_path):
    pytest.importorskip("ogb")
    from gsplit.datasets import load

    marker = tmp_path / "pwned"
    processed = tmp_path / "root" / "ogbn_arxiv" / "processed"
    processed.mkdir(parents=True)
    torch.save({"graph": _Payload(marker), "labels": np.zeros(3)}, processed / "data_processed", pickle_protocol=4)
    _assert_refused(lambda: load("ogbn-arxiv", root=str(tmp_path / "root"), download=False), marker,
                    "posix.system|os.system|may be crafted")


def test_ogb_numpy_files_still_load(tmp_path):
    pytest.importorskip("ogb")
    from gsplit.datasets.ogb import load_numpy_pickle

    graph = {"edge_index": np.array([[0, 1], [1, 2]]), "node_feat": np.ones((3, 2), np.float32), "num_nodes": 3,
             "edge_feat": None}
    torch.save({"graph": [graph], "labels": np.array([[1.0], [np.nan], [0.0]])}, tmp_path / "f", pickle_protocol=4)
    back = load_numpy_pickle(tmp_path / "f")
    assert back["graph"][0]["num_nodes"] == 3 and back["graph"][0]["node_feat"].dtype == np.float32
    assert np.isnan(back["labels"][1, 0])


def _pickled_npy(path: Path, marker: Path) -> None:
    arr = np.empty(1, dtype=object)
    arr[0] = _Payload(marker)
    with open(path, "wb") as f:
        np.save(f, arr, allow_pickle=True)


def test_npz_with_a_pickled_array_cannot_run_code(tmp_path):
    from gsplit.datasets import load_npz

    marker = tmp_path / "pwned"
    obj = np.empty(1, dtype=object)
    obj[0] = _Payload(marker)
    np.savez(tmp_path / "g.npz", adj_data=np.ones(1), adj_indices=np.array([1]), adj_indptr=np.array([0, 1, 1]),
             adj_shape=np.array([2, 2]), labels=obj)
    with pytest.raises(ValueError):
        load_npz(tmp_path / "g.npz")
    assert not marker.exists()


def test_map_weights_and_graph_files_cannot_run_code(tmp_path):
    import gsplit
    from gsplit.partitioning.weights import PresampleWeights

    marker = tmp_path / "pwned"
    g = gsplit.Graph.from_edges([0, 1, 2], [1, 2, 0])
    pmap = gsplit.PartitionMap.from_tensor(torch.tensor([0, 1, 1]), num_parts=2, graph=g)
    pmap.save(tmp_path / "map")
    _pickled_npy(tmp_path / "map" / "assignment.npy", marker)
    _assert_refused(lambda: gsplit.PartitionMap.load(tmp_path / "map"), marker, "assignment.npy")
    g.save(tmp_path / "graph")
    victim = next((tmp_path / "graph").glob("*.npy"))
    _pickled_npy(victim, marker)
    _assert_refused(lambda: gsplit.Graph.load(tmp_path / "graph"), marker, victim.name)
    sampler = gsplit.NeighborSampler([2])
    weights = gsplit.presample(g, torch.tensor([0, 1]), sampler, batch_size=2, epochs=1)
    weights.save(tmp_path / "w")
    victim = next((tmp_path / "w").glob("*.npy"))
    _pickled_npy(victim, marker)
    _assert_refused(lambda: PresampleWeights.load(tmp_path / "w"), marker, victim.name)


def test_a_crafted_checkpoint_cannot_run_code(tmp_path):
    import hashlib
    import json

    from gsplit.run.checkpoint import load_checkpoint, save_checkpoint

    marker = tmp_path / "pwned"
    folder = save_checkpoint(tmp_path, torch.nn.Linear(2, 1).state_dict(), None, {"step": 1})
    torch.save({"model": _Payload(marker), "optimizer": None, "counters": {}, "rng": None}, folder / "state.pt")
    meta = json.loads((folder / "meta.json").read_text())  # a matching checksum: the unpickler itself must refuse
    meta["files"]["state.pt"] = hashlib.sha256((folder / "state.pt").read_bytes()).hexdigest()
    (folder / "meta.json").write_text(json.dumps(meta))
    _assert_refused(lambda: load_checkpoint(tmp_path), marker, "state.pt cannot be read")


def test_no_reader_in_the_package_unpickles():
    """The whole package: no weights_only=False, no pickle.load(s) of files, no allow_pickle=True."""
    offenders = []
    for path in (ROOT / "gsplit").rglob("*.py"):
        text = path.read_text()
        for needle in ("weights_only=False", "allow_pickle=True", "pickle.load(", "np.load(p)", "torch.load(f)"):
            if needle in text:
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert not offenders, offenders
