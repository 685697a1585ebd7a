"""Checks kvpool.chain against the vectors the Go package api/chain checks too."""

import json
from pathlib import Path

import pytest

from kvpool.chain import InvalidArgument, chain_keys, root

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "testdata" / "chain_vectors.json").read_text(encoding="utf-8")
)


def _extra(v):
    """A JSON extra value as Python's: lists are tuples, {"bytes": hex} is bytes."""
    if isinstance(v, list):
        return tuple(_extra(e) for e in v)
    if isinstance(v, dict):
        return bytes.fromhex(v["bytes"])
    return v


@pytest.mark.parametrize("v", VECTORS["vectors"], ids=lambda v: v["name"])
def test_vector(v):
    extra = None if v["extra"] is None else [_extra(e) for e in v["extra"]]
    keys = chain_keys(v["tokens"], v["block_tokens"], v["scheme"], v["seed"], extra)
    assert [k.hex() for k in keys] == v["keys"]
    if extra is not None:
        assert chain_keys(v["tokens"], v["block_tokens"], v["scheme"], v["seed"], extra.__getitem__) == keys


@pytest.mark.parametrize("r", VECTORS["roots"], ids=lambda r: f'{r["scheme"]}/{r["seed"]}')
def test_root(r):
    assert root(r["scheme"], r["seed"]).hex() == r["root"]


def test_numpy_tokens():
    np = pytest.importorskip("numpy")
    v = VECTORS["vectors"][0]
    want = chain_keys(v["tokens"], v["block_tokens"], v["scheme"], v["seed"])
    for dtype in (np.int64, np.int32, np.uint32):
        arr = np.array(v["tokens"], dtype=dtype)
        assert chain_keys(arr, v["block_tokens"], v["scheme"], v["seed"]) == want
        assert chain_keys(list(arr), v["block_tokens"], v["scheme"], v["seed"]) == want


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_tokens": 0},
        {"block_tokens": -1},
        {"block_tokens": 1.5},
        {"scheme": "sha1"},
        {"seed": 0},
        {"tokens": [1, -1]},
        {"tokens": [1, 2**32]},
        {"tokens": [1.0, 2.0]},
        {"extra": [(1.5,)]},
        {"extra": [({"a": 1},)]},
        {"extra": [(2**64,)]},
        {"extra": ["not a tuple"]},
        {"extra": []},
        {"extra": lambda i: (1.5,), "scheme": "sha256"},
    ],
)
def test_invalid_argument(kwargs):
    args = {"tokens": [1, 2], "block_tokens": 1, **kwargs}
    with pytest.raises(InvalidArgument):
        chain_keys(args.pop("tokens"), args.pop("block_tokens"), **args)


def test_invalid_argument_is_value_error():
    assert issubclass(InvalidArgument, ValueError)
