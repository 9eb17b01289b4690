"""On the real Linux kernel: a long-term pin of a private (copy-on-write) file mapping copies every page.

The NVIDIA driver registers host memory (``cudaHostRegister``) with ``pin_user_pages(FOLL_LONGTERM)``. No GPU
here, but io_uring's buffer registration takes the same kind of pin (``FOLL_LONGTERM``, through
``io_pin_pages``), so what the kernel does to a prepared dataset folder's ``np.load(mmap_mode="c")`` mapping
under such a pin is measured directly: one fault per 4 KiB page and a private anonymous copy of the whole
range (the file pages leave the process's resident set, as many anonymous pages enter it). That is why
gsplit never registers a memory-mapped table in place (gsplit.ops.pinning) and copies it into pinned memory
instead: registering it gives each rank a private copy anyway, made one fault at a time inside one driver
call. (io_uring pins writable; the driver's read-only registration reaches the same copy through
``gup_must_unshare``, which unshares page-cache pages of COW mappings for read-only long-term pins.)
"""

import ctypes
import mmap
import os
import sys

import numpy as np
import pytest

SYS_IO_URING_SETUP, SYS_IO_URING_REGISTER, IORING_REGISTER_BUFFERS = 425, 427, 0


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) * 1024
    return out


def _faults() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])  # minflt


def _longterm_pin(ptr: int, nbytes: int):
    """Pin ``[ptr, ptr + nbytes)`` long-term with io_uring; returns (ring fd, errno) or skips without io_uring."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = (ctypes.c_uint8 * 120)()
    ring = libc.syscall(SYS_IO_URING_SETUP, 4, params)
    if ring < 0:
        pytest.skip(f"io_uring is not available here (errno {ctypes.get_errno()})")
    iov = _Iovec(ptr, nbytes)
    rc = libc.syscall(SYS_IO_URING_REGISTER, ring, IORING_REGISTER_BUFFERS, ctypes.byref(iov), 1)
    return ring, (ctypes.get_errno() if rc < 0 else 0)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64",
                    reason="io_uring syscall numbers of x86-64 Linux")
@pytest.mark.parametrize("private_file", [True, False], ids=["private-file-mapping", "anonymous"])
def test_a_longterm_pin_of_a_private_file_mapping_copies_every_page(tmp_path, private_file):
    size = 64 << 20
    if private_file:
        path = tmp_path / "features.npy"
        path.write_bytes(b"\1" * size)
        fd = os.open(path, os.O_RDWR)
        m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)  # np.load "c"
        os.close(fd)
    else:
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = np.frombuffer(m, dtype=np.uint8)
    if private_file:
        int(view[::4096].sum())  # every page resident (read faults: the page cache's pages) before the pin
    else:
        view[::4096] = 1  # every page allocated (a read fault would map the shared zero page)
    before, faults = _status(), _faults()
    ring, err = _longterm_pin(view.ctypes.data, size)
    try:
        after, new_faults = _status(), _faults() - faults
    finally:
        os.close(ring)
    assert err == 0, f"io_uring refused the long-term pin (errno {err})"
    anon = (after["RssAnon"] - before["RssAnon"]) / size
    if private_file:
        assert new_faults >= size // 4096 * 0.99  # one fault per page
        assert anon >= 0.99 and (before["RssFile"] - after["RssFile"]) / size >= 0.99  # a private copy of all
    else:
        assert new_faults < 100 and abs(anon) < 0.01  # anonymous memory is pinned where it is
    del view
    m.close()
