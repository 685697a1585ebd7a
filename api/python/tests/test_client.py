"""kvpool.Client against live daemons, on every path."""

import os
import threading
import time

import numpy as np
import pytest
import torch

import kvpool
from kvpool import errors
from kvpool._crc import crc32c
from kvpool.daemon import Daemon

from conftest import assert_idle, wait_until

PATHS = ("shm", "data", "grpc")


def test_path_chosen(clients, node):
    for path, c in clients.items():
        assert c.path == path
        assert c.node_id == "py-node"
    with kvpool.Client(node.addr, tenant="py") as auto:
        assert auto.path == "shm"  # same host


@pytest.mark.parametrize("path", PATHS)
def test_round_trip(clients, path):
    c = clients[path]
    value = os.urandom((2 << 20) + 13)
    assert c.put(b"k1", value) == (False, crc32c(value))
    assert c.put(b"k1", value).existed
    with pytest.raises(errors.AlreadyExists):
        c.put(b"k1", os.urandom(len(value)))
    assert c.get(b"k1") == value

    buf = bytearray(len(value) + 100)
    assert c.get_into(b"k1", buf) == len(value)
    assert buf[: len(value)] == value
    arr = np.zeros(len(value) + 3, dtype=np.uint8)
    assert c.get_into(b"k1", arr) == len(value)
    assert arr[: len(value)].tobytes() == value
    t = torch.zeros(len(value), dtype=torch.uint8)
    c.get_into(b"k1", t)
    assert t.numpy().tobytes() == value

    with c.view(b"k1") as v:
        assert v.size == len(value) and v.crc == crc32c(value)
        assert bytes(v.data) == value
        assert v.as_numpy().tobytes() == value
        assert v.as_tensor().numpy().tobytes() == value
        v.verify()

    with c.reserve(b"k2", 4096) as r:
        r.as_numpy()[:] = 7
        assert r.commit() == (False, crc32c(b"\x07" * 4096))
    assert c.get(b"k2") == b"\x07" * 4096

    # A numpy array and a tensor are values too.
    floats = np.arange(1000, dtype=np.float32)
    c.put(b"k3", floats)
    assert np.frombuffer(c.get(b"k3"), dtype=np.float32).tolist() == floats.tolist()
    c.put(b"k4", torch.arange(10, dtype=torch.int64))
    assert np.frombuffer(c.get(b"k4"), dtype=np.int64).tolist() == list(range(10))

    assert c.exists([b"k1", b"k2", b"nope"]) == [True, True, False]
    assert c.locate([b"k1", b"k2", b"nope", b"k3"]) == 2
    blocks, until = c.locate([b"k1"], lease=2.0)
    assert blocks == 1 and until > time.time() * 1000
    with pytest.raises(errors.FailedPrecondition):
        c.remove(b"k1")  # under the lease
    c.remove(b"k1", force=True)
    with pytest.raises(errors.NotFound):
        c.get(b"k1")
    assert c.remove_many([b"k2", b"k3", b"k4", b"nope"]) == 3


@pytest.mark.parametrize("path", PATHS)
def test_batches(clients, path):
    c = clients[path]
    items = [(f"b{i}".encode(), os.urandom(1000 + i)) for i in range(20)]
    res = c.put_many(items)
    assert all(r == (False, crc32c(v)) for r, (_, v) in zip(res, items))
    got = c.get_many([k for k, _ in items] + [b"missing"])
    assert got[:20] == [v for _, v in items]
    assert isinstance(got[20], errors.NotFound)
    assert c.remove_many([k for k, _ in items]) == 20


@pytest.mark.parametrize("path", PATHS)
def test_batched_puts_report_each_item(clients, path):
    # Blocks of one size go through reserve_many and commit_many on the
    # shm path: one item's refusal must not hide or spoil the others'.
    c = clients[path]
    size = 64 << 10
    c.put(b"bp-held", b"\x01" * size)
    items = [(f"bp{i}".encode(), os.urandom(size)) for i in range(6)]
    items.insert(2, (b"bp-held", b"\x01" * size))  # equal bytes: existed
    items.insert(4, (b"bp-held", b"\x02" * size))  # other bytes: refused
    items.insert(6, (b"x" * 200, b"\x04" * size))  # a bad key: refused alone
    items.append((b"bp-small", b"\x03" * 100))  # another size, its own window
    items.append((b"bp-empty", b""))
    res = c.put_many(items)
    assert res[2] == (True, crc32c(b"\x01" * size))
    assert isinstance(res[4], errors.AlreadyExists)
    assert isinstance(res[6], errors.InvalidArgument)
    assert isinstance(res[-1], errors.InvalidArgument)
    for r, (k, v) in zip(res, items):
        if k.startswith(b"bp") and k != b"bp-held" and v:
            assert r == (False, crc32c(v)) and c.get(k) == v
    assert c.get(b"bp-held") == b"\x01" * size
    assert c.remove_many({k for k, v in items if k.startswith(b"bp") and v}) == 8


@pytest.mark.parametrize("path", PATHS)
def test_reserve_many_then_commit_many(clients, path):
    c = clients[path]
    ress = c.reserve_many([b"rm0", b"rm1", b"rm2"], 4096)
    for i, r in enumerate(ress):
        r.as_numpy()[:] = i
    ress[1].abort()
    with pytest.raises(errors.FailedPrecondition):
        c.commit_many(ress)  # one ended: nothing committed
    assert c.exists([b"rm0", b"rm2"]) == [False, False]
    assert c.commit_many([ress[0], ress[2]]) == [(False, crc32c(b"\x00" * 4096)), (False, crc32c(b"\x02" * 4096))]
    with pytest.raises(errors.FailedPrecondition):
        ress[0].commit()
    assert c.get(b"rm2") == b"\x02" * 4096
    assert c.reserve_many([], 4096) == []
    with pytest.raises(errors.InvalidArgument):
        c.reserve_many([b"rm3"], 0)
    assert c.remove_many([b"rm0", b"rm2"]) == 2


@pytest.mark.parametrize("path", PATHS)
def test_fill_and_commit(clients, path):
    # Each block is committed as it is filled; on shm the node takes the
    # checksums (the PutResults carry them) and the answers come at the end.
    c = clients[path]
    keys = [b"fc%d" % i for i in range(5)]
    values = [os.urandom(4096 + i) for i in range(5)]
    c.put(b"fc3", values[3])

    def fill(i, r):
        r.data[:] = values[i]

    ress = [c.reserve(k, len(v)) for k, v in zip(keys, values)]
    assert c.fill_and_commit(ress, fill) == [(i == 3, crc32c(v)) for i, v in enumerate(values)]
    assert [c.get(k) for k in keys] == values
    with pytest.raises(errors.FailedPrecondition):
        c.fill_and_commit(ress[:1], fill)  # ended: nothing filled
    assert c.fill_and_commit([], fill) == []

    # A fill that raises: the blocks before it committed, it and the rest
    # aborted (their space back), the error raised, the session in step.
    def failing(i, r):
        if i == 2:
            raise ValueError("the engine's copy failed")
        r.data[:] = b"\x05" * r.size

    held = c.stats().reservations  # a shm put's spare
    ress = c.reserve_many([b"fx0", b"fx1", b"fx2", b"fx3"], 4096)
    with pytest.raises(ValueError, match="copy failed"):
        c.fill_and_commit(ress, failing)
    assert c.exists([b"fx0", b"fx1", b"fx2", b"fx3"]) == [True, True, False, False]
    assert c.get(b"fx1") == b"\x05" * 4096
    with pytest.raises(errors.FailedPrecondition):
        ress[3].commit()
    wait_until(lambda: c.stats().reservations == held, 5.0, "the aborts")

    # Large blocks: commits go out four 2 MiB blocks at a time, the rest
    # with the aborts when a fill fails.
    big = [b"fb%d" % i for i in range(7)]
    ress = c.reserve_many(big, 2 << 20)
    with pytest.raises(ValueError, match="copy failed"):
        c.fill_and_commit(ress, lambda i, r: failing(2 if i == 5 else 0, r))
    assert c.exists(big) == [True] * 5 + [False] * 2
    assert c.get(b"fb4") == b"\x05" * (2 << 20)
    wait_until(lambda: c.stats().reservations == held, 5.0, "the aborts")
    assert c.remove_many(keys + [b"fx0", b"fx1"] + big) == 12


def test_shm_put_takes_the_spare_its_last_commit_brought(node):
    # Each put's commit reserves the next put's place (one round trip a
    # put instead of two); the spare is the session's, ended with it.
    with kvpool.Client(node.addr, tenant="py", namespace="spare", path="shm") as c:
        reservations = lambda: c.stats().reservations
        a, b, small = os.urandom(64 << 10), os.urandom(64 << 10), os.urandom(1000)
        assert c.put(b"sp-a", a) == (False, crc32c(a))
        assert reservations() == 1  # the spare
        assert c.put(b"sp-b", b) == (False, crc32c(b))  # into the spare
        assert c.put(b"sp-b", b).existed
        assert reservations() == 1
        assert c.put(b"sp-small", small) == (False, crc32c(small))  # another size: a spare of its own
        wait_until(lambda: reservations() == 1, 5.0, "the 64 KiB spare's abort")
        assert (c.get(b"sp-a"), c.get(b"sp-b"), c.get(b"sp-small")) == (a, b, small)
        with pytest.raises(errors.AlreadyExists):
            c.put(b"sp-a", os.urandom(1000))  # a refused commit of the spare aborts it
        wait_until(lambda: reservations() == 0, 5.0, "the refused spare's abort")
        assert c.get(b"sp-a") == a
        c.put(b"sp-c", small)
        assert c.remove_many([b"sp-a", b"sp-b", b"sp-small", b"sp-c"]) == 4
    with kvpool.Client(node.addr, tenant="py", path="grpc") as g:
        assert_idle(g)  # the closed session's spare is gone


@pytest.mark.parametrize("path", PATHS)
def test_view_many(clients, path):
    c = clients[path]
    values = [os.urandom(4096 + i) for i in range(3)]
    c.put_many(zip([b"vm0", b"vm1", b"vm2"], values))
    views = c.view_many([b"vm0", b"missing", b"vm2", b"vm1", b"vm0"])
    assert isinstance(views[1], errors.NotFound)
    got = [v for v in views if not isinstance(v, Exception)]
    assert [bytes(v.data) for v in got] == [values[0], values[2], values[1], values[0]]
    assert [v.crc for v in got] == [crc32c(values[i]) for i in (0, 2, 1, 0)]
    if path == "shm":
        assert c.stats().pins == 4  # in place: each view holds its block
    for v in got:
        v.release()
    assert c.view_many([]) == []
    with pytest.raises(errors.InvalidArgument):
        c.view_many([b""])
    wait_until(lambda: c.stats().pins == 0, 5.0, "the views' releases")
    assert c.remove_many([b"vm0", b"vm1", b"vm2"]) == 3


@pytest.mark.parametrize("path", PATHS)
def test_exists_of_many_keys(clients, path):
    # More keys than one window of frames (256): answered in order.
    c = clients[path]
    c.put(b"ex-held", b"v")
    keys = [b"ex%d" % i for i in range(600)]
    keys[300] = b"ex-held"
    assert c.exists(keys) == [k == b"ex-held" for k in keys]
    with pytest.raises(errors.InvalidArgument):
        c.exists([b"ok", b""])
    assert c.exists([b"ex-held"]) == [True]  # the session is still in step
    c.remove(b"ex-held")


def test_reserve_many_past_the_arena(clients):
    # Reservations cannot be evicted: a batch larger than the 256 MiB arena
    # gets space for its head and ResourceExhausted for the rest.
    c = clients["shm"]
    ress = c.reserve_many([f"big{i}".encode() for i in range(20)], 16 << 20)
    got = [r for r in ress if not isinstance(r, Exception)]
    refused = [r for r in ress if isinstance(r, Exception)]
    assert 0 < len(got) <= 16 and len(got) + len(refused) == 20
    assert all(isinstance(e, errors.ResourceExhausted) for e in refused)
    for r in got:
        r.abort()


@pytest.mark.parametrize("path", PATHS)
def test_bad_input(clients, path):
    c = clients[path]
    value = os.urandom(1 << 20)
    c.put(b"big", value)
    small = bytearray(b"\xaa" * 1000)
    with pytest.raises(errors.InvalidArgument):
        c.get_into(b"big", small)
    assert small == b"\xaa" * 1000  # not a byte moved into it
    assert c.get(b"big") == value  # and the connection is still in step
    with pytest.raises(errors.InvalidArgument):
        c.get_into(b"big", bytes(2 << 20))  # read-only
    with pytest.raises(errors.InvalidArgument):
        c.get_into(b"big", np.zeros((1024, 2048), dtype=np.uint8)[:, ::2])  # not contiguous
    with pytest.raises(errors.InvalidArgument):
        c.get(b"")
    with pytest.raises(errors.InvalidArgument):
        c.get(b"x" * 129)
    with pytest.raises(errors.InvalidArgument):
        c.put(b"empty", b"")
    with pytest.raises(errors.InvalidArgument):
        c.scoped(namespace="no spaces")
    with pytest.raises(errors.NotFound):
        c.view(b"missing")

    v = c.view(b"big")
    v.release()
    v.release()  # idempotent
    with pytest.raises(errors.FailedPrecondition):
        v.data
    with pytest.raises(errors.FailedPrecondition):
        v.as_numpy()
    r = c.reserve(b"res", 100)
    r.abort()
    with pytest.raises(errors.FailedPrecondition):
        r.data
    with pytest.raises(errors.FailedPrecondition):
        r.commit()
    with pytest.raises(errors.InvalidArgument):
        c.reserve(b"res", 0)
    c.remove(b"big")


def test_errors_are_builtin_kinds_too():
    assert issubclass(errors.InvalidArgument, ValueError)
    assert issubclass(errors.NotFound, KeyError)
    assert issubclass(errors.Unavailable, ConnectionError)
    assert issubclass(errors.DeadlineExceeded, TimeoutError)
    for cls, code in errors.CODES:
        e = errors.from_code(code, "m")
        assert type(e) is cls and e.code == code and str(e) == "m"
    assert type(errors.from_code(2, "unknown")) is errors.Internal
    with pytest.raises(errors.InvalidArgument):
        kvpool.Client("127.0.0.1:1", path="bogus")
    with pytest.raises(errors.InvalidArgument):
        kvpool.Client("no-port")


def test_data_channel_congestion_control(node):
    """The data channel's connections run the congestion control asked
    for (cubic by default, as the node's); one the kernel lacks is refused
    up front, naming what it has."""
    import socket

    for asked, want in ((None, "cubic"), ("reno", "reno")):
        with kvpool.Client(node.addr, tenant="py", namespace="cc", path="data", tcp_congestion=asked) as c:
            c.put(b"k", b"v" * 4096)
            conns = c._bytes._idle
            assert conns, "the put left no idle connection to look at"
            got = conns[0].sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
            assert got == want, (asked, got)
            c.remove(b"k")
    with pytest.raises(errors.InvalidArgument, match="the kernel has"):
        kvpool.Client(node.addr, path="data", tcp_congestion="nosuchcc")


def test_control_calls(clients):
    c = clients["grpc"]
    keys = [f"ctl{i}".encode() for i in range(4)]
    for k in keys[:3]:
        c.put(k, b"v" * 4096)
    c.report_load(0.25, 20000.0, prompt_tokens=1024, model="llama3-8b")
    est = c.estimate(keys, block_tokens=16)
    assert est.node.node_id == "py-node" and est.node.local_blocks == 3
    assert abs(est.node.queue_seconds - 0.25) < 1e-9
    assert est.summary.chain_blocks == 4 and est.summary.breakeven_bytes_per_second > 0
    plan = c.plan(keys, block_tokens=16)
    assert [n.node_id for n in plan.nodes] == ["py-node"] and plan.nodes[0].plan == "recompute"
    assert c.route(keys)[0][0].node_id == "py-node" and c.route(keys)[3] == []
    fetched = c.fetch(keys)
    assert [f.error is None for f in fetched] == [True, True, True, False]
    assert isinstance(fetched[3].error, errors.NotFound) and fetched[0].source == ""
    st = c.stats()
    assert st.node_id == "py-node" and st.blocks >= 3
    with pytest.raises(errors.InvalidArgument):
        c.plan(keys, model="no-such-model")
    assert c.remove_many(keys) == 3


def test_shm_view_is_in_place(clients):
    c = clients["shm"]
    value = os.urandom(1 << 20)
    c.put(b"inplace", value)
    with c.view(b"inplace") as a, c.view(b"inplace") as b:
        assert a.offset == b.offset >= 0
        # The same bytes of the arena, not two copies.
        assert a.as_numpy().ctypes.data == b.as_numpy().ctypes.data
        assert c.stats().pins == 2
    c.remove(b"inplace")


def test_shm_first_reads_are_checked(clients, node):
    """Bytes changed behind the node's back reach no same-host reader as
    good: a client checks the first read of every version it has not read."""
    w = clients["shm"]
    value = os.urandom(300_000)
    w.put(b"rotted", value)
    scribbler = w.view(b"rotted")
    w._bytes._mem[scribbler.offset + 1000] ^= 0xFF  # the arena, written behind the node's back
    with kvpool.Client(node.addr, tenant="py", namespace="ns-shm", path="shm") as r:
        with pytest.raises(errors.DataLoss):
            r.get_into(b"rotted", bytearray(len(value)))
        with pytest.raises(errors.DataLoss):
            r.view(b"rotted")
        w._bytes._mem[scribbler.offset + 1000] ^= 0xFF
        assert r.get(b"rotted") == value
        with r.view(b"rotted") as v:
            assert bytes(v.data) == value
    scribbler.release()
    w.remove(b"rotted")


def test_shm_location_cache_sees_changes(clients, node):
    c = clients["shm"]
    other = kvpool.Client(node.addr, tenant="py", namespace="ns-shm", path="grpc")
    try:
        first, second = os.urandom(300_000), os.urandom(300_000)
        c.put(b"cached", first)
        buf = bytearray(len(first))
        c.get_into(b"cached", buf)  # remembered
        c.get_into(b"cached", buf)  # from the cache
        assert buf == first
        other.remove(b"cached")
        with pytest.raises(errors.NotFound):
            c.get_into(b"cached", buf)  # the version word changed: asks the node
        other.put(b"cached", second)
        c.get_into(b"cached", buf)
        assert buf == second
        c.remove(b"cached")
    finally:
        other.close()


def test_many_threads_share_a_client(clients):
    for path in ("shm", "data"):
        c = clients[path]
        values = {f"t{i}".encode(): os.urandom(200_000) for i in range(8)}
        for k, v in values.items():
            c.put(k, v)
        failures = []

        def reader(k):
            buf = bytearray(200_000)
            for _ in range(30):
                c.get_into(k, buf)
                if buf != values[k]:
                    failures.append(k)

        threads = [threading.Thread(target=reader, args=(k,)) for k in values]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures
        c.remove_many(list(values))


def test_dropped_views_are_released(clients):
    c = clients["shm"]
    c.put(b"dropped", os.urandom(10000))
    for _ in range(3):
        c.view(b"dropped")  # never released: the collector finalizes it,
    # and each view's frame carried the release of the one dropped before.
    assert c.stats().pins == 1
    with c.view(b"dropped"):  # the next shm frame carries the last release
        pass
    wait_until(lambda: c.stats().pins == 0, 5.0, "the dropped views' pins to go")
    c.remove(b"dropped")


def test_close_keeps_held_views_valid(node):
    c = kvpool.Client(node.addr, tenant="py", namespace="close", path="shm")
    value = os.urandom(1 << 20)
    c.put(b"held", value)
    v = c.view(b"held")
    arr = v.as_numpy()
    c.close()
    c.close()  # idempotent
    assert arr.tobytes() == value  # still mapped: no fault
    assert bytes(v.data) == value
    v.release()
    for call in (lambda: c.get(b"held"), lambda: c.put(b"x", b"y"), lambda: c.view(b"held")):
        with pytest.raises(errors.Unavailable):
            call()
    with kvpool.Client(node.addr, tenant="py", namespace="close", path="grpc") as g:
        assert_idle(g)  # the node dropped the closed session's pins
        g.remove(b"held")


@pytest.mark.parametrize("path", ("shm", "data"))
def test_daemon_killed_during_reads(kvpool_bin, tmp_path, path):
    d = Daemon.start("py-victim", tmp_path, capacity="128MiB", standalone=True, binary=kvpool_bin)
    try:
        c = kvpool.Client(d.addr, tenant="py", namespace="victim", path=path, timeout=2.0)
        value = os.urandom(32 << 20)
        c.put(b"big", value)
        held = c.view(b"big")
        started, failure = threading.Event(), []

        def reader():
            buf = np.empty(len(value), dtype=np.uint8)
            try:
                while True:
                    c.get_into(b"big", buf)
                    started.set()
            except errors.KVPoolError as e:
                failure.append((e, time.monotonic()))

        t = threading.Thread(target=reader)
        t.start()
        assert started.wait(10)
        d.kill()
        killed = time.monotonic()
        t.join(10)
        assert not t.is_alive()
        err, at = failure[0]
        if path == "data" or not isinstance(err, errors.Unavailable):
            assert isinstance(err, errors.Unavailable), repr(err)
        assert at - killed < 2.0 + 1.0  # within the client's timeout
        # A shm view outlives its node: the pages are still mapped.
        assert bytes(held.data[:1000]) == value[:1000]
        held.release()
        if path == "data":
            with pytest.raises(errors.Unavailable):
                c.get(b"big")
        c.close()
    finally:
        d.kill()


def test_shm_client_reattaches_after_restart(kvpool_bin, tmp_path):
    """A same-host client outlives its daemon's restart: once the daemon
    is back (same data directory, same address), the client's next calls
    attach again, map the segment anew and read the blocks it kept."""
    import glob

    d, data = tmp_path / "node", tmp_path / "data"
    extra = ["--data-dir", str(data)]
    node = Daemon.start("py-restart", d, standalone=True, extra=extra, binary=kvpool_bin)
    try:
        c = kvpool.Client(node.addr, tenant="py", path="shm")
        v1 = bytes(range(256)) * 20
        c.put(b"r1", v1)
        node.stop()
        with pytest.raises(errors.Unavailable):
            c.get(b"r2")  # the node is down, and the client never read r2
        node = Daemon.start("py-restart", d, standalone=True, extra=extra + ["--listen", node.addr], binary=kvpool_bin)

        def served():
            try:
                return c.get(b"r1") == v1
            except errors.Unavailable:
                return False
        wait_until(served, what="the restarted daemon serving r1")
        c.put(b"r2", b"after" * 100)
        assert c.get(b"r2") == b"after" * 100
        assert c.path == "shm" and c._bytes.reattached >= 1
        c.close()
    finally:
        node.stop()
        for p in glob.glob("/dev/shm/kvpool-py-restart-*"):
            os.remove(p)
