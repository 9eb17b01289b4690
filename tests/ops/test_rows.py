"""gsplit.ops.rows: the compiled row gather and scatter are torch's index_select / index_copy_, bit for bit."""

import pytest
import torch

from gsplit.ops import aggregate as agg
from gsplit.ops.rows import gather_rows, scatter_rows_


def _require_extension():
    if not agg.extension_available():
        pytest.skip("the C++ extension is not built here (no compiler/ninja, or GSPLIT_NO_EXTENSIONS set)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 5000])
def test_gather_and_scatter_equal_torch(dtype, n):
    _require_extension()
    g = torch.Generator().manual_seed(n)
    x = torch.randn(6000, 33, dtype=dtype, generator=g)
    idx = torch.randint(0, 6000, (n,), generator=g)  # repeats allowed in a gather
    assert torch.equal(gather_rows(x, idx), x.index_select(0, idx))
    pos = torch.randperm(6000, generator=g)[:n]  # distinct places for a scatter
    rows = torch.randn(n, 33, dtype=dtype, generator=g)
    out = torch.zeros(6000, 33, dtype=dtype)
    assert scatter_rows_(out, pos, rows) is out
    assert torch.equal(out, torch.zeros(6000, 33, dtype=dtype).index_copy_(0, pos, rows))


def test_non_contiguous_rows_and_other_dtypes_take_the_right_path():
    """A transposed (non-contiguous) source is read correctly; integer rows and a non-contiguous destination go
    to torch's ops, with the same result."""
    _require_extension()
    x = torch.randn(20, 8).t()  # [8, 20], not contiguous
    idx = torch.tensor([7, 0, 3])
    assert torch.equal(gather_rows(x, idx), x.index_select(0, idx))
    xi = torch.arange(40).view(10, 4)
    assert torch.equal(gather_rows(xi, idx), xi.index_select(0, idx))
    out = torch.zeros(4, 8).t()  # [8, 4] non-contiguous: index_copy_ in place
    scatter_rows_(out, torch.tensor([1, 6]), torch.ones(2, 4))
    assert out.sum() == 8 and out[1].sum() == 4 and out[6].sum() == 4


def test_out_of_range_indices_raise_as_torch_does():
    _require_extension()
    x = torch.randn(5, 3)
    with pytest.raises(IndexError, match=r"gather_rows: an index is outside \[0, 5\): min 0, max 5"):
        gather_rows(x, torch.tensor([0, 5]))
    with pytest.raises(IndexError, match=r"scatter_rows_: an index is outside \[0, 5\): min -1"):
        scatter_rows_(x, torch.tensor([-1]), torch.randn(1, 3))


def test_place_rows_writes_each_row_once_and_its_gradient_reads_them_back():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([5, 0, 2, 3])
    from gsplit.ops.rows import place_rows

    out = place_rows(x, 6, pos)
    assert out.shape == (6, 3) and torch.equal(out[pos], x.detach())
    grad = torch.arange(18.0, dtype=torch.float64).view(6, 3)
    out.backward(grad)
    assert torch.equal(x.grad, grad[pos])
    with pytest.raises(ValueError, match=r"x has 4 rows but pos has shape \(3,\); pass one place per row"):
        place_rows(x, 6, pos[:3])
