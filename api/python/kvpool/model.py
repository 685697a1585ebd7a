"""A small, real decoder-only transformer with a paged KV cache in vLLM's layout.

What it is
----------
A Llama-shaped model (token embedding, RMSNorm, rotary position embedding,
grouped-query causal attention, SwiGLU MLP, untied LM head) written directly in
torch, with random but deterministic weights (drawn from a ``torch.Generator``
seeded by ``ModelConfig.seed``). It computes in the config's dtype (fp32 by
default) on the CPU and returns fp32 logits.

Why it exists
-------------
kvpool stores and serves KV-cache blocks for inference engines. Its engine
tests and demo need KV that is *real*: produced by attention layers, laid out
the way vLLM lays out its paged cache, position dependent, and consumed again
by attention. With this model a test can prefill a prompt, ship the cache pages
through the pool, load them into different pages of another cache, and check
that continuing from the loaded pages gives exactly the tokens (and, within
float tolerance, the logits) of recomputing the whole prompt.

Contracts
---------
* Layout. ``PagedKVCache.layers[l]`` is one contiguous tensor per layer of shape
  ``[2, num_pages, page_tokens, n_kv_heads, head_dim]``: index 0 of the first
  dimension is K, index 1 is V (vLLM's layout). Position ``p`` of a sequence
  whose pages are ``page_ids`` lives in page ``page_ids[p // page_tokens]``,
  slot ``p % page_tokens``, of every layer.
* K is stored after RoPE is applied, as vLLM does: cached K depends on the
  absolute position, so cached pages are reusable only at the positions they
  were computed for (a prefix, loaded page for page).
* Who owns pages. The cache owns the storage and a simple allocator
  (``allocate``/``free``); the caller owns the mapping of a sequence to pages
  (``page_ids``) and must give every call enough pages to cover the positions
  it reads and writes. The model never allocates or frees pages.
* What is written. ``Model.prefill(tokens, cache, page_ids, start)`` reads K/V
  of positions ``[0, start)`` from the pages (they must already be there, by an
  earlier prefill or a load from the pool), computes positions
  ``[start, len(tokens))``, writes exactly those positions' K/V into their page
  slots, and returns their logits. Slots outside ``[start, len(tokens))`` are
  not touched (a partially filled last page keeps whatever its later slots
  held). ``Model.decode(token, position, ...)`` writes only ``position``.
  ``Model.generate`` writes the prompt's positions and those of every generated
  token except the last one (which is never fed back).
* Compatibility. ``ModelConfig.fingerprint()`` names everything that makes KV
  bytes interchangeable (dims, dtype, weight seed, eps, RoPE base, and the
  version of this code); callers put it in the pool namespace so KV from a
  different model is never mistaken for this one's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

__all__ = ["ModelConfig", "Model", "PagedKVCache"]

# Bump when the architecture or weight-initialisation code changes in a way
# that changes the KV bytes; it is part of every fingerprint.
MODEL_CODE_VERSION = "kvpool.model/1"

_DTYPE_SHORT = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
}

TokenSeq = Union[torch.Tensor, Sequence[int]]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Dimensions and seed of the model; all of them shape the KV bytes."""

    vocab_size: int = 4096
    n_layers: int = 4
    n_heads: int = 8  # query heads
    n_kv_heads: int = 2  # key/value heads (grouped-query attention)
    head_dim: int = 64
    ffn_hidden: int = 1536  # SwiGLU inner width
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    seed: int = 0
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_hidden"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive")
        if self.n_heads % self.n_kv_heads:
            raise ValueError("ModelConfig.n_heads must be a multiple of n_kv_heads")
        if self.head_dim % 2:
            raise ValueError("ModelConfig.head_dim must be even (RoPE rotates pairs)")
        if int(self.seed) < 0:
            raise ValueError("ModelConfig.seed must be non-negative")
        if self.dtype not in _DTYPE_SHORT:
            raise ValueError(f"ModelConfig.dtype {self.dtype} is not a supported float dtype")

    @property
    def hidden(self) -> int:
        """Model width: n_heads * head_dim."""
        return self.n_heads * self.head_dim

    def fingerprint(self) -> str:
        """A short stable name of what makes KV bytes compatible.

        Made of [A-Za-z0-9._-] only and at most 40 characters, e.g.
        ``tiny-l4h8kv2d64-f32-s0-1a2b3c4d``: a readable part (layers, heads,
        KV heads, head dim, dtype, seed) and a hash over every field plus the
        code version, so configs differing in anything else (vocab, FFN width,
        eps, RoPE base) still get different names.
        """
        canon = "|".join(
            [
                MODEL_CODE_VERSION,
                f"vocab={self.vocab_size}",
                f"layers={self.n_layers}",
                f"heads={self.n_heads}",
                f"kv_heads={self.n_kv_heads}",
                f"head_dim={self.head_dim}",
                f"ffn={self.ffn_hidden}",
                f"rope_theta={float(self.rope_theta)!r}",
                f"rms_eps={float(self.rms_eps)!r}",
                f"seed={int(self.seed)}",
                f"dtype={_DTYPE_SHORT[self.dtype]}",
            ]
        )
        digest = hashlib.sha256(canon.encode("ascii")).hexdigest()
        readable = (
            f"tiny-l{self.n_layers}h{self.n_heads}kv{self.n_kv_heads}d{self.head_dim}"
            f"-{_DTYPE_SHORT[self.dtype]}-s{int(self.seed)}"
        )
        name = f"{readable}-{digest[:8]}"
        if len(name) > 40:
            name = f"tiny-{digest[:24]}"
        return name


class PagedKVCache:
    """Per-layer paged K/V storage in vLLM's layout, with a page allocator.

    ``layers[l]`` has shape ``[2, num_pages, page_tokens, n_kv_heads, head_dim]``
    (0 = K after RoPE, 1 = V) and is contiguous. Storage starts zeroed.
    """

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        page_tokens: int,
        device: Union[str, torch.device] = "cpu",
    ) -> None:
        if num_pages <= 0 or page_tokens <= 0:
            raise ValueError("num_pages and page_tokens must be positive")
        self.config = config
        self.num_pages = int(num_pages)
        self.page_tokens = int(page_tokens)
        shape = (2, self.num_pages, self.page_tokens, config.n_kv_heads, config.head_dim)
        self.layers: List[torch.Tensor] = [
            torch.zeros(shape, dtype=config.dtype, device=device) for _ in range(config.n_layers)
        ]
        self._free: List[int] = list(range(self.num_pages))
        self._used: set = set()

    @property
    def element_size(self) -> int:
        return self.layers[0].element_size()

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one position over all layers: n_layers*2*n_kv_heads*head_dim*elem."""
        c = self.config
        return c.n_layers * 2 * c.n_kv_heads * c.head_dim * self.element_size

    @property
    def page_bytes(self) -> int:
        """KV bytes of one page over all layers (bytes_per_token * page_tokens)."""
        return self.bytes_per_token * self.page_tokens

    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages_for(self, n_tokens: int) -> int:
        """Number of pages that hold n_tokens positions."""
        return -(-int(n_tokens) // self.page_tokens)

    def allocate(self, n: int) -> List[int]:
        """Take n free pages (lowest ids first); raises MemoryError if too few."""
        n = int(n)
        if n < 0:
            raise ValueError("cannot allocate a negative number of pages")
        if n > len(self._free):
            raise MemoryError(f"KV cache has {len(self._free)} free pages, {n} asked")
        self._free.sort()
        pages, self._free = self._free[:n], self._free[n:]
        self._used.update(pages)
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Return pages to the allocator; freeing a page that is not allocated raises."""
        pages = [int(p) for p in pages]
        if len(set(pages)) != len(pages):
            raise ValueError("free: duplicate page ids")
        for p in pages:
            if p not in self._used:
                raise ValueError(f"free: page {p} is not allocated")
        for p in pages:
            self._used.remove(p)
            self._free.append(p)


def _as_tokens(tokens: TokenSeq) -> torch.Tensor:
    t = torch.as_tensor(tokens, dtype=torch.long)
    if t.dim() != 1:
        raise ValueError("tokens must be 1-D")
    return t


class Model:
    """Llama-shaped decoder-only transformer over a PagedKVCache (inference only)."""

    def __init__(
        self,
        config: Optional[ModelConfig] = None,
        device: Union[str, torch.device] = "cpu",
        use_mkldnn: Optional[bool] = None,
    ) -> None:
        """Build the model with weights drawn from ``torch.Generator(seed)``.

        ``use_mkldnn`` picks the GEMM used for matmuls: oneDNN's fp32 linear
        (default where available: fp32 on the CPU), or plain ``torch.matmul``.
        Debian's torch links the reference BLAS, whose fp32 matmul runs at a
        few GFLOP/s, about 40x slower than oneDNN; both compute the same
        products (results agree to float rounding, and each is deterministic).
        """
        self.config = config = config or ModelConfig()
        self.device = torch.device(device)
        mkldnn_ok = (
            self.device.type == "cpu"
            and config.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and hasattr(torch._C._nn, "mkldnn_linear")
        )
        if use_mkldnn and not mkldnn_ok:
            raise ValueError("oneDNN (mkldnn) linear needs fp32 on a CPU torch built with it")
        self.use_mkldnn = mkldnn_ok if use_mkldnn is None else bool(use_mkldnn)
        g = torch.Generator(device="cpu")
        g.manual_seed(int(config.seed))
        H, D = config.hidden, config.head_dim
        nq, nkv, F = config.n_heads, config.n_kv_heads, config.ffn_hidden
        # Residual-branch outputs are scaled down so the residual stream stays O(1).
        out_scale = 1.0 / math.sqrt(2 * config.n_layers)

        def normal(shape: Tuple[int, ...], std: float) -> torch.Tensor:
            # Drawn in fp32 on the CPU so every dtype/device sees the same values.
            w = torch.randn(shape, generator=g, dtype=torch.float32) * std
            return w.to(device=self.device, dtype=config.dtype).contiguous()

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, dtype=config.dtype, device=self.device)

        # Weights are [in, out]: activations multiply as x @ W.
        w: Dict[str, torch.Tensor] = {}
        w["embed"] = normal((config.vocab_size, H), 1.0)
        for l in range(config.n_layers):
            p = f"layers.{l}."
            w[p + "attn_norm"] = ones(H)
            w[p + "wqkv"] = normal((H, (nq + 2 * nkv) * D), 1.0 / math.sqrt(H))
            w[p + "wo"] = normal((nq * D, H), out_scale / math.sqrt(nq * D))
            w[p + "mlp_norm"] = ones(H)
            w[p + "w_gate_up"] = normal((H, 2 * F), 1.0 / math.sqrt(H))
            w[p + "w_down"] = normal((F, H), out_scale / math.sqrt(F))
        w["final_norm"] = ones(H)
        w["lm_head"] = normal((H, config.vocab_size), 1.0 / math.sqrt(H))
        self.weights = w
        # oneDNN copies of the matmul weights, [out, in] as its linear wants.
        self._mk: Dict[str, torch.Tensor] = {}
        if self.use_mkldnn:
            for name, t in w.items():
                if t.dim() == 2 and name != "embed":
                    self._mk[name] = t.t().contiguous().to_mkldnn()
        half = torch.arange(0, D, 2, dtype=torch.float64) / D
        self._inv_freq = 1.0 / (float(config.rope_theta) ** half)  # [D/2], float64

    # -- building blocks -------------------------------------------------

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x [T, in] @ weights[name] [in, out]."""
        if self.use_mkldnn:
            return torch._C._nn.mkldnn_linear(x.contiguous().to_mkldnn(), self._mk[name], None).to_dense()
        return x @ self.weights[name]

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """Causal GQA attention of computed queries over all cached keys.

        q [T, n_heads, D] (query head h uses KV head h // group); k, v
        [end, n_kv_heads, D]; masked [T, end] is True where a key is in the
        query's future. Returns [T, n_heads * D].
        """
        c = self.config
        T, nq, D = q.shape
        end, nkv = k.shape[0], c.n_kv_heads
        group = nq // nkv
        scale = 1.0 / math.sqrt(D)
        # Per KV head, its group's queries stacked as rows: [nkv, group*T, D].
        qg = q.view(T, nkv, group, D).permute(1, 2, 0, 3).reshape(nkv, group * T, D)
        if self.use_mkldnn:
            outs = []
            for n in range(nkv):
                qn = qg[n].to_mkldnn()
                scores = torch._C._nn.mkldnn_linear(qn, k[:, n].contiguous().to_mkldnn(), None).to_dense()
                scores = scores.mul_(scale).view(group, T, end).masked_fill_(masked, float("-inf"))
                probs = torch.softmax(scores, dim=-1).view(group * T, end)
                vt = v[:, n].t().contiguous().to_mkldnn()  # [D, end]
                outs.append(torch._C._nn.mkldnn_linear(probs.to_mkldnn(), vt, None).to_dense())
            attn = torch.stack(outs)  # [nkv, group*T, D]
        else:
            scores = torch.matmul(qg, k.permute(1, 2, 0)).mul_(scale).view(nkv, group, T, end)
            scores.masked_fill_(masked, float("-inf"))
            probs = torch.softmax(scores, dim=-1).view(nkv, group * T, end)
            attn = torch.matmul(probs, v.transpose(0, 1))
        return attn.view(nkv, group, T, D).permute(2, 0, 1, 3).reshape(T, nq * D)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(var + self.config.rms_eps) * weight

    def _rope_tables(self, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        # Angles in float64 per absolute position, so a position's rotation is
        # the same whichever batch it is computed in.
        ang = positions.to(torch.float64)[:, None] * self._inv_freq[None, :]
        ang = torch.cat([ang, ang], dim=-1)  # [T, D]
        cos = ang.cos().to(device=self.device, dtype=self.config.dtype)[:, None, :]
        sin = ang.sin().to(device=self.device, dtype=self.config.dtype)[:, None, :]
        return cos, sin  # [T, 1, D]

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, heads, D]; rotate-half convention (Llama / HF).
        d = x.shape[-1] // 2
        rot = torch.cat([-x[..., d:], x[..., :d]], dim=-1)
        return x * cos + rot * sin

    def _check_pages(self, cache: PagedKVCache, page_ids: torch.Tensor, end: int) -> torch.Tensor:
        if cache.config.n_layers != self.config.n_layers or cache.layers[0].shape[3:] != (
            self.config.n_kv_heads,
            self.config.head_dim,
        ) or cache.layers[0].dtype != self.config.dtype:
            raise ValueError("KV cache was made for a different model config")
        need = cache.pages_for(end)
        if page_ids.dim() != 1 or page_ids.numel() < need:
            raise ValueError(f"page_ids cover {page_ids.numel()} pages; positions [0, {end}) need {need}")
        used = page_ids[:need]
        if need and (int(used.min()) < 0 or int(used.max()) >= cache.num_pages):
            raise ValueError("page id out of range")
        if torch.unique(used).numel() != need:
            raise ValueError("page_ids repeat a page")
        return used

    # -- forward over positions [start, start + len(new_tokens)) -----------

    @torch.no_grad()
    def _forward(
        self, new_tokens: torch.Tensor, start: int, cache: PagedKVCache, page_ids: TokenSeq
    ) -> torch.Tensor:
        c = self.config
        T = int(new_tokens.numel())
        end = start + T
        pages = self._check_pages(cache, torch.as_tensor(page_ids, dtype=torch.long), end)
        pages = pages.to(self.device)
        if T == 0:
            return torch.empty(0, c.vocab_size, dtype=torch.float32)
        if int(new_tokens.min()) < 0 or int(new_tokens.max()) >= c.vocab_size:
            raise ValueError("token id out of the vocabulary")
        pt = cache.page_tokens
        nq, nkv, D = c.n_heads, c.n_kv_heads, c.head_dim
        w = self.weights

        positions = torch.arange(start, end, dtype=torch.long, device=self.device)
        cos, sin = self._rope_tables(positions)
        # Flat slot of each computed position: page * page_tokens + offset.
        slots = pages[positions // pt] * pt + positions % pt
        # Causal mask over [computed queries, all keys 0..end): key j visible to
        # the query at absolute position p iff j <= p.
        keys = torch.arange(end, device=self.device)
        masked = keys[None, :] > positions[:, None]  # [T, end]

        x = w["embed"].index_select(0, new_tokens.to(self.device))  # [T, H]
        for l in range(c.n_layers):
            p = f"layers.{l}."
            h = self._rms_norm(x, w[p + "attn_norm"])
            qkv = self._linear(h, p + "wqkv")
            q = qkv[:, : nq * D].view(T, nq, D)
            k = qkv[:, nq * D : (nq + nkv) * D].view(T, nkv, D)
            v = qkv[:, (nq + nkv) * D :].view(T, nkv, D)
            q = self._rope(q, cos, sin)
            k = self._rope(k, cos, sin)  # stored post-RoPE, as vLLM does

            layer = cache.layers[l]
            flat = layer.view(2, cache.num_pages * pt, nkv, D)
            flat.index_copy_(1, slots, torch.stack([k, v]))
            # All K/V of positions [0, end), gathered once from the pages.
            kv = layer.index_select(1, pages).reshape(2, pages.numel() * pt, nkv, D)[:, :end]
            attn = self._attention(q, kv[0], kv[1], masked)
            x = x + self._linear(attn, p + "wo")

            h = self._rms_norm(x, w[p + "mlp_norm"])
            gate, up = self._linear(h, p + "w_gate_up").chunk(2, dim=-1)
            x = x + self._linear(torch.nn.functional.silu(gate) * up, p + "w_down")

        x = self._rms_norm(x, w["final_norm"])
        return self._linear(x, "lm_head").float()

    # -- public API ------------------------------------------------------

    def prefill(self, tokens: TokenSeq, cache: PagedKVCache, page_ids: TokenSeq, start: int = 0) -> torch.Tensor:
        """Compute prompt positions [start, len(tokens)) over cached [0, start).

        ``tokens`` is the whole prompt; ``page_ids[i]`` holds positions
        ``[i*page_tokens, (i+1)*page_tokens)`` and must cover the prompt.
        K/V of positions before ``start`` are read from the pages; those of
        ``[start, len)`` are written there. Returns fp32 logits
        ``[len - start, vocab_size]`` of the computed positions.
        """
        toks = _as_tokens(tokens)
        start = int(start)
        if not 0 <= start < toks.numel():
            raise ValueError(f"start {start} must be in [0, {toks.numel()})")
        return self._forward(toks[start:], start, cache, page_ids)

    def decode(self, token: int, position: int, cache: PagedKVCache, page_ids: TokenSeq) -> torch.Tensor:
        """One step: feed ``token`` at ``position`` (K/V of [0, position) cached).

        Writes the K/V of ``position`` into its page; returns fp32 logits [vocab_size].
        """
        position = int(position)
        if position < 0:
            raise ValueError("position must be non-negative")
        tok = torch.tensor([int(token)], dtype=torch.long)
        return self._forward(tok, position, cache, page_ids)[0]

    def generate(
        self, prompt: TokenSeq, n_new: int, cache: PagedKVCache, page_ids: TokenSeq, start: int = 0
    ) -> Tuple[List[int], List[torch.Tensor]]:
        """Greedy (argmax) generation of ``n_new`` tokens after ``prompt``.

        Prefills ``[start, len(prompt))`` (``[0, start)`` must be cached), then
        decodes. ``page_ids`` must cover ``len(prompt) + n_new - 1`` positions
        (the last generated token is not fed back). Returns the new tokens and,
        for each, the fp32 logits it was chosen from: the last prefill
        position's, then each decode step's.
        """
        toks = _as_tokens(prompt)
        logits = self.prefill(toks, cache, page_ids, start)[-1]
        new_tokens: List[int] = []
        logits_list: List[torch.Tensor] = []
        pos = toks.numel()
        for i in range(int(n_new)):
            logits_list.append(logits)
            nxt = int(torch.argmax(logits))
            new_tokens.append(nxt)
            if i + 1 < n_new:
                logits = self.decode(nxt, pos, cache, page_ids)
                pos += 1
        return new_tokens, logits_list
