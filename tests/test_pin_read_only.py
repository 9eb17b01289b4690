"""Pinning in place registers read-only, so a prepared folder's copy-on-write mapping stays shared.

CuPy is replaced by a fake that records ``cudaHostRegister``'s flags (no GPU here): what is tested is
which registrations ``gsplit.ops.cuda.pin_in_place`` asks for and when it falls back.
"""

import sys
import types

import numpy as np
import pytest
import torch

from gsplit.ops import cuda

READ_ONLY = 8


def _fake_cupy(read_only_supported: bool):
    calls = []

    class CUDARuntimeError(RuntimeError):
        pass

    def host_register(ptr, nbytes, flags):
        calls.append(flags)
        if flags & READ_ONLY and not read_only_supported:
            raise CUDARuntimeError("cudaErrorNotSupported: operation not supported")

    runtime = types.SimpleNamespace(
        hostRegister=host_register, hostUnregister=lambda ptr: None, CUDARuntimeError=CUDARuntimeError,
        pointerGetAttributes=lambda ptr: types.SimpleNamespace(devicePointer=ptr))
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(runtime=runtime)
    return module, calls


def _mapped_table(tmp_path):
    np.save(tmp_path / "features.npy", np.ones((256, 64), dtype=np.float32))
    return torch.from_numpy(np.load(tmp_path / "features.npy", mmap_mode="c"))


def test_pinning_asks_for_a_read_only_registration(monkeypatch, tmp_path):
    fake, calls = _fake_cupy(read_only_supported=True)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert cuda.pin_in_place(_mapped_table(tmp_path))
    assert calls == [1 | 2 | READ_ONLY]


def test_without_read_only_support_anonymous_memory_is_pinned_writable(monkeypatch):
    fake, calls = _fake_cupy(read_only_supported=False)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert cuda.pin_in_place(torch.randn(1000, 16))
    assert calls == [1 | 2 | READ_ONLY, 1 | 2]


def test_without_read_only_support_a_copy_on_write_file_mapping_is_not_pinned(monkeypatch, tmp_path, caplog):
    """Writable pinning would break copy-on-write on every page: a private copy of the table per rank."""
    table = _mapped_table(tmp_path)
    assert cuda.private_file_mapping(table.data_ptr(), table.numel() * 4) == str(tmp_path / "features.npy")
    fake, calls = _fake_cupy(read_only_supported=False)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with caplog.at_level("WARNING"):
        assert not cuda.pin_in_place(table, what="feature table")
    assert calls == [1 | 2 | READ_ONLY]
    assert "private copy" in caplog.text and "features.npy" in caplog.text


@pytest.mark.parametrize("make", [lambda: torch.randn(4096, 64), lambda: torch.randn(4096, 64).share_memory_()])
def test_anonymous_and_shared_memory_are_not_private_file_mappings(make):
    t = make()
    assert cuda.private_file_mapping(t.data_ptr(), t.numel() * 4) is None
