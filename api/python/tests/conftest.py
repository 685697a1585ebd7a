"""Fixtures of the Python suite: real `kvpool node serve` daemons (the
binary from $KVPOOL_BIN, which the Go suite's test/python_test.go sets, or
built by kvpool.daemon.find_binary)."""

import time

import pytest

from kvpool.client import Client
from kvpool.daemon import Daemon, find_binary


@pytest.fixture(scope="session")
def kvpool_bin():
    return find_binary()


@pytest.fixture(scope="module")
def node(kvpool_bin, tmp_path_factory):
    """A standalone daemon with a 256 MiB arena."""
    d = Daemon.start("py-node", tmp_path_factory.mktemp("node"), capacity="256MiB", standalone=True, binary=kvpool_bin)
    yield d
    assert d.stop() == 0, d.log()[-4000:]


def wait_until(cond, timeout=20.0, what="condition"):
    """Polls cond until it is true: a daemon's state seen from another
    process has nothing to block on."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def assert_idle(client):
    """No pin or reservation is left behind on the client's node."""

    def idle():
        s = client.stats()
        return s.pins == 0 and s.reservations == 0

    wait_until(idle, 5.0, "the node to hold no pins and no reservations")


@pytest.fixture
def clients(node):
    """One client per path, closed after the test, which must leave the node idle."""
    out = {p: Client(node.addr, tenant="py", namespace=f"ns-{p}", path=p) for p in ("shm", "data", "grpc")}
    yield out
    for c in out.values():
        c.close()
    with Client(node.addr, tenant="py", path="grpc") as c:
        assert_idle(c)
