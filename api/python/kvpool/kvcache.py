"""kvpool.kvcache: an engine's paged KV cache, saved to and loaded from the
pool in place.

An engine keeps its KV cache as one tensor per layer laid out in pages, as
vLLM does: [2, num_pages, page_tokens, kv_heads, head_dim], K at index 0
and V at 1. A pool block holds one page group (pages_per_block pages, so
block_tokens = pages_per_block x page_tokens tokens, the unit of the prefix
chain) for every layer:

    header (64 bytes) | layer 0: K pages, V pages | layer 1: ... | ...

save() reserves each block in the node's arena and copies the pages of
every layer straight into it (one index_select per layer, no staging
buffer), then commits. load() pins each block and copies its pages into
the engine's (one index_copy_ per layer, straight out of the arena).

What makes bytes compatible (model, dtype, layer count, kv heads, head
dim, page size, pages per block, tensor-parallel rank) is the Layout. It
names the namespace the blocks live in, and its digest is written in every
block's header and checked on load, so a block written under another
layout is an error (FailedPrecondition), never silent garbage, even when a
caller picks the namespace by hand.
"""

import hashlib
import re
import struct
from collections import namedtuple
from dataclasses import dataclass

import torch

from . import errors
from .client import put_window_blocks

HEADER_BYTES = 64
_MAGIC = b"KVPC"
_HEADER = struct.Struct("<4sHHI16s")  # magic, version, reserved, block index, layout digest
_HEADER_VERSION = 1

Lookup = namedtuple("Lookup", "local holders")
Lookup.__doc__ = ("What the pool has of a chain: local, how many leading blocks this node holds; "
                  "holders, for each block after those, the nodes holding it (best link first).")


@dataclass(frozen=True)
class Layout:
    """What makes a block's bytes usable by an engine."""

    model: str  # names the weights: the model id, or a fingerprint of it
    dtype: str  # torch dtype name, "float32"
    num_layers: int
    kv_heads: int
    head_dim: int
    page_tokens: int
    pages_per_block: int
    tp_rank: int = 0

    @property
    def block_tokens(self):
        return self.page_tokens * self.pages_per_block

    @property
    def element_bytes(self):
        return torch.empty((), dtype=getattr(torch, self.dtype)).element_size()

    @property
    def payload_bytes(self):
        return self.num_layers * 2 * self.pages_per_block * self.page_tokens * self.kv_heads * self.head_dim * self.element_bytes

    @property
    def block_bytes(self):
        return HEADER_BYTES + self.payload_bytes

    def describe(self):
        return (f"{self.model}/{self.dtype}/L{self.num_layers}/kv{self.kv_heads}x{self.head_dim}"
                f"/p{self.page_tokens}x{self.pages_per_block}/tp{self.tp_rank}")

    def digest(self):
        return hashlib.sha256(self.describe().encode()).digest()[:16]

    def namespace(self):
        """A namespace name ([A-Za-z0-9._-]{1,64}) that differs for every layout."""
        readable = re.sub(r"[^A-Za-z0-9._-]", "-", f"{self.model}.{self.dtype}.p{self.page_tokens}x{self.pages_per_block}.tp{self.tp_rank}")
        return f"{readable[:47]}.{self.digest().hex()[:16]}"


class PagedKVAdapter:
    """Moves a paged KV cache's pages between an engine and a kvpool node.

    layers: the engine's per-layer KV tensors [2, num_pages, page_tokens,
    kv_heads, head_dim], contiguous, on the CPU. client: a kvpool.Client of
    the engine's node; the adapter works in the layout's namespace of the
    client's tenant unless namespace is given. Not safe for concurrent use
    on the same pages.
    """

    def __init__(self, client, layers, pages_per_block, model, tp_rank=0, namespace=None):
        if not layers:
            raise errors.InvalidArgument("kvpool: a KV cache needs at least one layer")
        shape, dtype = layers[0].shape, layers[0].dtype
        if len(shape) != 5 or shape[0] != 2:
            raise errors.InvalidArgument(f"kvpool: layer shape {tuple(shape)}, want [2, num_pages, page_tokens, kv_heads, head_dim]")
        for i, t in enumerate(layers):
            if t.shape != shape or t.dtype != dtype or not t.is_contiguous() or t.device.type != "cpu":
                raise errors.InvalidArgument(f"kvpool: layer {i} is not a contiguous CPU tensor of shape {tuple(shape)} and {dtype}")
        if pages_per_block <= 0:
            raise errors.InvalidArgument(f"kvpool: pages per block {pages_per_block} must be positive")
        self.layers = layers
        self.layout = Layout(model=model, dtype=str(dtype).removeprefix("torch."), num_layers=len(layers),
                             kv_heads=shape[3], head_dim=shape[4], page_tokens=shape[2],
                             pages_per_block=pages_per_block, tp_rank=tp_rank)
        self.client = client.scoped(namespace=namespace or self.layout.namespace())
        self._digest = self.layout.digest()
        # One block's payload as [layers, 2, pages, page_tokens, kv_heads, head_dim].
        self._block_shape = (len(layers), 2, pages_per_block) + tuple(shape[2:])

    @property
    def block_tokens(self):
        return self.layout.block_tokens

    def _check_pages(self, blocks, page_ids):
        """Refuses a call whose pages do not cover its blocks before any
        byte moves."""
        need = blocks * self.layout.pages_per_block
        if len(page_ids) < need:
            raise errors.InvalidArgument(f"kvpool: {blocks} blocks need {need} page ids, {len(page_ids)} were given")

    def _pages(self, page_ids, block):
        ppb = self.layout.pages_per_block
        ids = page_ids[block * ppb:(block + 1) * ppb]
        if len(ids) != ppb:
            raise errors.InvalidArgument(f"kvpool: block {block} needs pages [{block * ppb}, {(block + 1) * ppb}) but {len(page_ids)} page ids were given")
        return torch.as_tensor(ids, dtype=torch.long)

    def save(self, chain_keys, page_ids, replicas=1):
        """Writes the pages of each block of chain_keys into the pool, in
        place. Blocks the node already holds are skipped. The rest are saved
        as one batch (on the shm path: every reservation in one round trip,
        the commits sent as the blocks fill, 8 MiB of blocks at a time, and
        checksummed by the node meanwhile, the answers read once; a window
        of blocks at a time).
        Returns how many blocks it wrote. A block the node refuses
        (ResourceExhausted, ...) ends the save there: the blocks before it
        are committed, the rest not, and the refusal is raised."""
        keys = list(chain_keys)
        self._check_pages(len(keys), page_ids)
        present = self.client.exists(keys) if keys else []
        todo = [i for i, have in enumerate(present) if not have]
        window = put_window_blocks(self.layout.block_bytes)
        written = 0
        for off in range(0, len(todo), window):
            part = todo[off:off + window]
            ress = self.client.reserve_many([keys[i] for i in part], self.layout.block_bytes)
            refused = next((r for r in ress if isinstance(r, Exception)), None)
            if refused is not None:
                cut = ress.index(refused)
                for r in ress[cut + 1:]:
                    if not isinstance(r, Exception):
                        r.abort()
                part, ress = part[:cut], ress[:cut]

            def fill(k, res, part=part):
                self._fill(res, part[k], page_ids)

            for r in self.client.fill_and_commit(ress, fill, replicas):
                # AlreadyExists: another writer committed the same prefix;
                # its bytes are as good.
                if isinstance(r, Exception) and not isinstance(r, errors.AlreadyExists):
                    raise r
                written += 1
            if refused is not None:
                raise refused
        return written

    def _fill(self, res, index, page_ids):
        """Writes block index's header and pages into reservation res."""
        idx = self._pages(page_ids, index)
        res.data[:HEADER_BYTES] = _HEADER.pack(_MAGIC, _HEADER_VERSION, 0, index, self._digest).ljust(HEADER_BYTES, b"\0")
        dst = res.as_tensor(self.layers[0].dtype, None)
        dst = dst[HEADER_BYTES // dst.element_size():].view(self._block_shape)
        for layer, out in zip(self.layers, dst):
            torch.index_select(layer, 1, idx, out=out)

    def load(self, chain_keys, page_ids, start=0, verify=False):
        """Fills the pages of blocks start, start+1, ... of chain_keys that
        the node holds, straight from the pool's memory, and returns how
        many it loaded (stopping at the first missing one). The blocks are
        pinned a window at a time (on the shm path, the window's pins in
        one round trip). verify checks each block's CRC first (DataLoss). A
        block of another layout raises FailedPrecondition."""
        keys = list(chain_keys)
        self._check_pages(len(keys), page_ids)
        window = put_window_blocks(self.layout.block_bytes)
        loaded = 0
        for off in range(start, len(keys), window):
            views = self.client.view_many(keys[off:off + window])
            try:
                for i, view in enumerate(views, off):
                    if isinstance(view, errors.NotFound):
                        return loaded
                    if isinstance(view, Exception):
                        raise view
                    self._load_block(view, i, keys[i], page_ids, verify)
                    loaded += 1
            finally:
                for view in views:
                    if not isinstance(view, Exception):
                        view.release()
        return loaded

    def _load_block(self, view, index, key, page_ids, verify):
        """Copies block index's pages out of view into the caller's pages."""
        self._check(view, index, key)
        if verify:
            view.verify()
        src = view.as_tensor(self.layers[0].dtype)
        src = src[HEADER_BYTES // src.element_size():].view(self._block_shape)
        idx = self._pages(page_ids, index)
        for layer, block in zip(self.layers, src):
            layer.index_copy_(1, idx, block)

    def _check(self, view, index, key):
        if view.size != self.layout.block_bytes:
            raise errors.FailedPrecondition(f"kvpool: block {key.hex()} has {view.size} bytes; layout {self.layout.describe()} makes {self.layout.block_bytes}")
        magic, version, _, block, digest = _HEADER.unpack_from(view.data)
        if magic != _MAGIC or version != _HEADER_VERSION:
            raise errors.FailedPrecondition(f"kvpool: block {key.hex()} is not a paged KV block")
        if digest != self._digest:
            raise errors.FailedPrecondition(f"kvpool: block {key.hex()} was written under another layout than {self.layout.describe()}")
        if block != index:
            raise errors.FailedPrecondition(f"kvpool: block {key.hex()} holds chain position {block}, not {index}")

    def lookup(self, chain_keys):
        """How many leading blocks the node holds, and who holds the rest."""
        keys = list(chain_keys)
        local = self.client.locate(keys) if keys else 0
        rest = keys[local:]
        return Lookup(local, self.client.route(rest) if rest else [])
