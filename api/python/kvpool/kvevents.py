"""Publish an engine's KV-cache events in vLLM's format.

vLLM announces what its prefix cache holds over ZeroMQ
(vllm/distributed/kv_events.py): a PUB socket sends messages of three
frames, the topic, an 8-byte big-endian sequence number and a MessagePack
EventBatch; a ROUTER socket replays buffered messages to a subscriber that
missed some (it sends the first sequence number it wants, 8 bytes
big-endian, and gets (sequence, payload) pairs, then (-1, b"")). kvpool's
daemons subscribe to that stream. This module speaks it for engines that
are not vLLM, and for tests that drive the daemons from another process.

The encoding is msgspec's array_like form, as vLLM's subscriber example
decodes it: a batch is [ts, events, data_parallel_rank], an event is its
tag then its fields in order (BlockStored: block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium).

    pub = EventPublisher("tcp://127.0.0.1:5557", replay="tcp://127.0.0.1:5558")
    pub.publish([stored([h1, h2], None, tokens, 16)])
    pub.close()
"""

import struct
import threading
import time
from collections import deque

import msgpack
import zmq

END_SEQ = struct.pack(">q", -1)


def stored(block_hashes, parent, token_ids, block_size, medium="GPU", lora_id=None):
    """A BlockStored event: block_hashes (ints or bytes) in chain order,
    under parent (None for a chain's first block); token_ids holds
    block_size tokens per block."""
    if len(token_ids) != len(block_hashes) * block_size:
        raise ValueError("%d token ids for %d blocks of %d" % (len(token_ids), len(block_hashes), block_size))
    return ["BlockStored", list(block_hashes), parent, list(token_ids), block_size, lora_id, medium]


def removed(block_hashes, medium="GPU"):
    """A BlockRemoved event."""
    return ["BlockRemoved", list(block_hashes), medium]


def cleared():
    """An AllBlocksCleared event."""
    return ["AllBlocksCleared"]


def encode_batch(events, ts=None, dp_rank=0):
    """The payload of one message: an EventBatch as msgspec encodes it."""
    return msgpack.packb([time.time() if ts is None else ts, events, dp_rank], use_bin_type=True)


class EventPublisher:
    """A PUB socket (bound, as vLLM binds it) and, with replay, a ROUTER
    socket answering replay requests from a buffer of the last
    buffer_steps messages. Not thread-safe: publish from one thread."""

    def __init__(self, endpoint, replay=None, topic="kv-events", buffer_steps=10000):
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        # The endpoints as bound: "tcp://127.0.0.1:*" takes a free port.
        self.endpoint = self._pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.replay_endpoint = None
        self._topic = topic.encode()
        self._seq = 0
        self._lock = threading.Lock()
        self._buffer = deque(maxlen=buffer_steps)
        self._stop = threading.Event()
        self._thread = None
        if replay:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(replay)
            self.replay_endpoint = self._router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self._thread = threading.Thread(target=self._serve_replay, daemon=True)
            self._thread.start()

    @property
    def next_seq(self):
        return self._seq

    def publish(self, events, drop=False, ts=None):
        """Send one batch of events; with drop, number and buffer it but do
        not send it (a message lost on the way, for tests). Returns its
        sequence number."""
        payload = encode_batch(events, ts)
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
        if not drop:
            self._pub.send_multipart([self._topic, struct.pack(">Q", seq), payload])
        return seq

    def restart(self):
        """Start the sequence again at 0 and forget the buffer, as a
        restarted engine does."""
        with self._lock:
            self._seq = 0
            self._buffer.clear()

    def _serve_replay(self):
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            frames = self._router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue
            ident, start = frames[0], struct.unpack(">Q", frames[2])[0]
            with self._lock:
                items = [(s, p) for s, p in self._buffer if s >= start]
            for s, p in items:
                self._router.send_multipart([ident, b"", struct.pack(">Q", s), p])
            self._router.send_multipart([ident, b"", END_SEQ, b""])

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
            self._router.close()
        self._pub.close()
        self._ctx.term()


def main():
    """A publisher driven by lines on stdin, for tests in other languages.
    Arguments: ENDPOINT [REPLAY|-], where tcp://HOST:* takes a free port;
    it prints "ready ENDPOINT REPLAY" as bound, then reads:
        stored H,H PARENT|- BLOCK_SIZE     (tokens: H*10+i)
        removed H,H
        cleared
        drop stored ...                   (numbered, buffered, not sent)
        restart
    Each line is one batch; "ok SEQ" is printed after it."""
    import sys

    endpoint, replay = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None)
    pub = EventPublisher(endpoint, replay)
    print("ready %s %s" % (pub.endpoint, pub.replay_endpoint or "-"), flush=True)
    for line in sys.stdin:
        f = line.split()
        if not f:
            continue
        drop = f[0] == "drop"
        if drop:
            f = f[1:]
        if f[0] == "restart":
            pub.restart()
            print("ok -", flush=True)
            continue
        if f[0] == "quit":
            break
        if f[0] == "stored":
            hashes = [int(x) for x in f[1].split(",")]
            parent = None if f[2] == "-" else int(f[2])
            bs = int(f[3])
            tokens = [h * 10 + i for h in hashes for i in range(bs)]
            ev = stored(hashes, parent, tokens, bs)
        elif f[0] == "removed":
            ev = removed([int(x) for x in f[1].split(",")])
        elif f[0] == "cleared":
            ev = cleared()
        else:
            print("error unknown command", flush=True)
            continue
        print("ok %d" % pub.publish([ev], drop=drop), flush=True)
    pub.close()


if __name__ == "__main__":
    main()
