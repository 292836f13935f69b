"""The buffers a compiled generator keeps between calls: zeroed views at fixed addresses, growing
for a larger batch; rows compacted in place; static-address marks only where asked for; and the
one-call-at-a-time lease."""

import pytest
import torch

from eagle3_ext.draft.cache import compact_rows
from eagle3_ext.compiled.buffer_pool import BufferPool


def _static(t):
    return getattr(t, "_dynamo_static_input_type", None)


def test_rows_are_zeroed_views_of_one_buffer_per_shape():
    pool = BufferPool()
    a = pool.rows("k", (3, 4, 2), torch.float32, "cpu")
    assert a.shape == (3, 4, 2) and not a.any()
    a.fill_(7.0)
    b = pool.rows("k", (2, 4, 2), torch.float32, "cpu")      # a smaller batch: the first rows, zeroed
    assert b.data_ptr() == a.data_ptr() and b.shape == (2, 4, 2) and not b.any()
    assert (a[2] == 7.0).all()                               # rows past the batch are left alone
    c = pool.rows("k", (3, 4, 2), torch.float32, "cpu")
    assert c.data_ptr() == a.data_ptr() and not c.any()
    # Another name or another dtype: another buffer, the first one kept.
    v = pool.rows("v", (3, 4, 2), torch.float32, "cpu")
    k64 = pool.rows("k", (3, 4, 2), torch.float64, "cpu")
    assert len({a.data_ptr(), v.data_ptr(), k64.data_ptr()}) == 3
    assert pool.rows("k", (3, 4, 2), torch.float32, "cpu").data_ptr() == a.data_ptr()
    assert pool.nbytes == 2 * 3 * 8 * 4 + 3 * 8 * 8
    d = pool.rows("k", (5, 4, 2), torch.float32, "cpu")      # a larger batch: the buffer grows
    assert d.shape == (5, 4, 2) and pool.rows("k", (1, 4, 2), torch.float32, "cpu").data_ptr() == d.data_ptr()
    # Other inner dimensions (another capacity) replace the name's buffer: the memory held is bounded.
    e = pool.rows("k", (2, 6, 2), torch.float32, "cpu")
    assert e.shape == (2, 6, 2) and pool.nbytes == 2 * 12 * 4 + 3 * 8 * 4 + 3 * 8 * 8
    assert pool.rows("k", (2, 6, 2), torch.float32, "cpu").data_ptr() == e.data_ptr()


def test_adopt_keeps_the_values_and_scalars_stay_scalars():
    pool = BufferPool()
    src = torch.arange(6.0).view(2, 3)
    kept = pool.adopt("x", src)
    assert torch.equal(kept, src) and kept.data_ptr() != src.data_ptr()
    assert pool.adopt("x", src + 1).data_ptr() == kept.data_ptr()
    length = pool.adopt("len", torch.tensor(5))
    assert length.shape == () and int(length) == 5
    assert pool.adopt("len", torch.tensor(9)).data_ptr() == length.data_ptr()


def test_static_marks_only_when_asked_and_carried_by_compaction():
    assert _static(BufferPool().rows("k", (2, 3), torch.float32, "cpu")) is None
    marked = BufferPool(static=True).rows("k", (3, 2), torch.float32, "cpu")
    assert _static(marked) == "unguarded"
    marked.copy_(torch.arange(6.0).view(3, 2))
    kept = compact_rows(marked, torch.tensor([2, 0]))
    assert kept.data_ptr() == marked.data_ptr() and _static(kept) == "unguarded"
    assert torch.equal(kept, torch.tensor([[4.0, 5.0], [0.0, 1.0]]))
    plain = compact_rows(torch.arange(4.0), torch.tensor([3, 3, 1]))  # repeated rows (mirrors)
    assert torch.equal(plain, torch.tensor([3.0, 3.0, 1.0])) and _static(plain) is None


def test_lease_allows_one_call_at_a_time():
    pool = BufferPool()
    with pool.lease():
        with pytest.raises(RuntimeError, match="generate is already running on this generator"):
            with pool.lease():
                pass
    with pool.lease():   # released, also after an error
        pass
    with pytest.raises(ValueError):
        with pool.lease():
            raise ValueError("boom")
    with pool.lease():
        pass
