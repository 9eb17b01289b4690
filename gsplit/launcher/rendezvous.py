"""Where the ranks of one host meet: a listening socket bound to one address only (the rendezvous store's),
and gloo's and NCCL's sockets kept on the loopback interface for a single-host job."""

from __future__ import annotations

import ipaddress
import logging
import os
import socket

log = logging.getLogger(__name__)


def _loopback_interface() -> str:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        names = []
    return next((n for n in names if n in ("lo", "lo0")), next((n for n in names if n.startswith("lo")), "lo"))


def _is_loopback_address(addr: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(addr) if addr == "localhost" else addr).is_loopback
    except (ValueError, OSError):
        return False


def _bind_to_loopback(master_addr: str, env) -> None:
    """Make gloo's and NCCL's listening sockets of a single-host job use the loopback interface.

    Without this, gloo binds the address the host name resolves to (a LAN address on most servers),
    so the ranks' sockets were reachable from the network although the rendezvous store is local. A
    rendezvous on a loopback ``master_addr`` means every rank is on this host; with another address
    (several hosts) the user's ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` choose the interface.
    """
    if not _is_loopback_address(master_addr):
        return
    lo = _loopback_interface()
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if env.get(var) not in (None, "", lo):
            log.warning("%s=%s ignored: the ranks of a single-host job listen on the loopback interface %s only",
                        var, env[var], lo)
        env[var] = lo


def _listen_socket(addr: str, port: int) -> socket.socket:
    """A listening TCP socket bound to ``addr`` only (torch's TCPStore would bind every interface)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if os.name == "posix":  # as servers do (and TCPStore does): connections in TIME_WAIT must not block a rebind
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock
