"""python3 -m kvpool.bench against a live daemon: each row measures its
operation and its baseline in the same run, batched puts included."""

import json

import pytest

from kvpool import bench
from kvpool.client import Client

from conftest import assert_idle


@pytest.mark.parametrize("op,batch", [("put", 4), ("put", 1), ("view", 4), ("get", 1), ("save", 4), ("load", 2)])
def test_bench_rows(node, capsys, op, batch):
    bench.main(["--server", node.addr, "--op", op, "--path", "shm", "--clients", "1", "--block-size", "256KiB",
                "--duration", "0.2", "--batch", str(batch), "--json"])
    [row] = json.loads(capsys.readouterr().out)
    assert (row["op"], row["path"], row["clients"], row["block_bytes"]) == (op, "shm", 1, 256 << 10)
    assert row["batch"] == (1 if op == "get" else batch)
    assert row["ops"] > 0 and row["gbps"] > 0 and row["baseline_gbps"] > 0
    assert row["baseline"] == {"save": "index_select", "load": "index_copy_"}.get(op, "copyto")
    assert row["ratio"] == pytest.approx(row["gbps"] / row["baseline_gbps"], abs=0.01)
    with Client(node.addr, path="grpc") as c:
        assert_idle(c)  # the clients' processes ended their reservations and pins


@pytest.mark.parametrize("args,says", [(["--batch", "0"], "--batch 0"), (["--op", "save", "--block-size", "100KiB"], "whole pages")])
def test_bench_refuses_bad_flags(node, capsys, args, says):
    with pytest.raises(SystemExit):
        bench.main(["--server", node.addr] + args)
    assert says in capsys.readouterr().err
