"""python3 -m kvpool.bench: throughput of the Python client against Python's
own limits, measured in the same run.

Each row measures one operation over one path with N clients (processes,
as engine workers are, each with its own Client and connections) and, beside it, the baseline it
must be judged against, with as many threads. Baselines are Python's own
and mirror the operation's memory traffic, as `kvpool node bench` does: a
get reads a block from a working set of WORKING_SET bytes (the arena) into
the caller's one buffer, a put writes the caller's one buffer into the
working set.

  get  data   recv_into: a loopback TCP connection in this process whose
              other end streams blocks of the same size from the working
              set, received with recv_into into one buffer, unchecked
  put  data   send: the same, the other way (sendall of one buffer,
              received into the working set)
  get  shm    numpy copyto of the same size out of the working set
  put  shm    numpy copyto of the same size into the working set
  view shm    as get; a view moves no bytes, so its figure is the block
              size over the time to pin, hand out and release it
  get, put grpc   as data: grpcio beside the raw socket, for reference
  save shm    torch.index_select of one block's pages of every layer of a
              paged KV cache into a frame of the working set (the paged
              adapter's save copies with the same calls)
  load shm    index_copy_ of one block's pages out of a frame (load's)

With --batch N a put is a put_many of N blocks, as an engine saves a
request's blocks (on the shm path, one round trip reserves them all and
one more commits them), and a view a view_many of N, as the paged
adapter's load pins a request's blocks (one round trip). Throughput
counts blocks; p50/p99 are per call.

Half of each baseline runs before the measured phase and half after, so a
noisy machine's drift hits both. Without --server it starts a standalone
daemon (kvpool.daemon.find_binary). Results go to stdout (--json for
machines), progress to stderr.
"""

import argparse
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import threading
import time

import numpy as np
import torch

from . import wire
from .client import Client
from .daemon import Daemon
from .kvcache import PagedKVAdapter

WORKING_SET = 128 << 20

BASELINES = {("get", "data"): "recv_into", ("put", "data"): "send", ("get", "grpc"): "recv_into", ("put", "grpc"): "send",
             ("get", "shm"): "copyto", ("put", "shm"): "copyto", ("view", "shm"): "copyto",
             ("save", "shm"): "index_select", ("load", "shm"): "index_copy_"}


def parse_size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1000, "MB": 10 ** 6, "B": 1}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)


class _Worker:
    """One client's state, in its own process: its Client, buffers and keys."""

    def __init__(self, server, path, size, index, blocks, working_set, baseline, put_traffic, batch=1):
        self.batch = batch
        self.client = Client(server, tenant="bench", namespace=f"py-{path}", path=path)
        self.size, self.index = size, index
        self.src = np.random.default_rng(index).integers(0, 256, size, dtype=np.uint8)
        self.dst = np.empty(size, dtype=np.uint8)
        self.keys = blocks
        self.seq = 0
        self.base_seq = index * 7
        self.working_set = working_set
        self.put_traffic = put_traffic
        self.raw = None
        if baseline in ("recv_into", "send"):
            ws_frames = [memoryview(working_set[o:o + size]) for o in range(0, working_set.size - size + 1, size)]
            self.raw = _RawLink(size, [memoryview(self.src)] if put_traffic else ws_frames)
        # Put keeps the arena from filling the way eviction would: once
        # this client has put 16 blocks (or two batches) more than it
        # removed, it removes the oldest half in one pipelined round trip.
        # That costs each put about 3 us and is counted in its time; a
        # helper thread, as `kvpool node bench` uses, would fight the put
        # for the GIL.
        self.live = []

    def op(self, name):
        c = self.client
        if name == "get":
            key = self.keys[self.seq % len(self.keys)]
            self.seq += 1
            c.get_into(key, self.dst)
        elif name == "view":
            if self.batch == 1:
                key = self.keys[self.seq % len(self.keys)]
                self.seq += 1
                c.view(key).release()
                return
            keys = [self.keys[(self.seq + i) % len(self.keys)] for i in range(self.batch)]
            self.seq += self.batch
            for v in c.view_many(keys):
                if isinstance(v, Exception):
                    raise v
                v.release()
        elif name == "put":
            keys = []
            for _ in range(self.batch):
                self.seq += 1
                keys.append(f"p{self.index}-{self.seq}-{os.getpid()}".encode())
            if self.batch == 1:
                c.put(keys[0], self.src)
            else:
                for r in c.put_many([(k, self.src) for k in keys]):
                    if isinstance(r, Exception):
                        raise r
            self.live += keys
            if len(self.live) >= max(16, 2 * self.batch):
                half = len(self.live) // 2
                c.remove_many(self.live[:half])
                del self.live[:half]

    def baseline(self, name):
        ws = self.working_set
        frame = self.base_seq % (ws.size // self.size) * self.size
        self.base_seq += 1
        if name == "copyto":
            if self.put_traffic:
                np.copyto(ws[frame:frame + self.size], self.src)
            else:
                np.copyto(self.dst, ws[frame:frame + self.size])
        else:
            self.raw.receive(memoryview(ws[frame:frame + self.size]) if self.put_traffic else memoryview(self.dst))

    def close(self):
        if self.live:
            self.client.remove_many(self.live)
        self.client.close()
        if self.raw is not None:
            self.raw.close()


class _RawLink:
    """A loopback TCP connection inside this process: a thread streams
    block after block into it (from the working set for get traffic, from
    one buffer for put traffic) and receive() reads one block out with
    recv_into. Its ends run the data channel's congestion control, so it
    moves bytes as the client's and the node's connections do."""

    def __init__(self, size, frames):
        ls = socket.create_server(("127.0.0.1", 0))
        wire.set_congestion(ls, wire.congestion_or_default(None))  # tx inherits it
        self.rx = wire.connect(*ls.getsockname(), None)
        self.tx, _ = ls.accept()
        ls.close()
        for sk in (self.rx, self.tx):
            sk.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.size, self.frames = size, frames
        self._sender = threading.Thread(target=self._send, daemon=True)
        self._sender.start()

    def _send(self):
        i = 0
        try:
            while True:
                self.tx.sendall(self.frames[i % len(self.frames)])
                i += 1
        except OSError:
            pass  # closed

    def receive(self, view):
        n = 0
        while n < self.size:
            k = self.rx.recv_into(view[n:], self.size - n)
            if k == 0:
                raise ConnectionError("raw link closed")
            n += k

    def close(self):
        self.rx.close()
        self.tx.close()
        self._sender.join()


class _PagedWorker:
    """A save or load client: an engine's paged KV cache, 4 layers of
    [2, pages, 16 tokens, 8 KV heads, 128] fp16 (64 KiB a page a layer),
    and a PagedKVAdapter whose blocks hold size bytes of pages; a request
    is batch blocks. The baseline moves one block's pages with the same
    torch calls between the cache and frames of the working set."""

    PAGE_BYTES = 4 * (64 << 10)  # one page of every layer

    def __init__(self, server, size, index, batch, working_set):
        ppb = size // self.PAGE_BYTES
        pages = ppb * batch
        g = torch.Generator().manual_seed(index)
        self.layers = [torch.randn(2, pages, 16, 8, 128, generator=g).to(torch.float16) for _ in range(4)]
        self.client = Client(server, tenant="bench", namespace="py-paged", path="shm")
        self.kv = PagedKVAdapter(self.client, self.layers, ppb, model="bench")
        self.size, self.index, self.batch, self.seq = size, index, batch, 0
        self.pages = list(range(pages))
        self.chains = []  # saved and not yet removed
        ws = torch.from_numpy(working_set[: working_set.size // size * size]).view(torch.float16)
        self.frames = ws.view(-1, 4, 2, ppb, 16, 8, 128)  # one block's pages of every layer each
        self.idx = [torch.arange(b * ppb, (b + 1) * ppb) for b in range(batch)]
        self.base_seq = index * 7

    def prepare(self, op):
        if op == "load":  # requests enough to cycle through the working set's worth
            for _ in range(max(2, WORKING_SET // (self.batch * self.size))):
                self.chains.append(self._save())

    def _save(self):
        self.seq += 1
        chain = [f"s{self.index}-{self.seq}-{i}-{os.getpid()}".encode() for i in range(self.batch)]
        if self.kv.save(chain, self.pages) != self.batch:
            raise RuntimeError("bench: a save wrote fewer blocks than its request's")
        return chain

    def op(self, name):
        if name == "save":
            # As puts do: once two requests' worth more than removed, the
            # oldest half goes.
            self.chains.append(self._save())
            if len(self.chains) >= 2 and len(self.chains) * self.batch >= 16:
                half = len(self.chains) // 2
                self.kv.client.remove_many([k for ch in self.chains[:half] for k in ch])
                del self.chains[:half]
        else:
            chain = self.chains[self.seq % len(self.chains)]
            self.seq += 1
            if self.kv.load(chain, self.pages) != self.batch:
                raise RuntimeError("bench: a load found fewer blocks than were saved")

    def baseline(self, name):
        frame = self.frames[self.base_seq % len(self.frames)]
        idx = self.idx[self.base_seq % self.batch]
        self.base_seq += 1
        if name == "index_select":
            for layer, out in zip(self.layers, frame):
                torch.index_select(layer, 1, idx, out=out)
        else:
            for layer, block in zip(self.layers, frame):
                layer.index_copy_(1, idx, block)

    def close(self):
        if self.chains:
            self.kv.client.remove_many([k for ch in self.chains for k in ch])
        self.client.close()


def _loop(fn, seconds, start_at):
    """Runs fn in a loop from start_at (time.time()) for seconds; returns
    (operations, latencies in seconds)."""
    while time.time() < start_at:
        time.sleep(min(0.001, max(0.0, start_at - time.time())))
    end = time.perf_counter() + seconds
    n, lats = 0, []
    while True:
        t = time.perf_counter()
        if t >= end:
            return n, lats
        fn()
        lats.append(time.perf_counter() - t)
        n += 1


def _client_process(conn, server, op, path, size, index, blocks, base, batch):
    """One client of a row, in its own process (as each engine worker is:
    no GIL shared between clients). It answers the parent's phases."""
    working_set = np.random.default_rng(99).integers(0, 256, max(WORKING_SET, size), dtype=np.uint8)
    if op in ("save", "load"):
        w = _PagedWorker(server, size, index, batch, working_set)
    else:
        w = _Worker(server, path, size, index, blocks, working_set, base, op == "put", batch)
    try:
        if op in ("save", "load"):
            w.prepare(op)
        elif op in ("get", "view"):
            for k in blocks:  # warm: the shm location cache, the connections
                w.client.get_into(k, w.dst)
        conn.send("ready")
        while True:
            msg = conn.recv()
            if msg is None:
                break
            phase, seconds, start_at = msg
            fn = (lambda: w.baseline(base)) if phase == "baseline" else (lambda: w.op(op))
            conn.send(_loop(fn, seconds, start_at))
    except Exception as e:
        conn.send(e)
    finally:
        w.close()


def bench_row(server, op, path, clients, size, seconds, rounds, log, batch=1):
    blocks = [f"b{i}".encode() for i in range(max(WORKING_SET // size, 1))]  # gets cycle through the working set
    base = BASELINES[(op, path)]
    if op in ("get", "view"):
        value = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
        with Client(server, tenant="bench", namespace=f"py-{path}") as c:
            for k in blocks:
                c.put(k, value)
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    try:
        for i in range(clients):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_client_process, args=(child, server, op, path, size, i, blocks, base, batch), daemon=True)
            p.start()
            pipes.append(parent)
            procs.append(p)
        for c in pipes:
            ready = c.recv()
            if isinstance(ready, Exception):
                raise ready

        def phase(name, secs):
            start_at = time.time() + 0.05
            for c in pipes:
                c.send((name, secs, start_at))
            n, lats = 0, []
            for c in pipes:
                r = c.recv()
                if isinstance(r, Exception):
                    raise r
                n += r[0]
                lats += r[1]
            return n, lats

        per_call = 1 if op == "get" else batch  # blocks per measured call
        ops = base_ops = 0
        lats = []
        for _ in range(rounds):
            base_ops += phase("baseline", seconds / 2)[0]
            n, l = phase("measure", seconds)
            ops += n * per_call
            lats += l
            base_ops += phase("baseline", seconds / 2)[0]
        gbps = ops * size / (seconds * rounds) / 1e9
        base_gbps = base_ops * size / (seconds * rounds) / 1e9
        lats.sort()
        row = {"op": op, "path": path, "clients": clients, "block_bytes": size, "batch": per_call, "gbps": round(gbps, 3),
               "baseline": base, "baseline_gbps": round(base_gbps, 3), "ratio": round(gbps / base_gbps, 3) if base_gbps else None,
               "ops": ops, "p50_us": round(lats[len(lats) // 2] * 1e6, 1) if lats else None,
               "p99_us": round(lats[int(len(lats) * 0.99)] * 1e6, 1) if lats else None}
        log(f"{op}{'' if per_call == 1 else f' of {per_call}'} {path} x{clients}: {gbps:.2f} GB/s, {base} {base_gbps:.2f} GB/s, ratio {row['ratio']}")
        return row
    finally:
        for c in pipes:
            try:
                c.send(None)
            except OSError:
                pass
        for p in procs:
            p.join(30)
        with Client(server, tenant="bench", namespace=f"py-{path}", path="grpc") as c:
            c.remove_many(blocks)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m kvpool.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--server", help="node to measure, host:port (default: start a standalone daemon)")
    p.add_argument("--op", default="all", choices=["get", "put", "view", "save", "load", "all"], help="operation (default all)")
    p.add_argument("--path", default="all", choices=["shm", "data", "grpc", "all"], help="path (default all)")
    p.add_argument("--clients", default="1,4", help="comma-separated client counts (default 1,4)")
    p.add_argument("--block-size", default="2MiB", help="value size (default 2MiB)")
    p.add_argument("--duration", type=float, default=2.0, help="seconds of each measured phase; the baseline takes as long again (default 2)")
    p.add_argument("--rounds", type=int, default=1, help="baseline-half, measure, baseline-half repeats (default 1)")
    p.add_argument("--batch", type=int, default=1,
                   help="blocks per put, view, save or load: above 1 each put or view call is a put_many or view_many of that many "
                        "blocks, as an engine saves or loads a request's blocks; a save or load is of a request of that many "
                        "blocks; p50/p99 are per call (default 1)")
    p.add_argument("--capacity", default="2GiB", help="arena of the daemon it starts (default 2GiB)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    if args.batch < 1:
        p.error(f"--batch {args.batch}: want 1 or more")
    size = parse_size(args.block_size)
    if args.op in ("save", "load", "all") and (size <= 0 or size % _PagedWorker.PAGE_BYTES):
        if args.op != "all":
            p.error(f"--block-size {args.block_size}: a save or load block holds whole pages of {_PagedWorker.PAGE_BYTES >> 10} KiB")
        args.op = "basic"
    log = lambda m: print(m, file=sys.stderr, flush=True)
    daemon = None
    server = args.server
    if not server:
        daemon = Daemon.start("py-bench", tempfile.mkdtemp(prefix="kvpool-bench-"), capacity=args.capacity, standalone=True)
        server = daemon.addr
    rows = []
    try:
        paths = ["shm", "data", "grpc"] if args.path == "all" else [args.path]
        ops = {"all": ["get", "put", "view", "save", "load"], "basic": ["get", "put", "view"]}.get(args.op, [args.op])
        for path in paths:
            for op in ops:
                if (op, path) not in BASELINES:
                    continue
                for n in (int(x) for x in args.clients.split(",")):
                    rows.append(bench_row(server, op, path, n, size, args.duration, args.rounds, log, args.batch))
    finally:
        if daemon:
            daemon.stop()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'op':5} {'path':5} {'clients':>7} {'GB/s':>8} {'baseline':>10} {'GB/s':>8} {'ratio':>6} {'p50 us':>8} {'p99 us':>8}")
        for r in rows:
            print(f"{r['op']:5} {r['path']:5} {r['clients']:>7} {r['gbps']:>8.2f} {r['baseline']:>10} {r['baseline_gbps']:>8.2f} "
                  f"{r['ratio'] if r['ratio'] is not None else '-':>6} {r['p50_us']:>8} {r['p99_us']:>8}")


if __name__ == "__main__":
    main()
