"""Tests of kvpool.model: the paged-KV transformer the engine tests run on.

The model is only useful to kvpool if KV read back from cache pages is exactly
as good as recomputing it, so these tests check that (split prefill, pages
moved to other page ids as a pool load does, greedy generation), that the
cache is really read (corrupting a page changes the output), the layout and
post-RoPE K, and that weights and fingerprints are deterministic.
"""

import re

import pytest
import torch

from kvpool.model import Model, ModelConfig, PagedKVCache

PAGE = 16
PROMPT_LEN = 256
SPLIT = 128  # page aligned: pages 0..7 hold the cached prefix


@pytest.fixture(scope="module")
def model():
    return Model(ModelConfig())


@pytest.fixture(scope="module")
def prompt():
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, ModelConfig().vocab_size, (PROMPT_LEN,), generator=g)


def copy_pages(src, src_pages, dst, dst_pages):
    """What a load from the pool does: page bytes of every layer, to other page ids."""
    src_idx = torch.tensor(src_pages)
    dst_idx = torch.tensor(dst_pages)
    for s, d in zip(src.layers, dst.layers):
        d.index_copy_(1, dst_idx, s.index_select(1, src_idx))


def test_layout_and_allocator():
    cfg = ModelConfig()
    cache = PagedKVCache(cfg, num_pages=10, page_tokens=PAGE)
    assert len(cache.layers) == cfg.n_layers
    for t in cache.layers:
        assert t.shape == (2, 10, PAGE, cfg.n_kv_heads, cfg.head_dim)
        assert t.is_contiguous() and t.dtype == torch.float32
    assert cache.bytes_per_token == cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 4 == 4096
    assert cache.page_bytes == cache.bytes_per_token * PAGE
    a = cache.allocate(4)
    b = cache.allocate(6)
    assert sorted(a + b) == list(range(10)) and cache.num_free == 0
    with pytest.raises(MemoryError):
        cache.allocate(1)
    cache.free(a)
    with pytest.raises(ValueError):
        cache.free(a)  # double free
    assert sorted(cache.allocate(4)) == sorted(a)


def test_split_prefill_matches_whole(model, prompt):
    cfg = model.config
    pages = [5, 2, 9, 0, 14, 7, 3, 11, 1, 8, 12, 4, 6, 10, 13, 15]  # 16 pages = 256 positions
    whole = PagedKVCache(cfg, 16, PAGE)
    split = PagedKVCache(cfg, 16, PAGE)
    logits_whole = model.prefill(prompt, whole, pages)
    assert logits_whole.shape == (PROMPT_LEN, cfg.vocab_size) and logits_whole.dtype == torch.float32
    head = model.prefill(prompt[:SPLIT], split, pages)
    tail = model.prefill(prompt, split, pages, start=SPLIT)
    assert tail.shape == (PROMPT_LEN - SPLIT, cfg.vocab_size)
    assert (head - logits_whole[:SPLIT]).abs().max().item() < 1e-4
    assert (tail - logits_whole[SPLIT:]).abs().max().item() < 1e-4
    for a, b in zip(whole.layers, split.layers):
        assert (a - b).abs().max().item() < 1e-5


def test_unaligned_start(model, prompt):
    cfg = model.config
    pages = list(range(16))
    whole = PagedKVCache(cfg, 16, PAGE)
    part = PagedKVCache(cfg, 16, PAGE)
    ref = model.prefill(prompt[:100], whole, pages)
    model.prefill(prompt[:37], part, pages)
    got = model.prefill(prompt[:100], part, pages, start=37)
    assert (got - ref[37:]).abs().max().item() < 1e-4


def test_loaded_pages_generate_like_recompute(model, prompt):
    cfg = model.config
    n_new = 16
    need = -(-(PROMPT_LEN + n_new - 1) // PAGE)  # pages for prompt + fed-back tokens
    a = PagedKVCache(cfg, need, PAGE)
    a_pages = a.allocate(need)
    model.prefill(prompt[:SPLIT], a, a_pages)

    b = PagedKVCache(cfg, 3 * need, PAGE)
    b.allocate(3)  # so B's pages are not A's ids
    loaded = b.allocate(need)[::-1]  # and not in A's order
    recompute = b.allocate(need)
    n_prefix = SPLIT // PAGE
    copy_pages(a, a_pages[:n_prefix], b, loaded[:n_prefix])

    toks_loaded, logits_loaded = model.generate(prompt, n_new, b, loaded, start=SPLIT)
    toks_full, logits_full = model.generate(prompt, n_new, b, recompute)
    assert len(toks_loaded) == len(logits_loaded) == n_new
    assert toks_loaded == toks_full
    diff = max((x - y).abs().max().item() for x, y in zip(logits_loaded, logits_full))
    assert diff < 1e-4
    assert [int(torch.argmax(x)) for x in logits_full] == toks_full
    # The whole sequence's KV, prefix loaded or recomputed, agrees page for page.
    idx_l, idx_r = torch.tensor(loaded), torch.tensor(recompute)
    for t in b.layers:
        assert (t.index_select(1, idx_l) - t.index_select(1, idx_r)).abs().max().item() < 1e-5


@pytest.mark.parametrize("kv", [0, 1])
def test_corrupted_page_changes_logits(model, prompt, kv):
    cfg = model.config
    pages = list(range(16))
    good = PagedKVCache(cfg, 16, PAGE)
    model.prefill(prompt[:SPLIT], good, pages)
    ref = model.prefill(prompt, good, pages, start=SPLIT)

    bad = PagedKVCache(cfg, 16, PAGE)
    copy_pages(good, pages[: SPLIT // PAGE], bad, pages[: SPLIT // PAGE])
    g = torch.Generator().manual_seed(7)
    layer = bad.layers[cfg.n_layers - 1]
    layer[kv, pages[3]] += torch.randn(layer[kv, pages[3]].shape, generator=g)
    got = model.prefill(prompt, bad, pages, start=SPLIT)
    assert (got - ref).abs().max().item() > 1e-2


def test_k_is_stored_after_rope(model):
    cfg = model.config
    cache = PagedKVCache(cfg, 4, PAGE)
    pages = [2, 0, 3, 1]
    tokens = list(range(100, 140))
    tokens[37] = tokens[0]  # same token at positions 0 and 37
    model.prefill(tokens, cache, pages)
    layer0 = cache.layers[0]
    k0, v0 = layer0[0, pages[0], 0], layer0[1, pages[0], 0]
    k37, v37 = layer0[0, pages[37 // PAGE], 37 % PAGE], layer0[1, pages[37 // PAGE], 37 % PAGE]
    # Layer 0 sees only the token, so V is position independent; K is rotated.
    assert (v0 - v37).abs().max().item() < 1e-5
    assert (k0 - k37).abs().max().item() > 1e-2
    cos, sin = model._rope_tables(torch.tensor([37]))
    rotated = model._rope(k0[None], cos, sin)[0]  # position 0 is the identity rotation
    assert (rotated - k37).abs().max().item() < 1e-5


def test_decode_matches_prefill(model, prompt):
    cfg = model.config
    pages = list(range(16))
    cache = PagedKVCache(cfg, 16, PAGE)
    ref = model.prefill(prompt[:40], cache, pages)
    inc = PagedKVCache(cfg, 16, PAGE)
    model.prefill(prompt[:32], inc, pages)
    for p in range(32, 40):
        step = model.decode(int(prompt[p]), p, inc, pages)
        assert step.shape == (cfg.vocab_size,)
        assert (step - ref[p]).abs().max().item() < 1e-4
    with pytest.raises(ValueError):
        model.decode(1, 16 * PAGE, inc, pages)  # no page holds that position


def test_mkldnn_and_matmul_paths_agree():
    cfg = ModelConfig()
    fast = Model(cfg)
    if not fast.use_mkldnn:
        pytest.skip("oneDNN linear not available")
    slow = Model(cfg, use_mkldnn=False)
    tokens = list(range(1, 49))
    out = []
    for m in (fast, slow):
        cache = PagedKVCache(cfg, 4, PAGE)
        out.append(m.prefill(tokens, cache, [0, 1, 2]))
    assert (out[0] - out[1]).abs().max().item() < 1e-4


def test_determinism_and_fingerprint(prompt):
    cfg = ModelConfig()
    m1, m2 = Model(cfg), Model(ModelConfig())
    m3 = Model(ModelConfig(seed=1))
    assert m1.weights.keys() == m2.weights.keys() == m3.weights.keys()
    assert all(torch.equal(m1.weights[k], m2.weights[k]) for k in m1.weights)
    assert not torch.equal(m1.weights["embed"], m3.weights["embed"])
    assert not torch.equal(m1.weights["layers.0.wqkv"], m3.weights["layers.0.wqkv"])

    def run(m):
        return m.prefill(prompt[:64], PagedKVCache(cfg, 4, PAGE), [0, 1, 2, 3])

    l1, l2, l3 = run(m1), run(m2), run(m3)
    assert torch.equal(l1, l2)
    assert (l1 - l3).abs().max().item() > 1e-1

    base = cfg.fingerprint()
    assert base == ModelConfig().fingerprint()
    assert base == "tiny-l4h8kv2d64-f32-s0-1b8f06ad"  # stable across runs and processes
    variants = [
        ModelConfig(seed=1),
        ModelConfig(dtype=torch.float64),
        ModelConfig(dtype=torch.bfloat16),
        ModelConfig(n_layers=2),
        ModelConfig(n_heads=4),
        ModelConfig(n_kv_heads=4),
        ModelConfig(head_dim=32),
        ModelConfig(vocab_size=1024),
        ModelConfig(ffn_hidden=1024),
        ModelConfig(rope_theta=500000.0),
        ModelConfig(rms_eps=1e-6),
        ModelConfig(n_layers=128, n_heads=128, n_kv_heads=64, head_dim=256, seed=123456789012),
    ]
    names = [base] + [v.fingerprint() for v in variants]
    assert len(set(names)) == len(names)
    for n in names:
        assert re.fullmatch(r"[A-Za-z0-9._-]{1,40}", n), n
