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

ROOT = Path(__file__).resolve().parents[1]
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
    from gsplit.launch import launch

    results = launch(listening_worker, 2, devices="cpu", timeout=60)
    for r in results:
        assert r["listening"], r  # the ranks do listen (gloo pairs); otherwise the test proves nothing
        assert all(_is_loopback(a) for a in r["listening"]), r


_NETNS_SCRIPT = textwrap.dedent("""
    import json, socket, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from gsplit.launch import launch
    from test_security import listening_worker
    if __name__ == "__main__":
        print("RESULT " + json.dumps({{"resolves": socket.gethostbyname(socket.gethostname()),
                                      "ranks": launch(listening_worker, 2, devices="cpu", timeout=60)}}))
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
    script.write_text(_NETNS_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests")))
    shell = (f"hostname gsplit-test-host && mount --bind {hosts} /etc/hosts && "
             f"{sys.executable} {script}")
    proc = subprocess.run(["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=120)
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

    launch_mod = importlib.import_module("gsplit.launch")

    env = {}
    launch_mod._bind_to_loopback("127.0.0.1", env)
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == launch_mod._loopback_interface()
    other = {}
    launch_mod._bind_to_loopback("10.1.2.3", other)  # many hosts: the user's choice (env) stands
    assert other == {}
