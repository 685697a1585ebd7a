"""kvpool.kvcache against a live daemon: pages saved in place and loaded
back into other pages, lookups, and layouts that must not mix."""

import pytest
import torch

import kvpool
from kvpool import errors
from kvpool.kvcache import HEADER_BYTES, Layout, PagedKVAdapter

from conftest import assert_idle


def cache(layers=2, pages=16, page_tokens=4, kv_heads=2, head_dim=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, pages, page_tokens, kv_heads, head_dim, generator=g).to(dtype) for _ in range(layers)]


@pytest.fixture
def client(node):
    with kvpool.Client(node.addr, tenant="kvc", path="shm") as c:
        yield c
        assert_idle(c)


def keys(n, tag="k"):
    return [f"{tag}-{i}".encode() for i in range(n)]


def test_save_then_load_into_other_pages(client):
    src = cache(seed=1)
    a = PagedKVAdapter(client, src, pages_per_block=2, model="m1")
    chain = keys(3)
    src_pages = [5, 2, 9, 0, 7, 11]  # 3 blocks of 2 pages
    assert a.save(chain, src_pages) == 3
    assert a.save(chain, src_pages) == 0  # already held: nothing rewritten
    assert a.client.namespace == a.layout.namespace()
    view_bytes = a.layout.block_bytes
    assert view_bytes == HEADER_BYTES + 2 * 2 * 2 * 4 * 2 * 8 * 4

    dst = cache(seed=2)
    b = PagedKVAdapter(client, dst, pages_per_block=2, model="m1")
    dst_pages = [1, 3, 4, 6, 8, 10]
    assert b.load(chain, dst_pages) == 3
    for s_layer, d_layer in zip(src, dst):
        assert torch.equal(d_layer[:, dst_pages], s_layer[:, src_pages])
    untouched = [p for p in range(16) if p not in dst_pages]
    assert torch.equal(dst[0][:, untouched], cache(seed=2)[0][:, untouched])

    # A chain the node holds only the head of loads that head.
    longer = chain + keys(2, "missing")
    assert b.load(longer, dst_pages + [12, 13, 14, 15]) == 3
    look = b.lookup(longer)
    assert look.local == 3 and len(look.holders) == 2 and all(h == [] for h in look.holders)
    assert b.client.remove_many(chain) == 3


def test_save_is_one_batch_that_stops_where_the_node_refuses(client):
    # Blocks of 1 MiB: the arena (256 MiB) is filled with reservations,
    # which cannot be evicted, until exactly one block's space is left.
    src = cache(pages=16, page_tokens=64, kv_heads=8, head_dim=64, seed=3)
    a = PagedKVAdapter(client, src, pages_per_block=2, model="m1")
    size = a.layout.block_bytes
    held = [r for r in client.reserve_many(keys(20, "fill16"), 16 << 20) if not isinstance(r, Exception)]
    held.pop().abort()  # room for fewer than 32 blocks
    fillers = client.reserve_many(keys(32, "fill"), size)
    assert isinstance(fillers[-1], errors.ResourceExhausted), "the arena did not fill up"
    held += [r for r in fillers if not isinstance(r, Exception)]
    held.pop().abort()
    try:
        chain = keys(3, "cut")
        with pytest.raises(errors.ResourceExhausted):
            a.save(chain, list(range(6)))
        assert a.client.exists(chain) == [True, False, False]  # the head is saved
    finally:
        for r in held:
            r.abort()
    # With room again, a save writes only what is missing.
    assert a.save(chain, list(range(6))) == 2
    dst = cache(pages=16, page_tokens=64, kv_heads=8, head_dim=64, seed=4)
    b = PagedKVAdapter(client, dst, pages_per_block=2, model="m1")
    assert b.load(chain, list(range(6))) == 3
    assert all(torch.equal(d[:, :6], s[:, :6]) for s, d in zip(src, dst))
    assert a.client.remove_many(chain) == 3


def test_layouts_do_not_mix(client):
    a = PagedKVAdapter(client, cache(), pages_per_block=2, model="m1")
    chain = keys(2, "mix")
    a.save(chain, [0, 1, 2, 3])
    for other in (PagedKVAdapter(client, cache(), pages_per_block=2, model="m2"),
                  PagedKVAdapter(client, cache(dtype=torch.float16), pages_per_block=2, model="m1"),
                  PagedKVAdapter(client, cache(), pages_per_block=2, model="m1", tp_rank=1)):
        assert other.layout.namespace() != a.layout.namespace()
        assert other.load(chain, [0, 1, 2, 3]) == 0  # its namespace holds nothing
    # The same namespace chosen by hand for another layout: an error, not garbage.
    wrong = PagedKVAdapter(client, cache(page_tokens=8, pages=8), pages_per_block=1, model="m1", namespace=a.layout.namespace())
    with pytest.raises(errors.FailedPrecondition):
        wrong.load(chain, [0, 1])
    other_model = PagedKVAdapter(client, cache(), pages_per_block=2, model="m2", namespace=a.layout.namespace())
    with pytest.raises(errors.FailedPrecondition):
        other_model.load(chain, [0, 1, 2, 3])
    # A block under the wrong chain position.
    with pytest.raises(errors.FailedPrecondition):
        a.load([chain[1]], [0, 1])
    a.client.remove_many(chain)


def test_bad_caches_are_refused(client):
    with pytest.raises(errors.InvalidArgument):
        PagedKVAdapter(client, [], pages_per_block=1, model="m")
    with pytest.raises(errors.InvalidArgument):
        PagedKVAdapter(client, [torch.zeros(3, 4, 4, 2, 8)], pages_per_block=1, model="m")
    with pytest.raises(errors.InvalidArgument):
        PagedKVAdapter(client, cache() + [torch.zeros(2, 16, 4, 2, 4)], pages_per_block=1, model="m")
    with pytest.raises(errors.InvalidArgument):
        PagedKVAdapter(client, cache(), pages_per_block=0, model="m")
    a = PagedKVAdapter(client, cache(), pages_per_block=2, model="m")
    with pytest.raises(errors.InvalidArgument):
        a.save(keys(2, "short"), [0, 1, 2])  # 3 page ids for 2 blocks of 2


def test_layout_names():
    lay = Layout(model="tiny-l4h8kv2d64-f32-s0-1b8f06ad", dtype="float32", num_layers=4, kv_heads=2, head_dim=64,
                 page_tokens=16, pages_per_block=4)
    ns = lay.namespace()
    assert len(ns) <= 64 and all(c.isalnum() or c in "._-" for c in ns)
    assert lay.block_tokens == 64 and lay.payload_bytes == 4 * 2 * 4 * 16 * 2 * 64 * 4
