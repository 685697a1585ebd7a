"""The Python publisher speaks the format the Go decoder's golden messages
pin (metadata/kvevents/testdata), and serves replays as vLLM does."""

import struct
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from kvpool import kvevents  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[3] / "metadata" / "kvevents" / "testdata"
TS = 1733011200.25
TOKENS = list(range(1, 33))


def golden(name):
    return [bytes.fromhex(line) for line in (GOLDEN / name).read_text().split()]


def test_the_publisher_encodes_as_the_golden_messages():
    frames = golden("array_v1.golden")
    events = [kvevents.stored([1001, 1002], 1000, TOKENS, 16), kvevents.removed([1002]), kvevents.cleared()]
    assert kvevents.encode_batch(events, ts=TS, dp_rank=0) == frames[2]
    assert frames[1] == struct.pack(">Q", 7)


def test_stored_checks_its_tokens():
    with pytest.raises(ValueError):
        kvevents.stored([1, 2], None, [1, 2, 3], 2)


def test_replay_serves_the_buffer_then_the_end_marker():
    ctx = zmq.Context()
    pub = kvevents.EventPublisher("tcp://127.0.0.1:*", replay="tcp://127.0.0.1:*")
    try:
        for i in range(3):
            pub.publish([kvevents.removed([i])], drop=True)
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(pub.replay_endpoint)
        d.send_multipart([b"", struct.pack(">Q", 1)])
        got = []
        while True:
            assert d.poll(5000), "no replay answer"
            frames = d.recv_multipart()
            assert frames[0] == b""
            if frames[1] == kvevents.END_SEQ:
                assert frames[2] == b""
                break
            got.append(struct.unpack(">Q", frames[1])[0])
        assert got == [1, 2]
        d.close()
    finally:
        pub.close()
        ctx.term()
