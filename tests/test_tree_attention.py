import pytest
import torch

from conftest import CAPPED_BUILDS, DEVICES, DTYPES, TOLERANCES, op_error
from eagle3_ext import ops, reference, tree_attention, tree_attention_paged


def random_tree_mask(n, generator, kind="tree", padding=0):
    """bool [n, n]: ancestors and self of a random tree (parent of i drawn from 0..i-1), a chain,
    or either with the last `padding` rows turned into padding (only the diagonal set)."""
    parent = [-1] * n
    for i in range(1, n):
        parent[i] = i - 1 if kind == "chain" else int(torch.randint(0, i, (1,), generator=generator))
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parent[j]
    for i in range(n - padding, n):
        mask[i] = False
        mask[i, i] = True
    return mask


def make_case(lens, n, hq, hkv, d, dtype, device, kind="tree", padding=0, s_max=None, seed=0,
              lens_dtype=torch.int32, dv=None):
    """q [B, N, Hq, D], k [B, S_max, Hkv, D], v [B, S_max, Hkv, Dv] (random, including the unused
    tail; Dv = D unless given), cache_lens, mask."""
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    s_max = s_max or max(lens) + n + 3
    q = torch.randn(b, n, hq, d, generator=g).to(dtype=dtype, device=device)
    k = torch.randn(b, s_max, hkv, d, generator=g).to(dtype=dtype, device=device)
    v = torch.randn(b, s_max, hkv, dv or d, generator=g).to(dtype=dtype, device=device)
    mask = torch.stack([random_tree_mask(n, g, kind, padding) for _ in range(b)]).to(device)
    cache_lens = torch.tensor(lens, dtype=lens_dtype, device=device)
    return q, k, v, cache_lens, mask


def to_pages(cache, page_size, seed=0, spare_pages=3):
    """A contiguous cache [B, S, Hkv, D] as shuffled pages [P, page, Hkv, D] + block_table [B, S/page]."""
    g = torch.Generator().manual_seed(seed)
    b, s, hkv, d = cache.shape
    blocks = -(-s // page_size)
    padded = torch.zeros(b, blocks * page_size, hkv, d, dtype=cache.dtype, device=cache.device)
    padded[:, :s] = cache
    total = b * blocks + spare_pages
    perm = torch.randperm(total, generator=g)
    pages = torch.randn(total, page_size, hkv, d, generator=g).to(dtype=cache.dtype, device=cache.device)
    table = perm[: b * blocks].view(b, blocks)
    pages[table.flatten().to(cache.device)] = padded.view(b * blocks, page_size, hkv, d)
    return pages, table.to(dtype=torch.int32, device=cache.device)


def check(q, k, v, lens, mask, scale=None):
    scale = q.size(-1) ** -0.5 if scale is None else scale
    out = tree_attention(q, k, v, lens, mask, scale)
    expected = reference.tree_attention(q, k, v, lens, mask, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCES[q.dtype])
    return out


CASES = {
    # name: (prefix lens per request, N, Hq, Hkv, D, tree kind, padding rows)
    "tree": ([5, 37], 7, 8, 2, 64, "tree", 0),
    "chain": ([40, 3], 6, 4, 4, 64, "chain", 0),
    "decode-N1": ([33, 0, 70], 1, 8, 2, 128, "tree", 0),
    "empty-prefix": ([0, 0], 9, 4, 1, 64, "tree", 0),
    "gqa1": ([50], 12, 4, 4, 128, "tree", 0),
    "gqa4": ([65, 31], 16, 8, 2, 128, "tree", 0),
    "gqa8": ([64, 1], 33, 8, 1, 128, "tree", 0),
    "d256": ([47], 5, 4, 2, 256, "tree", 0),
    "d40-general": ([29, 70], 6, 6, 3, 40, "tree", 0),
    "padding-rows": ([20, 45], 10, 4, 2, 64, "tree", 4),
    "wide-tree": ([100], 70, 2, 1, 64, "tree", 0),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_reference(device, dtype, case):
    lens, n, hq, hkv, d, kind, padding = CASES[case]
    check(*make_case(lens, n, hq, hkv, d, dtype, device, kind, padding))


# The CPU kernel is compiled for AVX-512, for AVX2 + FMA and portably (CAPPED_BUILDS).


@pytest.mark.parametrize("isa", CAPPED_BUILDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["tree", "d40-general", "padding-rows", "long-prefix", "d36-tail"])
def test_capped_cpu_builds_match_reference(cpu_isa, isa, dtype, case):
    cpu_isa(isa)
    if case == "long-prefix":  # several key blocks, a tail block and a tree that is not a chain
        check(*make_case([300, 77], 7, 6, 2, 64, dtype, "cpu"))
        return
    if case == "d36-tail":  # a head dim that is no multiple of 8 (the row conversions' tails)
        check(*make_case([29, 70], 6, 6, 3, 36, dtype, "cpu"))
        return
    lens, n, hq, hkv, d, kind, padding = CASES[case]
    check(*make_case(lens, n, hq, hkv, d, dtype, "cpu", kind, padding))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_long_prefix_4096(device, dtype):
    q, k, v, lens, mask = make_case([4096, 1500], 8, 8, 2, 128, dtype, device, s_max=4110)
    check(q, k, v, lens, mask)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_cpu_kv_splits_for_few_tasks(dtype, paged):
    # One request, one kv head, decode-sized N: fewer tasks than threads, so the CPU entry splits
    # the cache positions and merges the partial results (request 1's short prefix leaves its
    # later splits empty).
    threads = torch.get_num_threads()
    torch.set_num_threads(8)
    try:
        q, k, v, lens, mask = make_case([3000, 40], 2, 4, 1, 64, dtype, "cpu", s_max=3010)
        if paged:
            k_pages, table = to_pages(k, 16)
            v_pages, _ = to_pages(v, 16)
            out = tree_attention_paged(q, k_pages, v_pages, table, lens, mask, 0.125)
        else:
            out = tree_attention(q, k, v, lens, mask, 0.125)
        expected = reference.tree_attention(q, k, v, lens, mask, 0.125)
        torch.testing.assert_close(out.float(), expected.float(), **TOLERANCES[dtype])
    finally:
        torch.set_num_threads(threads)


# --- what modern attention layers need: Dv != Dqk (MLA), windows, soft-caps, sinks -------------

FEATURES = {
    # name: (Dqk, Dv, window, softcap, sinks)
    "mla-192-128": (192, 128, 0, 0.0, False),
    "dv-wider": (48, 80, 0, 0.0, False),
    "window-1": (64, 64, 1, 0.0, False),
    "window-5": (64, 64, 5, 0.0, False),
    "window-past-cache": (64, 64, 10_000, 0.0, False),
    "softcap": (64, 64, 0, 5.0, False),
    "sinks": (64, 64, 0, 0.0, True),
    "gemma2-like": (128, 128, 24, 50.0, False),
    "gpt-oss-like": (64, 64, 16, 0.0, True),
    "all": (96, 64, 9, 8.0, True),
}


def check_features(q, k, v, lens, mask, window, softcap, sinks, paged_page=0):
    scale = q.size(-1) ** -0.5
    if paged_page:
        k_pages, table = to_pages(k, paged_page)
        v_pages, _ = to_pages(v, paged_page)
        out = tree_attention_paged(q, k_pages, v_pages, table, lens, mask, scale, window, softcap, sinks)
    else:
        out = tree_attention(q, k, v, lens, mask, scale, window, softcap, sinks)
    expected = reference.tree_attention(q, k, v, lens, mask, scale, window, softcap, sinks)
    assert out.shape == q.shape[:3] + (v.size(-1),) and out.dtype == q.dtype
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCES[q.dtype])
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("paged", [0, 16], ids=["contiguous", "paged"])
@pytest.mark.parametrize("feature", list(FEATURES), ids=list(FEATURES))
def test_modern_attention_features_match_reference(device, dtype, paged, feature):
    d, dv, window, softcap, with_sinks = FEATURES[feature]
    q, k, v, lens, mask = make_case([70, 3, 31], 9, 8, 2, d, dtype, device, padding=2, dv=dv)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(5)).to(device) * 2 if with_sinks else None
    check_features(q, k, v, lens, mask, window, softcap, sinks, paged)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("feature", ["mla-192-128", "window-5", "gpt-oss-like", "all"])
def test_features_with_cpu_kv_splits(dtype, feature):
    # Few tasks: the KV range is split and merged (the sinks join the merge once; with a window
    # the splits cover the window only, and some splits of short requests are empty).
    d, dv, window, softcap, with_sinks = FEATURES[feature]
    threads = torch.get_num_threads()
    torch.set_num_threads(8)
    try:
        q, k, v, lens, mask = make_case([3000, 40], 3, 4, 1, d, dtype, "cpu", s_max=3010, dv=dv)
        window = window and 1500  # a window that still leaves several splits
        sinks = torch.randn(4) if with_sinks else None
        check_features(q, k, v, lens, mask, window, softcap, sinks)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("isa", CAPPED_BUILDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_features_capped_cpu_builds(cpu_isa, isa, dtype):
    cpu_isa(isa)
    d, dv, window, softcap, _ = FEATURES["all"]
    q, k, v, lens, mask = make_case([70, 3], 9, 8, 2, d, dtype, "cpu", dv=dv)
    check_features(q, k, v, lens, mask, window, softcap, torch.randn(8))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("paged", [0, 8], ids=["contiguous", "paged"])
def test_tree_start_reads_the_tree_from_a_shared_offset(device, dtype, paged):
    # Requests of different lengths whose tree tokens were all appended at one slot (as Hugging
    # Face's cache does): the same result as with each tree right after its prefix.
    start = torch.full((3,), 43, dtype=torch.int64, device=device)
    d, dv, window, softcap, _ = FEATURES["all"]
    q, k, v, lens, mask = make_case([40, 9, 25], 7, 8, 2, d, dtype, device, s_max=50, dv=dv)
    sinks = torch.randn(8, device=device)
    scale = d ** -0.5
    if paged:
        k_pages, table = to_pages(k, paged)
        v_pages, _ = to_pages(v, paged)
        out = tree_attention_paged(q, k_pages, v_pages, table, lens, mask, scale, window, softcap, sinks, start)
    else:
        out = tree_attention(q, k, v, lens, mask, scale, window, softcap, sinks, start)
    moved_k, moved_v = (reference.move_tree(c, lens, start, 7) for c in (k, v))
    expected = reference.tree_attention(q, moved_k, moved_v, lens, mask, scale, window, softcap, sinks)
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCES[dtype])
    assert not torch.allclose(out.float(), tree_attention(q, k, v, lens, mask, scale, window, softcap, sinks).float())


@pytest.mark.parametrize("window", [1, 3, 8, 100])
def test_window_is_transformers_sliding_window_on_a_chain(window):
    # A chain of N tree tokens after a prefix is an ordinary causal sequence: with a window the op
    # must equal attention under transformers' own sliding-window causal mask function.
    from transformers.masking_utils import sliding_window_causal_mask_function
    prefix, n, d = 20, 6, 32
    q, k, v, lens, mask = make_case([prefix], n, 2, 1, d, torch.float32, "cpu", kind="chain", s_max=prefix + n)
    q_idx = torch.arange(prefix, prefix + n).view(n, 1)
    kv_idx = torch.arange(prefix + n).view(1, -1)
    allowed = sliding_window_causal_mask_function(window)(0, 0, q_idx, kv_idx)       # [N, S]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    expected = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, scale=d ** -0.5)
    out = tree_attention(q, k, v, lens, mask, d ** -0.5, window)
    torch.testing.assert_close(out, expected.transpose(1, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_features_opcheck_and_compile(device):
    q, k, v, lens, mask = make_case([5, 12], 4, 4, 2, 64, torch.float32, device, dv=32)
    sinks = torch.randn(4, device=device)
    torch.library.opcheck(torch.ops.eagle3.tree_attention.default, (q, k, v, lens, mask, 0.125, 3, 4.0, sinks))
    k_pages, table = to_pages(k, 4)
    v_pages, _ = to_pages(v, 4)
    torch.library.opcheck(torch.ops.eagle3.tree_attention_paged.default,
                          (q, k_pages, v_pages, table, lens, mask, 0.125, 3, 4.0, sinks))

    def f(q, k, v, lens, mask, sinks):
        return tree_attention(q * 2, k, v, lens, mask, 0.125, 3, 4.0, sinks).sum(-1)

    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, lens, mask, sinks), f(q, k, v, lens, mask, sinks))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [0, 64], ids=["contiguous", "paged"])
@pytest.mark.parametrize("with_sinks", [False, True], ids=["plain", "sinks"])
def test_short_prefixes_in_a_large_cache(device, paged, with_sinks):
    # A cache preallocated far beyond the prefixes (16384 positions for 1000 and 17): on CUDA
    # each request's KV splits are cut from its real length on the device, so the 1000
    # positions spread over several splits, the 17 fill only the first, and the merge skips the
    # splits past each request's end.
    q, k, v, lens, mask = make_case([1000, 17], 8, 4, 1, 64, torch.bfloat16, device, s_max=16384)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(5)).to(device) if with_sinks else None
    check_features(q, k, v, lens, mask, 0, 0.0, sinks, paged)


@pytest.mark.parametrize("device", DEVICES)
def test_int64_cache_lens_and_scale(device):
    q, k, v, lens, mask = make_case([7, 19], 5, 4, 2, 64, torch.float32, device, lens_dtype=torch.int64)
    check(q, k, v, lens, mask, scale=0.3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_hf_layout_strided_views(device, dtype):
    # Hugging Face keeps K/V as [B, Hkv, S, D] and q as [B, Hq, N, D]: the op reads the
    # transposed views in place.
    g = torch.Generator().manual_seed(3)
    b, n, hq, hkv, d, s = 2, 6, 8, 2, 64, 50
    k_hf = torch.randn(b, hkv, s, d, generator=g).to(dtype=dtype, device=device)
    v_hf = torch.randn(b, hkv, s, d, generator=g).to(dtype=dtype, device=device)
    q_hf = torch.randn(b, hq, n, d, generator=g).to(dtype=dtype, device=device)
    k, v, q = k_hf.transpose(1, 2), v_hf.transpose(1, 2), q_hf.transpose(1, 2)
    assert not k.is_contiguous() and not q.is_contiguous()
    lens = torch.tensor([11, 44], dtype=torch.int32, device=device)
    mask = torch.stack([random_tree_mask(n, g) for _ in range(b)]).to(device)
    mask = mask.transpose(1, 2).contiguous().transpose(1, 2)  # a strided mask too
    check(q, k, v, lens, mask)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16, 64], ids=lambda p: f"page{p}")
def test_paged_matches_contiguous(device, dtype, page_size):
    q, k, v, lens, mask = make_case([70, 5, 130], 9, 8, 2, 64, dtype, device)
    k_pages, table = to_pages(k, page_size, seed=page_size)
    v_pages, table_v = to_pages(v, page_size, seed=page_size)
    assert torch.equal(table, table_v)
    scale = 64 ** -0.5
    out = tree_attention_paged(q, k_pages, v_pages, table, lens, mask, scale)
    expected = reference.tree_attention_paged(q, k_pages, v_pages, table, lens, mask, scale)
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCES[dtype])
    torch.testing.assert_close(out.float(), reference.tree_attention(q, k, v, lens, mask, scale).float(),
                               **TOLERANCES[dtype])


@pytest.mark.parametrize("device", DEVICES)
def test_paged_hf_layout_pages_and_short_table(device):
    # Pages stored [P, Hkv, page, D] and viewed as [P, page, Hkv, D]; the table only covers what
    # each request needs and its unused entries hold -1.
    q, k, v, lens, mask = make_case([20, 3], 4, 4, 2, 64, torch.bfloat16, device, s_max=24)
    k_pages, table = to_pages(k, 8, seed=1)
    v_pages, _ = to_pages(v, 8, seed=1)
    k_pages = k_pages.transpose(1, 2).contiguous().transpose(1, 2)
    v_pages = v_pages.transpose(1, 2).contiguous().transpose(1, 2)
    table = table.clone()
    table[1, 1:] = -1  # request 1 needs ceil((3 + 4) / 8) = 1 block
    scale = 0.125
    out = tree_attention_paged(q, k_pages, v_pages, table, lens, mask, scale)
    expected = reference.tree_attention(q, k, v, lens, mask, scale)
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_and_tree(device):
    q, k, v, lens, mask = make_case([3], 0, 4, 2, 64, torch.float32, device)
    assert tree_attention(q, k, v, lens, mask, 0.1).shape == (1, 0, 4, 64)
    q, k, v, lens, mask = make_case([3], 2, 4, 2, 64, torch.float32, device)
    out = tree_attention(q[:0], k[:0], v[:0], lens[:0], mask[:0], 0.1)
    assert out.shape == (0, 2, 4, 64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck(device, dtype):
    q, k, v, lens, mask = make_case([5, 12], 4, 4, 2, 64, dtype, device)
    torch.library.opcheck(torch.ops.eagle3.tree_attention.default, (q, k, v, lens, mask, 0.125))
    k_pages, table = to_pages(k, 4)
    v_pages, _ = to_pages(v, 4)
    torch.library.opcheck(torch.ops.eagle3.tree_attention_paged.default,
                          (q, k_pages, v_pages, table, lens, mask, 0.125))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    q, k, v, lens, mask = make_case([5, 12], 4, 4, 2, 64, torch.float32, device)

    def f(q, k, v, lens, mask):
        return tree_attention(q * 2, k, v, lens, mask, 0.125).sum(-1)

    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, lens, mask), f(q, k, v, lens, mask))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("validate", [False, True], ids=["default", "validate"])
def test_cuda_graph_capture_and_replay(paged, validate):
    # No call reads a value back on the host, so the op can be captured (with validate=True the
    # read-back is skipped under capture); replays see new inputs in place, the KV splits
    # following the new lengths.
    q, k, v, lens, mask = make_case([300, 2000], 8, 8, 2, 128, torch.bfloat16, "cuda", s_max=2048)
    k_pages, table = to_pages(k, 16)
    v_pages, _ = to_pages(v, 16)

    def call():
        if paged:
            return tree_attention_paged(q, k_pages, v_pages, table, lens, mask, 0.088, validate=validate)
        return tree_attention(q, k, v, lens, mask, 0.088, validate=validate)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    q.copy_(torch.randn_like(q))
    lens.copy_(torch.tensor([1000, 17], dtype=lens.dtype))
    graph.replay()
    torch.cuda.synchronize()
    expected = reference.tree_attention(q, k, v, lens, mask, 0.088)
    torch.testing.assert_close(out.float(), expected.float(), **TOLERANCES[torch.bfloat16])


# --- errors --------------------------------------------------------------------------------


def _args():
    return list(make_case([5, 9], 4, 8, 2, 64, torch.float32, "cpu", s_max=16)) + [0.125]


def _set(args, i, value):
    args = list(args)
    args[i] = value
    return args


def _set_kv(args, cache):
    return _set(_set(args, 1, cache), 2, cache.clone())


def _no_diagonal(args):
    mask = args[4].clone()
    mask[1, 2, 2] = False
    return _set(args, 4, mask)


# Errors in the tensors' values rather than their shapes or dtypes. The CPU entry always raises
# them; on CUDA the kernel only flags them (no sync) and the entry raises them with validation
# (validate=True, ops.cuda_validation(); test_cuda_value_errors_raise_only_with_validation).
VALUE_ERRORS = {
    "mask-without-diagonal": (
        _no_diagonal, r"tree_attention: tree_mask\[1, 2, 2\] is False: every tree token must see itself"),
    "cache-too-small": (
        lambda a: _set(a, 3, torch.tensor([5, 13], dtype=torch.int32)),
        r"cache_lens\[1\] = 13 plus the 4 tree tokens needs 17 cache positions but k_cache holds S_max = 16"),
    "negative-len": (
        lambda a: _set(a, 3, torch.tensor([-1, 0], dtype=torch.int32)), r"cache_lens\[0\] = -1 is negative"),
    "tree-start-in-prefix": (
        lambda a: a + [0, 0.0, None, torch.tensor([5, 8])],
        r"tree_start\[1\] = 8 is inside the prefix \(cache_lens\[1\] = 9\)"),
    "tree-start-past-cache": (
        lambda a: a + [0, 0.0, None, torch.tensor([5, 13])],
        r"tree_start\[1\] = 13 plus the 4 tree tokens needs 17 cache positions but k_cache holds S_max = 16"),
}


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda a: _set_kv(a, torch.randn(2, 16, 3, 64)),
         r"q has 8 heads, which is not a multiple of the 3 kv heads of k_cache"),
        (lambda a: _set(a, 4, a[4].to(torch.uint8)), r"tree_mask must be bool, got Byte"),
        (lambda a: _set(a, 4, a[4].float()), r"tree_mask must be bool, got Float"),
        (lambda a: _set(a, 1, a[1].half()), r"k_cache has dtype Half but q has Float"),
        (lambda a: _set(a, 2, a[2].bfloat16()), r"v_cache has dtype BFloat16 but q has Float"),
        (lambda a: [x.double() if i < 3 else x for i, x in enumerate(a)],
         r"q must be float32, float16 or bfloat16, got Double"),
        (lambda a: _set(a, 0, a[0][0]), r"q must have 4 dimensions \[B, N, Hq, D\], got shape \[4, 8, 64\]"),
        (lambda a: _set(a, 1, a[1][0]), r"k_cache must have 4 dimensions \[B, S_max, Hkv, D\]"),
        (lambda a: _set(a, 2, a[2][:, :8]), r"k_cache has shape \[2, 16, 2, 64\] but v_cache has \[2, 8, 2, 64\]; they must "
                                            r"match in all but the head dim"),
        (lambda a: a + [-1], r"window must be 0 \(none\) or a positive number of positions, got -1"),
        (lambda a: a + [0, -2.0], r"softcap must be 0 \(none\) or a positive finite cap, got -2"),
        (lambda a: a + [0, 0.0, torch.zeros(4)], r"sinks must have shape \[8\] \(one logit per query head\), got \[4\]"),
        (lambda a: a + [0, 0.0, torch.zeros(8, dtype=torch.int64)], r"sinks must be float32, float16 or bfloat16"),
        (lambda a: a + [0, 0.0, None, torch.tensor([5.0, 9.0])], r"tree_start must be int32 or int64, got Float"),
        (lambda a: _set(a, 1, a[1][..., :32]), r"k_cache has head_dim 32 but q has 64"),
        (lambda a: _set_kv(a, torch.randn(2, 16, 2, 128)[..., ::2]), r"k_cache must have unit stride along the head dim"),
        (lambda a: _set(a, 3, a[3][:1]), r"cache_lens must have shape \[2\]"),
        (lambda a: _set(a, 3, a[3].float()), r"cache_lens must be int32 or int64, got Float"),
        (lambda a: _set(a, 4, a[4][:, :3]), r"tree_mask must have shape \[2, 4, 4\] \(\[B, N, N\] from q\), got \[2, 3, 4\]"),
        (lambda a: _set_kv(a, a[1][:1]),
         r"k_cache holds 1 requests but q has B = 2"),
    ] + list(VALUE_ERRORS.values()),
    ids=[
        "hq-not-multiple-of-hkv",
        "uint8-mask", "float-mask", "k-dtype", "v-dtype", "double-dtype", "q-rank", "k-rank",
        "kv-shape-mismatch", "negative-window", "negative-softcap", "sinks-shape", "sinks-dtype",
        "tree-start-dtype",
        "head-dim-mismatch", "k-not-unit-stride", "lens-shape", "lens-dtype", "mask-shape", "cache-batch",
    ] + list(VALUE_ERRORS),
)
def test_bad_inputs_raise_clear_errors(mutate, pattern):
    args = mutate(_args())
    with pytest.raises(op_error(pattern), match=pattern):
        tree_attention(*args)


def _paged_args(page_size=4, blocks=None):
    q, k, v, lens, mask, scale = _args()
    k_pages, table = to_pages(k, page_size)
    v_pages, _ = to_pages(v, page_size)
    if blocks is not None:
        table = table[:, :blocks]
    return [q, k_pages, v_pages, table, lens, mask, scale]


# As VALUE_ERRORS, for the paged op.
PAGED_VALUE_ERRORS = {
    "table-too-short": (
        lambda: _paged_args(blocks=3),
        r"tree_attention_paged: block_table is too short: request 1 needs 13 cache positions "
        r"\(cache_lens\[1\] = 9 plus 4 tree tokens\) but block_table has 3 blocks of 4 = 12 positions"),
    "table-entry-out-of-range": (
        lambda: _set(_paged_args(), 3, torch.full((2, 4), 99, dtype=torch.int32)),
        r"block_table\[0, 0\] = 99 is not a page of k_pages \(P = 11\)"),
    "mask-without-diagonal": (lambda: _no_diagonal_paged(), r"tree_attention_paged: tree_mask\[1, 2, 2\] is False"),
}


@pytest.mark.parametrize(
    "args, pattern",
    [
        (lambda: _set(_paged_args(), 3, _paged_args()[3].long()), r"block_table must be int32, got Long"),
        (lambda: _set(_paged_args(), 3, _paged_args()[3][0]), r"block_table must have shape \[2, max_blocks\]"),
        (lambda: _set(_paged_args(), 1, _paged_args()[1].half()), r"k_pages has dtype Half but q has Float"),
    ] + list(PAGED_VALUE_ERRORS.values()),
    ids=["table-dtype", "table-rank", "pages-dtype"] + list(PAGED_VALUE_ERRORS),
)
def test_paged_bad_inputs_raise_clear_errors(args, pattern):
    with pytest.raises(op_error(pattern), match=pattern):
        tree_attention_paged(*args())


def _no_diagonal_paged():
    args = _paged_args()
    mask = args[5].clone()
    mask[1, 2, 2] = False
    return _set(args, 5, mask)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_error_device_mismatch():
    q, k, v, lens, mask, scale = _args()
    with pytest.raises(ValueError, match=r"k_cache is on cuda:0 but q is on cpu"):
        tree_attention(q, k.cuda(), v, lens, mask, scale)
    with pytest.raises(ValueError, match=r"tree_mask is on cuda:0 but q is on cpu"):
        tree_attention(q, k, v, lens, mask.cuda(), scale)
    with pytest.raises(ValueError, match=r"cache_lens is on cpu but q is on cuda:0"):
        tree_attention(q.cuda(), k.cuda(), v.cuda(), lens, mask.cuda(), scale)


def _value_error_cases():
    """(op, arguments, pattern) of every value error, contiguous and paged."""
    for name, (mutate, pattern) in VALUE_ERRORS.items():
        yield pytest.param(tree_attention, lambda mutate=mutate: mutate(_args()), pattern, id=name)
    for name, (make, pattern) in PAGED_VALUE_ERRORS.items():
        yield pytest.param(tree_attention_paged, make, pattern, id="paged-" + name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("op, make_args, pattern", list(_value_error_cases()))
def test_cuda_value_errors_raise_only_with_validation(op, make_args, pattern):
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in make_args()]
    with pytest.raises(ValueError, match=pattern):
        op(*args, validate=True)
    with ops.cuda_validation(), pytest.raises(ValueError, match=pattern):
        op(*args)
    # By default nothing is read back (no sync): no error, and the kernel stays in bounds (an
    # invalid request's rows come out zero, a slot without a valid page reads as zeros).
    for out in (op(*args), op(*args, validate=False)):
        torch.cuda.synchronize()
        assert out.isfinite().all()
