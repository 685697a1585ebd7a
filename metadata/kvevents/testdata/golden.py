#!/usr/bin/python3
"""Writes the golden event messages of kvevents' tests.

The bytes are what vLLM's ZmqEventPublisher sends (vllm/distributed/
kv_events.py): frames (topic, 8-byte big-endian sequence number, payload),
the payload an EventBatch encoded by msgspec. msgspec is not packaged for
Debian, so this writes msgspec's encoding with msgpack, which makes the
same choices: a struct with array_like=True is an array of its fields in
order, trailing fields equal to their defaults omitted (omit_defaults), a
tagged struct's tag (its class name) first; without array_like it is a map
whose first key is the tag field "type"; floats are float64, integers the
shortest form, bytes bin, str str.

Run from the repository root: /usr/bin/python3 metadata/kvevents/testdata/golden.py
"""
import os
import struct

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
TS = 1733011200.25
TOKENS = list(range(1, 33))  # two blocks of 16


def pack(v):
    return msgpack.packb(v, use_bin_type=True)


def write(name, frames):
    with open(os.path.join(HERE, name), "w") as f:
        for fr in frames:
            f.write(fr.hex() + "\n")


def message(seq, payload, topic=b"kv-events"):
    return [topic, struct.pack(">Q", seq), payload]


# array_like, as vLLM's example subscriber and the releases it targets:
# BlockStored(block_hashes, parent_block_hash, token_ids, block_size,
# lora_id, medium) with integer hashes.
stored_v1 = ["BlockStored", [1001, 1002], 1000, TOKENS, 16, None, "GPU"]
removed_v1 = ["BlockRemoved", [1002], "GPU"]
cleared = ["AllBlocksCleared"]
write("array_v1.golden", message(7, pack([TS, [stored_v1, removed_v1, cleared], 0])))

# array_like, later fields: lora_name, extra_keys, group_idx (the rest
# default and omitted), bytes hashes (sha256_cbor), no parent, a LoRA.
h1 = bytes(range(32))
h2 = bytes(range(32, 64))
stored_v2 = ["BlockStored", [h1, h2], None, TOKENS, 16, 3, "GPU", "sql-adapter", None, 1]
removed_v2 = ["BlockRemoved", [h1], "CPU", 1]
write("array_v2.golden", message(8, pack([TS, [stored_v2, removed_v2]])))

# Maps (no array_like): the tag field "type" first, then the fields.
stored_map = {"type": "BlockStored", "block_hashes": [-5, 2**63 - 1], "parent_block_hash": None,
              "token_ids": TOKENS, "block_size": 16, "lora_id": None, "medium": None, "lora_name": None}
removed_map = {"type": "BlockRemoved", "block_hashes": [-5], "medium": "GPU"}
write("map.golden", message(9, pack({"ts": TS, "events": [stored_map, removed_map, {"type": "AllBlocksCleared"}],
                                     "data_parallel_rank": 2})))
