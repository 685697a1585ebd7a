"""Prefix-chain block keys, computed exactly as the Go package api/chain does.

A prompt is cut into blocks of block_tokens tokens and block i gets
key_i = H(key_{i-1} ‖ tokens_i ‖ extra_i), so each key names its whole
prefix: the longest prefix a node holds is the longest run of leading keys it
has. A trailing partial block gets no key, as in vLLM. Keys are 32 bytes.

Schemes:

"sha256_cbor" is vLLM's scheme (prefix_caching_hash_algo = "sha256_cbor"):
    key_i = SHA-256(CBOR([key_{i-1}, [tokens_i...], extra_i])) with canonical
    CBOR, where key_{-1} = NONE_HASH = SHA-256(CBOR(seed)) and seed is the
    engine's PYTHONHASHSEED string. Keys are the 32-byte digests vLLM uses as
    BlockHash (before it appends a 4-byte group id), so a client finds the
    blocks a vLLM engine with the same seed stored.

"sha256" is kvpool's own scheme: key_i = SHA-256(key_{i-1} ‖
    u32le(len(tokens_i)) ‖ tokens_i as u32le ‖ u32le(len(extra_i)) ‖ extra_i),
    with key_{-1} = SHA-256("kvpool/chain/v1" ‖ seed) and extra_i the
    canonical CBOR of the block's extra keys (empty when None). Its
    fixed-width token encoding is trivial to reproduce in any language.

Extra keys (LoRA name, multimodal hashes, cache salt) of a block are None or a
tuple (or list) of str, int, bytes, bool, None and nested tuples, encoded as
vLLM encodes its extra_keys tuple. Canonical CBOR here is RFC 8949 §4.2.1 as
cbor2.dumps(..., canonical=True) writes these types: shortest heads, text as
UTF-8. Stored keys depend on both encodings, so api/testdata/chain_vectors.json
pins them for the Go and Python test suites alike.
"""

import hashlib
import operator
import struct

try:
    from .errors import InvalidArgument
except ImportError:  # pragma: no cover
    class InvalidArgument(ValueError):
        pass

__all__ = ["chain_keys", "root", "InvalidArgument"]

_ROOT_PREFIX = b"kvpool/chain/v1"
_MAX_TOKEN = 0xFFFFFFFF
_H8 = struct.Struct(">BB")
_H16 = struct.Struct(">BH")
_H32 = struct.Struct(">BI")
_H64 = struct.Struct(">BQ")
_U32LE = struct.Struct("<I")
# CBOR array(3) then bytes(32): the head of [parent, tokens, extra], whose
# parent is always a 32-byte digest.
_CBOR_BLOCK_HEAD = b"\x83\x58\x20"


def _head(out, major, arg):
    """Appends a CBOR head (major type, argument) in its shortest form."""
    m = major << 5
    if arg < 24:
        out.append(m | arg)
    elif arg < 0x100:
        out += _H8.pack(m | 24, arg)
    elif arg < 0x10000:
        out += _H16.pack(m | 25, arg)
    elif arg < 0x100000000:
        out += _H32.pack(m | 26, arg)
    elif arg < 0x10000000000000000:
        out += _H64.pack(m | 27, arg)
    else:
        # cbor2 would write a bignum tag; the Go side has no such integers.
        raise InvalidArgument(f"integer {arg} does not fit a CBOR head")


def _encode(out, v):
    """Appends the canonical CBOR of v to the bytearray out."""
    if v is None:
        out.append(0xF6)
    elif v is True:
        out.append(0xF5)
    elif v is False:
        out.append(0xF4)
    elif isinstance(v, int):
        if v >= 0:
            _head(out, 0, v)
        else:
            _head(out, 1, -1 - v)
    elif isinstance(v, str):
        try:
            b = v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidArgument(f"extra key {v!r} is not valid Unicode: {e}") from None
        _head(out, 3, len(b))
        out += b
    elif isinstance(v, (bytes, bytearray)):
        _head(out, 2, len(v))
        out += v
    elif isinstance(v, (tuple, list)):
        _head(out, 4, len(v))
        for e in v:
            _encode(out, e)
    else:
        raise InvalidArgument(f"cannot encode {type(v).__name__} as CBOR")


def _seed_bytes(seed):
    if not isinstance(seed, str):
        raise InvalidArgument(f"chain seed must be a str, not {type(seed).__name__}")
    try:
        return seed.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgument(f"chain seed is not valid Unicode: {e}") from None


def root(scheme, seed="0"):
    """Returns key_{-1}, the parent of block 0 (vLLM's NONE_HASH for sha256_cbor)."""
    s = _seed_bytes(seed)
    if scheme == "sha256_cbor":
        out = bytearray()
        _head(out, 3, len(s))
        out += s
        return hashlib.sha256(out).digest()
    if scheme == "sha256":
        return hashlib.sha256(_ROOT_PREFIX + s).digest()
    raise InvalidArgument(f"unknown chain scheme {scheme!r} (want sha256 or sha256_cbor)")


def _token_list(tokens):
    if hasattr(tokens, "tolist"):  # numpy arrays, torch tensors
        tokens = tokens.tolist()
    try:
        toks = [operator.index(t) for t in tokens]
    except TypeError as e:
        raise InvalidArgument(f"tokens must be integers: {e}") from None
    if toks and (min(toks) < 0 or max(toks) > _MAX_TOKEN):
        raise InvalidArgument("tokens must be in [0, 2**32)")
    return toks


def _extra_of(extra, n):
    """Returns block index -> that block's extra keys."""
    if extra is None:
        return lambda i: None
    if callable(extra):
        return extra
    extras = list(extra)
    if len(extras) < n:
        raise InvalidArgument(f"{len(extras)} per-block extras for {n} full blocks")
    return extras.__getitem__


def chain_keys(tokens, block_tokens, scheme="sha256_cbor", seed="0", extra=None):
    """Cuts tokens into full blocks of block_tokens and returns one key per block.

    tokens is a sequence of ints in [0, 2**32) or anything with .tolist()
    (numpy array, torch tensor). extra is None (no extra keys), a callable
    block index -> extra keys, or a sequence of extra keys with an entry for
    at least every full block; a block's extra keys are None or a tuple/list.
    Raises InvalidArgument for block_tokens <= 0, an unknown scheme, a token
    out of range, or extra keys that cannot be encoded (float, dict, ...).
    """
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens <= 0:
        raise InvalidArgument(f"block tokens {block_tokens!r} must be a positive int")
    parent = root(scheme, seed)
    toks = _token_list(tokens)
    n = len(toks) // block_tokens
    extra_of = _extra_of(extra, n)
    cbor = scheme == "sha256_cbor"
    if cbor:
        tokens_head = bytearray()
        _head(tokens_head, 4, block_tokens)
    else:
        block_fmt = struct.Struct(f"<I{block_tokens}I")
    keys = []
    for i in range(n):
        block = toks[i * block_tokens:(i + 1) * block_tokens]
        ex = extra_of(i)
        if ex is not None and not isinstance(ex, (tuple, list)):
            raise InvalidArgument(f"extra keys of block {i} must be None or a tuple, not {type(ex).__name__}")
        if cbor:
            buf = bytearray(_CBOR_BLOCK_HEAD)
            buf += parent
            buf += tokens_head
            for t in block:
                if t < 24:
                    buf.append(t)
                else:
                    _head(buf, 0, t)
            if ex is None:
                buf.append(0xF6)
            else:
                _encode(buf, ex)
        else:
            enc = bytearray()
            if ex is not None:
                _encode(enc, ex)
            buf = parent + block_fmt.pack(block_tokens, *block) + _U32LE.pack(len(enc)) + enc
        parent = hashlib.sha256(buf).digest()
        keys.append(parent)
    return keys
