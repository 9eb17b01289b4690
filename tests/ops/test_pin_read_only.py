"""Pinning in place registers read-only, and never registers a prepared folder's copy-on-write file mapping.

CuPy is replaced by a fake that records ``cudaHostRegister``'s flags (no GPU here): what is tested is
which registrations ``gsplit.ops.cuda.pin_in_place`` asks for and when it falls back.
"""

import numpy as np
import pytest
import torch

from fake_cupy import FakeRuntime
from gsplit.ops import cuda, pinning

READ_ONLY = 8


def _mapped_table(tmp_path):
    np.save(tmp_path / "features.npy", np.ones((256, 64), dtype=np.float32))
    return torch.from_numpy(np.load(tmp_path / "features.npy", mmap_mode="c"))


def test_pinning_asks_for_a_read_only_registration(monkeypatch):
    rt = FakeRuntime(read_only=True).install(monkeypatch)
    assert cuda.pin_in_place(torch.randn(1000, 16))
    assert [c[3] for c in rt.register_calls()] == [1 | 2 | READ_ONLY]


def test_without_read_only_support_anonymous_memory_is_pinned_writable(monkeypatch):
    rt = FakeRuntime(read_only=False).install(monkeypatch)
    assert cuda.pin_in_place(torch.randn(1000, 16))
    assert [c[3] for c in rt.register_calls()] == [1 | 2 | READ_ONLY, 1 | 2]


@pytest.mark.parametrize("read_only", [True, False])
def test_a_copy_on_write_file_mapping_is_never_registered(monkeypatch, tmp_path, caplog, read_only):
    """Even read-only, a long-term pin of a private file mapping unshares every page (a private copy per rank,
    made one page fault at a time inside the driver call): it is not asked for at all."""
    table = _mapped_table(tmp_path)
    where = pinning.backing(table.data_ptr(), table.numel() * 4)
    assert where.kind == "file" and where.private and where.path == str(tmp_path / "features.npy")
    rt = FakeRuntime(read_only=read_only).install(monkeypatch)
    with caplog.at_level("WARNING"):
        assert not cuda.pin_in_place(table, what="feature table")
    assert rt.register_calls() == []
    assert "copy-on-write" in caplog.text and "features.npy" in caplog.text


@pytest.mark.parametrize("make", [lambda: torch.randn(4096, 64), lambda: torch.randn(4096, 64).share_memory_()])
def test_anonymous_and_shared_memory_are_not_file_mappings(make):
    t = make()
    assert pinning.backing(t.data_ptr(), t.numel() * 4).kind in ("anonymous", "shared-memory")
