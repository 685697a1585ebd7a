"""kvpool.Client: one node of the pool, from Python, as fast as the Go client.

Block bytes move over one path, chosen when the client connects and never
changed behind the caller's back:

- "shm": the node runs on this host. The client receives the node's arena
  (a memfd) over its unix socket and maps it; view() pins a block and hands
  out its bytes in place, reserve() hands out writable space in the arena
  for commit(), get_into() copies straight out of the arena. A location
  cache lets a repeat get_into() of a block copy with no round trip at all,
  checked against the node's version words like a seqlock.
- "data": the framed data channel on the node's gRPC port (api/wire).
  Values are received straight into the caller's buffer with recv_into and
  sent from it with sendmsg, and checked with CRC-32C.
- "grpc": protobuf over grpcio, the portable and slow path.

"auto" takes shm when the node is on this host, else data, else grpc.
Control calls (locate, exists, fetch, route, plan, estimate, report_load,
stats) are gRPC on every path.

Errors are the classes of kvpool.errors, mapped from gRPC codes by the same
table as the Go client's. A Client is safe to use from many threads.
"""

import collections
import concurrent.futures
import contextlib
import mmap
import os
import platform
import re
import select
import socket
import ssl
import threading
import time
import warnings
from collections import namedtuple

import grpc
import numpy as np

from . import errors, wire
from ._crc import crc32c
from .v1 import kvpool_pb2 as pb
from .v1 import kvpool_pb2_grpc as pb_grpc

PATHS = ("auto", "shm", "data", "grpc")

PutResult = namedtuple("PutResult", "existed crc")
PutResult.__doc__ = "What a put did: existed is True when identical bytes were already stored."
FetchResult = namedtuple("FetchResult", "source size error")
FetchResult.__doc__ = "Where one fetched block came from (source '' when it was local); error is None or an exception."
Holder = namedtuple("Holder", "node_id addr bytes_per_second rtt_micros")
Holder.__doc__ = "A node holding a block, as the answering node sees it (best measured link first)."

_NAME = re.compile(rb"[A-Za-z0-9._-]{1,64}")
# A batched put (put_many, the paged adapter's save) reserves at most this
# many blocks, and this many bytes, at once: the arena space a window holds
# before its commits, as the Go client's putWindowBlocks bounds it.
_PUT_WINDOW_BLOCKS = 64
_PUT_WINDOW_BYTES = 256 << 20


def _put_item(key, value):
    """A put_many item checked as put checks it: (key, readable value), or
    the InvalidArgument that put would raise."""
    try:
        return _key(key), _readable(value)
    except errors.InvalidArgument as e:
        return e


def _item_size(item):
    """A put_many item's size; -1 for a refused one (never batched)."""
    return -1 if isinstance(item, Exception) else item[1].nbytes


def put_window_blocks(size):
    """How many blocks of size bytes a batched put reserves at once."""
    return max(1, min(_PUT_WINDOW_BLOCKS, _PUT_WINDOW_BYTES // max(size, 1)))
_GRPC_CHUNK = 1 << 20
_MAX_MSG = 80 << 20
# x86-64 keeps loads in order, so the version word read after a copy cannot
# be satisfied before the copy's loads: the location cache's check holds
# without a fence. Elsewhere every cached copy is checksummed.
_ORDERED_LOADS = platform.machine() in ("x86_64", "AMD64")


def host_id():
    """This machine's identity as nodes report it: the Linux boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "host:" + socket.gethostname()


def _name(kind, value):
    b = value.encode() if isinstance(value, str) else bytes(value)
    if not _NAME.fullmatch(b):
        raise errors.InvalidArgument(f"kvpool: {kind} {value!r} must be 1 to 64 of A-Z a-z 0-9 . _ -")
    return b


def _key(key):
    if isinstance(key, str):
        key = key.encode()
    elif not isinstance(key, bytes):
        key = bytes(key)
    if not 1 <= len(key) <= wire.MAX_KEY_BYTES:
        raise errors.InvalidArgument(f"kvpool: key has {len(key)} bytes, want 1 to {wire.MAX_KEY_BYTES}")
    return key


def _writable(buffer):
    """A writable, contiguous byte memoryview of buffer: a bytearray, a
    numpy array, a CPU torch tensor, an mmap, anything with the buffer
    protocol."""
    if type(buffer).__module__.startswith("torch"):
        if buffer.device.type != "cpu" or not buffer.is_contiguous():
            raise errors.InvalidArgument("kvpool: a tensor buffer must be contiguous and on the CPU")
        buffer = buffer.numpy()
    try:
        mv = memoryview(buffer)
    except TypeError as e:
        raise errors.InvalidArgument(f"kvpool: {type(buffer).__name__} is not a buffer") from e
    if mv.readonly:
        raise errors.InvalidArgument("kvpool: the buffer is read-only")
    if not mv.c_contiguous:
        raise errors.InvalidArgument("kvpool: the buffer is not contiguous")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _readable(value):
    if type(value).__module__.startswith("torch"):
        value = value.contiguous().numpy()
    mv = memoryview(value)
    if not mv.c_contiguous:
        raise errors.InvalidArgument("kvpool: the value is not contiguous")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _lease_arg(lease):
    """(flag, ms) for lease: None (no lease), True (the node's default) or seconds."""
    if lease is None or lease is False:
        return 0, 0
    if lease is True:
        return wire.FLAG_LEASE, 0
    return wire.FLAG_LEASE, max(0, min(int(lease * 1000), 1 << 31))


def _short(have, need):
    return errors.InvalidArgument(f"kvpool: buffer of {have} bytes for a {need}-byte block")


def _io_error(what, err):
    if isinstance(err, errors.KVPoolError):
        return err
    if isinstance(err, socket.timeout):
        return errors.DeadlineExceeded(f"kvpool: {what}: timed out")
    return errors.Unavailable(f"kvpool: {what}: {err}")


def _as_array(mv, dtype, shape):
    a = np.frombuffer(mv, dtype=dtype)
    return a if shape is None else a.reshape(shape)


def _as_tensor(mv, dtype, shape):
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when the buffer is read-only
        t = torch.from_numpy(np.frombuffer(mv, dtype=np.uint8))
    if dtype is not None:
        t = t.view(dtype)
    return t if shape is None else t.reshape(shape)


class View:
    """A block's bytes. On the shm path they are the node's arena, pinned
    until release() (or the end of a with block): read them in place, never
    write them. On other paths they are a private copy. After release,
    every accessor raises FailedPrecondition. Memory handed out stays
    mapped while anything refers to it, even after the client closes or the
    node dies; only its contents are no longer guaranteed after release."""

    __slots__ = ("_path", "_handle", "_mv", "crc", "size", "offset", "_released")

    def __init__(self, path, handle, mv, crc, offset=-1):
        self._path, self._handle, self._mv = path, handle, mv
        self.crc, self.size, self.offset = crc, mv.nbytes, offset
        self._released = False

    @property
    def data(self):
        """The bytes, a read-only memoryview."""
        if self._released:
            raise errors.FailedPrecondition("kvpool: view used after release")
        return self._mv

    def as_numpy(self, dtype=np.uint8, shape=None):
        """The bytes as a read-only numpy array (no copy)."""
        return _as_array(self.data, dtype, shape)

    def as_tensor(self, dtype=None, shape=None):
        """The bytes as a CPU torch tensor (no copy). The tensor MUST NOT be
        written and MUST NOT be used after release."""
        return _as_tensor(self.data, dtype, shape)

    def verify(self):
        """Checks the bytes against the node's checksum (DataLoss if they differ)."""
        if crc32c(self.data) != self.crc:
            raise errors.DataLoss("kvpool: view bytes do not match the node's checksum")

    def release(self):
        """Unpins the block. Idempotent."""
        if self._released:
            return
        self._released = True
        try:
            self._mv.release()
        except BufferError:
            pass  # something still refers to it: it stays mapped until dropped
        if self._path is not None:
            self._path.release(self._handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        # The collector may run this anywhere, even inside a round trip of
        # this thread that holds the session lock: queue the release for
        # the session's next frame instead of sending it.
        if not self._released and self._path is not None:
            self._path.orphans.append(self._handle)


class Reservation:
    """Space for a new block. On the shm path it lies in the node's arena:
    fill data (or as_numpy/as_tensor) in place, then commit(); on other
    paths it is a private buffer that commit() puts. A with block aborts it
    unless it was committed. After commit or abort, accessors raise."""

    def __init__(self, client, key, mv, handle=None):
        self._client, self._key, self._mv, self._handle = client, key, mv, handle
        self.size = mv.nbytes
        self._done = False
        self._crc = None  # set by a filler that checksummed what it wrote

    @property
    def data(self):
        """The writable bytes, a memoryview."""
        if self._done:
            raise errors.FailedPrecondition("kvpool: reservation used after commit or abort")
        return self._mv

    def as_numpy(self, dtype=np.uint8, shape=None):
        """The writable bytes as a numpy array (no copy)."""
        return _as_array(self.data, dtype, shape)

    def as_tensor(self, dtype=None, shape=None):
        """The writable bytes as a CPU torch tensor (no copy)."""
        return _as_tensor(self.data, dtype, shape)

    def commit(self, replicas=1):
        """Publishes the block. On the shm path the node takes the checksum
        of its bytes (or has the one put_many took while copying them in);
        elsewhere it is taken here and sent with them. Returns a
        PutResult."""
        self._end()
        c = self._client
        if self._handle is None:
            return c._put_path(c._tenant, c._namespace, self._key, self._mv, replicas)
        return c._bytes.commit(self._handle, replicas, self._crc)

    def _end(self):
        if self._done:
            raise errors.FailedPrecondition("kvpool: reservation already ended")
        self._done = True

    def abort(self):
        """Gives the space back. A no-op after commit or abort."""
        if self._done:
            return
        self._done = True
        if self._handle is not None:
            self._client._bytes.abort(self._handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.abort()


class _ShmPath:
    """The attachment to a same-host node: its arena mapped here and one
    unix-socket session that pins blocks and holds reservations. Round trips
    on the session are serialized by _lock; copies run outside it."""

    def __init__(self, socket_path, node_id, timeout, verify, cache, reserve_ahead=False):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
            msg, fds, _, _ = socket.recv_fds(sock, 512, 2)
        except OSError as e:
            sock.close()
            raise errors.Unavailable(f"kvpool: shm socket {socket_path}: {e}") from e
        try:
            if len(fds) != 2:
                raise wire.ProtocolError(f"kvpool: the hello carried {len(fds)} descriptors, want 2")
            seg, page, words, hello_node = wire.decode_hello(msg)
            if hello_node != node_id:
                raise errors.Unavailable(f"kvpool: shm socket belongs to node {hello_node!r}, not {node_id!r}")
            if page == 0 or words != seg // page:
                raise wire.ProtocolError(f"kvpool: hello: {words} version words for {seg // max(page, 1)} pages")
            self._map = mmap.mmap(fds[0], seg, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            self._vmap = mmap.mmap(fds[1], wire.version_segment_bytes(words), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except BaseException:
            sock.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)  # the mappings outlive the descriptors
        self.node_id, self.page_bytes, self.segment_bytes = node_id, page, seg
        self._mem = memoryview(self._map)
        self._versions = memoryview(self._vmap).cast("Q")
        self._conn = wire.Conn(sock, timeout)
        self._lock = threading.Lock()
        self.orphans = collections.deque()  # pins of views dropped unreleased
        self._broken = None
        self._closed = False
        self._verify = verify or not _ORDERED_LOADS
        self._cache = {} if cache else None
        # A put's commit asks the node for the next put's place (a spare,
        # FLAG_RESERVE_NEXT) when it offers them: (tenant, namespace, size,
        # handle, offset) or None. The node keeps it for the session.
        self._reserve_ahead = reserve_ahead
        self._spare = None

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._conn.close()
        self._cache = None
        # Views and reservations handed out keep the mapping alive through
        # their own references; the arena is unmapped when the last goes.
        for mv, m in ((self._versions, self._vmap), (self._mem, self._map)):
            mv.release()
            try:
                m.close()
            except BufferError:
                pass

    def _usable(self):
        if self._broken is not None:
            raise self._broken
        if self._closed:
            raise errors.Unavailable("kvpool: client is closed")

    def _orphan_releases(self):
        """Release frames for views the collector finalized. REQUIRES: _lock."""
        out = []
        while self.orphans:
            out.append(wire.encode_request(wire.OP_RELEASE, handle=self.orphans.popleft()))
        return out

    def round_trip(self, what, request):
        """exchange of one request; the node's refusal is raised."""
        [r] = self.exchange(what, [request])
        if isinstance(r, Exception):
            raise r
        return r

    def exchange(self, what, requests):
        """Sends requests (encoded frames) and reads their responses: one
        wire.Response, or the exception the node answered, per request.
        They go _PIPELINE_FRAMES to a write, each window's answers read
        before the next is sent, so neither side's socket buffer fills
        while the other waits on it. A session that breaks midway raises;
        the node frees what the session held."""
        with self._session(what):
            return _pipeline(self._conn, requests, self._orphan_releases())

    @contextlib.contextmanager
    def _session(self, what):
        """Holds the session for a call: the lock, and a broken session
        raised; an error that breaks it midway ends the session."""
        with self._lock:
            self._usable()
            try:
                yield
            except errors.KVPoolError as e:
                if not self._conn.usable:
                    self._break(what, e)
                raise
            except OSError as e:
                err = _io_error("shm " + what, e)
                self._break(what, err)
                raise err from e

    def fill_and_commit(self, reservations, fill, replicas):
        """See Client.fill_and_commit: the blocks' commits go out, with no
        checksum, as soon as _COMMIT_GROUP_BYTES of them are filled, so the
        node checksums those while the next ones fill; the answers are read
        after the last fill (or each _PIPELINE_FRAMES). A fill that raises
        ends the batch: the reservations from it on are aborted, the
        answers of the commits sent are read, and the exception
        propagates."""
        out, failure = [], None
        with self._session("commit"):
            pending, pending_bytes, sent = self._orphan_releases(), 0, 0
            for i, r in enumerate(reservations):
                try:
                    fill(i, r)
                except BaseException as e:
                    failure = e
                    break
                r._done = True
                pending.append(wire.encode_request(wire.OP_COMMIT, handle=r._handle, arg=max(replicas, 0)))
                pending_bytes, sent = pending_bytes + r.size, sent + 1
                if pending_bytes >= _COMMIT_GROUP_BYTES or sent == _PIPELINE_FRAMES:
                    self._conn.send(*pending)
                    pending, pending_bytes = [], 0
                    if sent == _PIPELINE_FRAMES:
                        out += _answers(self._conn, sent)
                        sent = 0
            if failure is not None:
                for r in reservations[len(out) + sent:]:
                    r._done = True
                    pending.append(wire.encode_request(wire.OP_ABORT, handle=r._handle))
            if pending:
                self._conn.send(*pending)
            out += _answers(self._conn, sent)
        if failure is not None:
            raise failure
        return [r if isinstance(r, Exception) else PutResult(r.existed, r.crc) for r in out]

    def notify(self, request):
        """Sends a frame that has no response (release, abort)."""
        with self._lock:
            if self._closed or self._broken is not None:
                return  # the node frees what the session held when it ends
            try:
                self._conn.send(*self._orphan_releases(), request)
            except OSError as e:
                self._break("notify", _io_error("shm release", e))

    def _break(self, what, err):
        self._broken = errors.Unavailable(f"kvpool: the shm session with {self.node_id} ended ({what}: {err})")
        self._conn.close()

    def region(self, offset, size):
        if offset + size > self.segment_bytes:
            raise errors.Internal(f"kvpool: node named bytes [{offset}, +{size}) outside its {self.segment_bytes}-byte segment")
        try:
            return self._mem[offset:offset + size]
        except ValueError as e:  # released by close
            raise errors.Unavailable("kvpool: client is closed") from e

    def pin(self, tenant, ns, key, lease):
        """Pins a block and hands out its bytes in place, unchecked."""
        flags, ms = _lease_arg(lease)
        r = self.round_trip("view", wire.encode_request(wire.OP_VIEW, tenant, ns, key, flags=flags, arg=ms))
        return self._pinned(r), r

    def _pinned(self, r):
        """The View of a pin the node granted (r), or the pin released and
        the error raised."""
        try:
            mv = self.region(r.offset, r.value_len).toreadonly()
        except errors.KVPoolError:
            self.release(r.handle)
            raise
        return View(self, r.handle, mv, r.crc, r.offset)

    def view(self, tenant, ns, key, lease):
        """pin, with the bytes checked against the node's checksum the
        first time this client sees this version of the block: bytes can
        change behind the node's back (a stray write into the arena, a bad
        DIMM). A version read before (the location cache holds its handle)
        is not read again."""
        v, r = self.pin(tenant, ns, key, lease)
        return self._checked(tenant, ns, key, v, r), r

    def view_many(self, tenant, ns, keys, lease):
        """view for each key, every pin in one round trip: one View or
        exception (NotFound, DataLoss, ...) per key."""
        flags, ms = _lease_arg(lease)
        frames = [wire.encode_request(wire.OP_VIEW, tenant, ns, k, flags=flags, arg=ms) for k in keys]
        out = []
        for k, r in zip(keys, self.exchange("view", frames)):
            if not isinstance(r, Exception):
                try:
                    r = self._checked(tenant, ns, k, self._pinned(r), r)
                except errors.KVPoolError as e:
                    r = e
            out.append(r)
        return out

    def _checked(self, tenant, ns, key, v, r):
        """v, once its bytes match the node's checksum (see view); else v
        released and DataLoss raised."""
        cache, ck = self._cache, (tenant, ns, key)
        if cache is not None and (cache.get(ck) or (0, 0, 0, None))[3] == r.handle:
            return v
        if crc32c(v._mv) != r.crc:
            v.release()
            raise errors.DataLoss(f"kvpool: shared block {key.hex()} has a CRC other than the node's {r.crc:08x}")
        if cache is not None:
            self._remember(ck, r)
        return v

    def _remember(self, ck, r):
        cache = self._cache
        if cache is None:
            return
        if len(cache) >= 1 << 16:
            cache.clear()
        cache[ck] = (r.offset, r.value_len, r.crc, r.handle)

    def release(self, handle):
        self.notify(wire.encode_request(wire.OP_RELEASE, handle=handle))

    def get_into(self, tenant, ns, key, dst, lease):
        ck = None
        cache = self._cache
        if cache is not None and not lease:
            ck = (tenant, ns, key)
            loc = cache.get(ck)
            if loc is not None:
                out = self._get_cached(loc, dst)
                if out is not None:
                    return out
                cache.pop(ck, None)
        v, r = self.pin(tenant, ns, key, lease)
        try:
            # A read that asked the node checks what it copies (see view);
            # a repeat from the cache relies on that check.
            out = self._copy_out(v._mv, r.crc, dst, True)
        finally:
            v.release()
        if ck is not None:
            self._remember(ck, r)
        return out

    def _get_cached(self, loc, dst):
        """Copies a cached block, or returns None when it changed."""
        offset, size, crc, handle = loc
        if dst is not None and dst.nbytes < size:
            raise _short(dst.nbytes, size)
        self._check_node()
        word = offset // self.page_bytes
        try:
            # The node clears the word before the block's pages can be
            # reused, so the same word after the copy means the copy saw
            # only this block's bytes.
            if self._versions[word] != handle:
                return None
            out = self._copy_out(self._mem[offset:offset + size], crc, dst, self._verify)
            if self._versions[word] != handle:
                return None
        except ValueError as e:
            raise errors.Unavailable("kvpool: client is closed") from e
        return out

    def _check_node(self):
        """Raises Unavailable when the session has ended or the node is gone,
        without a round trip: a cached read must not outlive its node. One
        poll(2); the peek runs only when the socket is readable."""
        self._usable()
        p = select.poll()
        p.register(self._conn.sock, select.POLLIN)
        if not p.poll(0):
            return
        try:
            alive = self._conn.sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            alive = True
        except OSError:
            alive = False
        if not alive:
            with self._lock:
                if self._broken is None:
                    self._break("read", "the node closed the session")
            raise self._broken

    def _copy_out(self, src, want, dst, verify):
        if dst is None:
            dst = memoryview(bytearray(src.nbytes))
        elif dst.nbytes < src.nbytes:
            raise _short(dst.nbytes, src.nbytes)
        n = src.nbytes
        _copy(dst[:n], src)
        if verify and crc32c(dst[:n]) != want:
            raise errors.DataLoss(f"kvpool: shared block has a CRC other than the node's {want:08x}")
        return dst, n, want

    def reserve(self, client, tenant, ns, key, size):
        r = self.round_trip("reserve", wire.encode_request(wire.OP_RESERVE, tenant, ns, key, value_len=size))
        try:
            mv = self.region(r.offset, size)
        except errors.KVPoolError:
            self.abort(r.handle)
            raise
        return Reservation(client, key, mv, r.handle)

    def commit(self, handle, replicas, crc):
        """Publishes a reservation; see commit_many."""
        [r] = self.commit_many([(handle, replicas, crc)])
        if isinstance(r, Exception):
            raise r
        return r

    def exists(self, tenant, ns, keys):
        """For each key, whether the node holds it: Exists frames, one
        round trip a window of them."""
        return _exists_answers(self.exchange("exists", [wire.encode_request(wire.OP_EXISTS, tenant, ns, k) for k in keys]))

    def reserve_many(self, client, tenant, ns, keys, size):
        """Reservations of size bytes for keys, in one round trip: one
        Reservation or exception per key."""
        frames = [wire.encode_request(wire.OP_RESERVE, tenant, ns, k, value_len=size) for k in keys]
        out = []
        for k, r in zip(keys, self.exchange("reserve", frames)):
            if not isinstance(r, Exception):
                try:
                    r = Reservation(client, k, self.region(r.offset, size), r.handle)
                except errors.KVPoolError as e:
                    self.abort(r.handle)
                    r = e
            out.append(r)
        return out

    def commit_many(self, entries):
        """Commits (handle, replicas, crc) entries in one round trip: one
        PutResult or exception per entry. crc is the checksum of the bytes
        this client wrote, taken while they were in its cache (put_many's
        copy takes it), or None: the node takes it, reading the block, at
        twice the speed of this process's CRC and on a core of its own."""
        frames = [wire.encode_request(wire.OP_COMMIT, flags=wire.FLAG_WRITER_CHECKSUM if crc is not None else 0, crc=crc or 0,
                                      handle=h, arg=max(replicas, 0))
                  for h, replicas, crc in entries]
        return [r if isinstance(r, Exception) else PutResult(r.existed, r.crc) for r in self.exchange("commit", frames)]

    def abort(self, handle):
        self.notify(wire.encode_request(wire.OP_ABORT, handle=handle))

    def put(self, client, tenant, ns, key, value, replicas):
        """Reserves (or takes the spare a previous put's commit brought),
        copies value in, and commits, asking for the next put's spare."""
        size = value.nbytes
        spare = self._take_spare(tenant, ns, size)
        if spare is None:
            res = self.reserve(client, tenant, ns, key, size)
            handle, mv = res._handle, res._mv
        else:
            handle, mv = spare
        try:
            crc = _copy_checksummed(mv, value)
        except BaseException:
            self.abort(handle)
            raise
        flags = wire.FLAG_WRITER_CHECKSUM | (wire.FLAG_RESERVE_NEXT if self._reserve_ahead else 0)
        # A spare is committed under this put's key (same tenant and
        # namespace: _take_spare checked).
        names = (tenant, ns, key) if spare is not None else ()
        [r] = self.exchange("commit", [wire.encode_request(wire.OP_COMMIT, *names, flags=flags, crc=crc, handle=handle, arg=max(replicas, 0))])
        if isinstance(r, Exception):
            if spare is not None:
                self.abort(handle)  # a refused commit of a spare leaves it open
            raise r
        if r.flags & wire.FLAG_RESERVED:
            self._keep_spare((tenant, ns, size, r.handle, r.offset))
        return PutResult(r.existed, r.crc)

    def _take_spare(self, tenant, ns, size):
        """The spare's (handle, bytes) when it fits a put of size bytes into
        tenant/ns, else None; a spare that does not fit is aborted (the
        commit of this put brings one that does)."""
        with self._lock:
            sp, self._spare = self._spare, None
            if sp is None or self._broken is not None or self._closed:
                return None
        if sp[:3] != (tenant, ns, size):
            self.abort(sp[3])
            return None
        try:
            return sp[3], self.region(sp[4], size)
        except errors.KVPoolError:
            self.abort(sp[3])
            return None

    def _keep_spare(self, sp):
        with self._lock:
            if self._spare is None and self._broken is None and not self._closed:
                self._spare = sp
                return
        self.abort(sp[3])  # another put's commit brought one first

    def remove(self, tenant, ns, keys, force):
        with self._lock:
            self._usable()
            try:
                return _remove_over(self._conn, tenant, ns, keys, force)
            except OSError as e:
                err = _io_error("shm remove", e)
                self._break("remove", err)
                raise err from e


def _copy(dst, src):
    """dst[:] = src, releasing the GIL for large copies (numpy does) so
    threads copy in parallel."""
    if src.nbytes >= 1 << 16:
        np.copyto(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8))
    else:
        dst[:] = src


_ASYNC_CRC_BYTES = 256 << 10
_crc_threads = None
_crc_threads_lock = threading.Lock()


def _checksum_async(buf):
    """Starts the CRC-32C of buf on a helper thread (ISA-L releases the
    GIL) and returns a function that waits for it. buf MUST NOT change
    until then. Below _ASYNC_CRC_BYTES the handoff costs more than it hides."""
    global _crc_threads
    if buf.nbytes < _ASYNC_CRC_BYTES:
        crc = crc32c(buf)
        return lambda: crc
    if _crc_threads is None:
        with _crc_threads_lock:
            if _crc_threads is None:
                _crc_threads = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="kvpool-crc")
    return _crc_threads.submit(crc32c, buf).result


def _copy_checksummed(dst, src):
    """Copies src into dst and returns the CRC-32C of the bytes, the
    checksum reading src on another core while this one copies, as the Go
    client does: 2 MiB into the arena in 150 us instead of 210 here."""
    crc = _checksum_async(src)
    _copy(dst, src)
    return crc()


# _pipeline sends at most this many requests before it reads their answers.
_PIPELINE_FRAMES = 256

# fill_and_commit sends the commits of this many bytes of filled blocks at
# a time: four 2 MiB blocks. One at a time, each commit wakes the node's
# thread, which four clients on two cores paid for (5.4 GB/s of paged
# saves against 6.1 four to a write, the mean of three runs each); sixteen
# to a write leave one client waiting on more checksums at the end (7.1
# against 8.4).
_COMMIT_GROUP_BYTES = 8 << 20


def _commit_or_refusal(reservation, replicas):
    """reservation's commit: its PutResult, or the node's refusal of the
    block (AlreadyExists, ResourceExhausted, ...) as a value, as the
    batched calls answer per block; other errors raise."""
    try:
        return reservation.commit(replicas)
    except (errors.AlreadyExists, errors.ResourceExhausted, errors.InvalidArgument, errors.DataLoss) as e:
        return e


def _pipeline(conn, requests, prefix=()):
    """Sends requests (encoded frames, with prefix frames that have no
    answer in front) on conn, _PIPELINE_FRAMES to a write, and reads each
    window's answers before the next: one wire.Response, or the exception
    the node answered, per request. An error that leaves the connection
    unusable raises."""
    out = []
    prefix = list(prefix)
    for off in range(0, len(requests), _PIPELINE_FRAMES):
        part = requests[off:off + _PIPELINE_FRAMES]
        conn.send(*prefix, b"".join(part))
        prefix = []
        out += _answers(conn, len(part))
    return out


def _answers(conn, n):
    """Reads n answers on conn: one wire.Response, or the exception the
    node answered, each. An error that leaves the connection unusable
    raises."""
    out = []
    for _ in range(n):
        try:
            out.append(conn.recv_response())
        except errors.KVPoolError as e:
            if not conn.usable:
                raise
            out.append(e)
    return out


def _exists_answers(responses):
    """Exists frames' answers as booleans; a refusal (a key the node
    rejects) raises, as the gRPC Exists does for the whole call."""
    for r in responses:
        if isinstance(r, Exception):
            raise r
    return [bool(r.flags & wire.FLAG_EXISTED) for r in responses]


def _remove_over(conn, tenant, ns, keys, force):
    """Pipelines removals on conn: one exception or None per key."""
    out = []
    flags = wire.FLAG_FORCE if force else 0
    for off in range(0, len(keys), 256):
        part = keys[off:off + 256]
        conn.send(b"".join(wire.encode_request(wire.OP_REMOVE, tenant, ns, k, flags=flags) for k in part))
        for _ in part:
            try:
                conn.recv_response()
                out.append(None)
            except errors.KVPoolError as e:
                if not conn.usable and not isinstance(e, errors.NotFound):
                    raise
                out.append(e)
    return out


class _ReattachingShm:
    """The shared-memory path of a client that outlives its node's
    restarts. When the session breaks (the node stopped or was killed),
    the next call attaches again (a new session, the segment mapped anew:
    a node restarted with a data directory serves the same blocks), at most
    every REATTACH_S while the node is down; a read or put that found the
    session broken is retried once on the new one (blocks are immutable: a
    put that had committed commits again as existed). A removal is not
    retried. Views and reservations of the old session keep its mapping
    alive until they are dropped."""

    REATTACH_S = 0.1

    def __init__(self, path, args):
        self._cur, self._args = path, args
        self._lock = threading.Lock()
        self._last_try = 0.0
        self.reattached = 0

    def _path(self, force=False):
        with self._lock:
            cur = self._cur
            if cur._broken is None or cur._closed:
                return cur
            now = time.monotonic()
            if not force and now - self._last_try < self.REATTACH_S:
                return cur
            self._last_try = now
            try:
                nxt = _ShmPath(*self._args)
            except errors.KVPoolError:
                return cur  # still down: cur raises its error
            cur.close()  # the mapping lives on in the views handed out
            self._cur = nxt
            self.reattached += 1
            return nxt

    def _retry(self, name, *args):
        s = self._path()
        try:
            return getattr(s, name)(*args)
        except errors.Unavailable:
            if s._broken is None:
                raise
            s2 = self._path(force=True)
            if s2 is s:
                raise
            return getattr(s2, name)(*args)

    def put(self, *args):
        return self._retry("put", *args)

    def get_into(self, *args):
        return self._retry("get_into", *args)

    def view(self, *args):
        return self._retry("view", *args)

    def reserve(self, *args):
        return self._retry("reserve", *args)

    def reserve_many(self, *args):
        return self._retry("reserve_many", *args)

    def view_many(self, *args):
        return self._retry("view_many", *args)

    def exists(self, *args):
        return self._retry("exists", *args)

    def remove(self, *args):
        return self._path().remove(*args)

    def close(self):
        with self._lock:
            self._cur.close()

    def __getattr__(self, name):
        # commit, abort, release, node_id, ...: the current session's.
        return getattr(self._cur, name)


class _CopyingPath:
    """What the paths without shared memory share: a view is a checked
    copy, a reservation a private buffer that commit puts."""

    def view(self, tenant, ns, key, lease):
        mv, n, crc = self.get_into(tenant, ns, key, None, lease)
        return View(None, 0, mv[:n].toreadonly(), crc), None

    def reserve(self, client, tenant, ns, key, size):
        return Reservation(client, key, memoryview(bytearray(size)))


class _DataPath(_CopyingPath):
    """The framed TCP data channel: a pool of connections, one per call in
    flight, values received into and sent from the caller's memory."""

    def __init__(self, host, port, timeout, max_idle, token=None, tls=None, congestion=wire.DEFAULT_CONGESTION):
        self._host, self._port, self._timeout, self._max_idle = host, port, timeout, max_idle
        self._token, self._tls, self._congestion = token, tls, congestion
        self._idle = []
        self._lock = threading.Lock()
        self._closed = False

    def close(self):
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def _get(self):
        with self._lock:
            if self._closed:
                raise errors.Unavailable("kvpool: client is closed")
            if self._idle:
                return self._idle.pop(), True
        try:
            return wire.Conn.dial(self._host, self._port, self._timeout, self._token, self._tls, self._congestion), False
        except OSError as e:
            raise errors.Unavailable(f"kvpool: data channel to {self._host}:{self._port}: {e}") from e

    def _put(self, c):
        with self._lock:
            if c.usable and not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(c)
                return
        c.close()

    def with_conn(self, what, op):
        """Runs op on a pooled connection. An I/O error on a reused idle
        connection is retried once on a fresh one (the node may have closed
        it while idle); every data op is idempotent."""
        for attempt in (0, 1):
            c, reused = self._get()
            try:
                return op(c)
            except errors.KVPoolError:
                raise
            except OSError as e:
                c.usable = False
                if not reused or attempt or isinstance(e, socket.timeout):
                    raise _io_error(what, e) from e
            finally:
                self._put(c)

    def put(self, client, tenant, ns, key, value, replicas):
        crc = None

        def op(c):
            nonlocal crc
            hdr = wire.encode_request(wire.OP_PUT, tenant, ns, key, flags=wire.FLAG_CHECKSUM, arg=max(replicas, 0), value_len=value.nbytes)
            c.send(hdr, value)
            # The checksum is needed only in the trailer: taken now, it runs
            # while the node drains what the socket buffers still hold.
            if crc is None:
                crc = crc32c(value)
            c.send(wire.trailer(crc))
            r = c.recv_response()
            return PutResult(r.existed, r.crc)

        return self.with_conn("put", op)

    def put_many(self, tenant, ns, items, replicas):
        """Puts (key, value) items pipelined on one connection, every
        frame sent before the first answer is read: one PutResult or
        exception per item. The node reads a refused put's value too, so
        the stream stays in step."""
        crcs = [None] * len(items)

        def op(c):
            for i, (key, value) in enumerate(items):
                c.send(wire.encode_request(wire.OP_PUT, tenant, ns, key, flags=wire.FLAG_CHECKSUM, arg=max(replicas, 0),
                                           value_len=value.nbytes), value)
                if crcs[i] is None:
                    crcs[i] = crc32c(value)  # while the node drains the socket
                c.send(wire.trailer(crcs[i]))
            return [r if isinstance(r, Exception) else PutResult(r.existed, r.crc) for r in _answers(c, len(items))]

        return self.with_conn("put", op)

    def get_into(self, tenant, ns, key, dst, lease):
        flags, ms = _lease_arg(lease)
        req = wire.encode_request(wire.OP_GET, tenant, ns, key, flags=flags, arg=ms)

        def op(c):
            r = c.round_trip(req)
            return self._receive(c, r, dst)

        return self.with_conn("get", op)

    @staticmethod
    def _receive(c, r, dst):
        n = r.value_len
        if dst is None:
            if n > 1 << 32:
                c.usable = False
                raise errors.Unavailable(f"kvpool: node announced a {n}-byte value")
            dst = memoryview(bytearray(n))
        elif dst.nbytes < n:
            c.discard(n)  # keep the stream in step before reporting
            raise _short(dst.nbytes, n)
        crc = c.recv_checksummed(dst[:n])
        if crc != r.crc:
            raise errors.DataLoss(f"kvpool: received bytes have CRC {crc:08x}, the node stored {r.crc:08x}")
        return dst, n, crc

    def get_many(self, tenant, ns, keys):
        """Pipelined gets: one (memoryview, n, crc) or exception per key."""

        def op(c):
            c.send(b"".join(wire.encode_request(wire.OP_GET, tenant, ns, k) for k in keys))
            out = []
            for _ in keys:
                try:
                    r = c.recv_response()
                except errors.KVPoolError as e:
                    if not c.usable:
                        raise
                    out.append(e)
                    continue
                out.append(self._receive(c, r, None))
            return out

        return self.with_conn("get", op)

    def remove(self, tenant, ns, keys, force):
        return self.with_conn("remove", lambda c: _remove_over(c, tenant, ns, keys, force))

    def exists(self, tenant, ns, keys):
        """For each key, whether the node holds it: Exists frames on one
        connection, one round trip a window of them."""
        frames = [wire.encode_request(wire.OP_EXISTS, tenant, ns, k) for k in keys]
        return _exists_answers(self.with_conn("exists", lambda c: _pipeline(c, frames)))


class _GrpcPath(_CopyingPath):
    """Bytes as protobuf messages over grpcio."""

    def __init__(self, stub, timeout):
        self._stub, self._timeout = stub, timeout

    def close(self):
        pass

    def put(self, client, tenant, ns, key, value, replicas):
        crc = crc32c(value)

        def messages():
            yield pb.PutRequest(header=pb.PutHeader(key=pb.BlockKey(tenant=tenant.decode(), namespace=ns.decode(), key=key), size_bytes=value.nbytes, crc32c=crc, replicas=max(replicas, 0)))
            for off in range(0, value.nbytes, _GRPC_CHUNK):
                yield pb.PutRequest(chunk=bytes(value[off:off + _GRPC_CHUNK]))

        r = _rpc(self._stub.Put, messages(), self._timeout)
        return PutResult(r.existed, r.crc32c)

    def get_into(self, tenant, ns, key, dst, lease):
        flags, ms = _lease_arg(lease)
        req = pb.GetRequest(key=pb.BlockKey(tenant=tenant.decode(), namespace=ns.decode(), key=key), chunk_bytes=4 << 20, lease=bool(flags), lease_ms=ms)
        try:
            stream = self._stub.Get(req, timeout=self._timeout)
            first = next(stream)
            size, want = first.info.size_bytes, first.info.crc32c
            if dst is None:
                dst = memoryview(bytearray(size))
            elif dst.nbytes < size:
                stream.cancel()
                raise _short(dst.nbytes, size)
            n = 0
            for m in stream:
                k = len(m.chunk)
                if n + k > size:
                    raise errors.Internal(f"kvpool: node sent more than the {size} bytes it announced")
                dst[n:n + k] = m.chunk
                n += k
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e) from None
        if n != size:
            raise errors.Unavailable(f"kvpool: get stream ended after {n} of {size} bytes")
        if crc32c(dst[:n]) != want:
            raise errors.DataLoss("kvpool: received bytes do not match the node's checksum")
        return dst, n, want

    def remove(self, tenant, ns, keys, force):
        out = []
        for k in keys:
            try:
                _rpc(self._stub.Remove, pb.RemoveRequest(key=pb.BlockKey(tenant=tenant.decode(), namespace=ns.decode(), key=k), force=force), self._timeout)
                out.append(None)
            except (errors.NotFound, errors.FailedPrecondition) as e:
                out.append(e)
        return out


def _rpc(method, request, timeout):
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as e:
        raise errors.from_rpc_error(e) from None


def _split_addr(addr):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise errors.InvalidArgument(f"kvpool: address {addr!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


class _BearerInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                         grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Sends the bearer token with every gRPC call, as the Go client does."""

    def __init__(self, token):
        self._md = ("authorization", "Bearer " + token)

    def _details(self, d):
        md = list(d.metadata or []) + [self._md]
        return _CallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready, d.compression)

    def intercept_unary_unary(self, cont, d, req):
        return cont(self._details(d), req)

    def intercept_unary_stream(self, cont, d, req):
        return cont(self._details(d), req)

    def intercept_stream_unary(self, cont, d, reqs):
        return cont(self._details(d), reqs)

    def intercept_stream_stream(self, cont, d, reqs):
        return cont(self._details(d), reqs)


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class Client:
    """A client of one kvpool node, for one tenant and namespace.

    Client(addr, tenant, namespace, path="auto", timeout=10.0) connects,
    learns the node's fast paths from its Info and attaches to its shared
    memory when path allows and the node is on this host. timeout (seconds)
    bounds every call. Same-host reads are checked against the node's
    checksum the first time the client reads a version of a block (a get
    that asks the node, a view of a version it has not read); a repeat
    from the location cache relies on that check. verify_shared_reads
    checks every copy out of shared memory; bytes that cross a socket are
    always checked. location_cache=False makes every shm get ask the node
    (and every view check the block).

    scoped(namespace=...) gives a client of another tenant or namespace on
    the same connections. close() (or a with block) ends them; views and
    reservations still held stay valid memory, and further calls raise
    Unavailable.

    On a node that requires credentials: token (a bearer token, as
    `kvpool auth token` makes it; default $KVPOOL_TOKEN) identifies the
    caller on gRPC and the data channel; tls_ca (a PEM file) talks TLS on
    both, and tls_cert with tls_key present a client certificate.

    tcp_congestion is the TCP congestion control of the data channel's
    connections, which send puts' bytes: "cubic" by default, as a node's
    (BBR's pacing stalls bursts after idle time), or the host's where this
    process may not set it; "host" keeps the host's.
    """

    def __init__(self, addr, tenant="default", namespace="default", path="auto", timeout=10.0,
                 max_idle_conns=8, verify_shared_reads=False, location_cache=True,
                 token=None, tls_ca=None, tls_cert=None, tls_key=None, tcp_congestion=None):
        if path not in PATHS and path != "tcp":
            raise errors.InvalidArgument(f"kvpool: unknown path {path!r} (want auto, shm, data or grpc)")
        if (tls_cert is None) != (tls_key is None) or (tls_cert is not None and tls_ca is None):
            raise errors.InvalidArgument("kvpool: tls_cert and tls_key go together, and need tls_ca")
        self._tenant, self._namespace = _name("tenant", tenant), _name("namespace", namespace)
        tcp_congestion = wire.congestion_or_default(tcp_congestion)
        wire.validate_congestion(tcp_congestion)
        self.addr, self.timeout = addr, timeout
        host, port = _split_addr(addr)
        self._owner = True
        # What the last fetch that pulled anything cost beyond the node's
        # own timing of it (microseconds), and how many keys it asked for;
        # the next fetch reports both.
        self._fetch_overhead_us = 0
        self._fetch_blocks = 0
        self._token = token if token is not None else os.environ.get("KVPOOL_TOKEN") or None
        options = [("grpc.max_receive_message_length", _MAX_MSG), ("grpc.max_send_message_length", _MAX_MSG)]
        self._tls = None
        if tls_ca is not None:
            def read(p):
                with open(p, "rb") as f:
                    return f.read()
            creds = grpc.ssl_channel_credentials(read(tls_ca), read(tls_key) if tls_key else None, read(tls_cert) if tls_cert else None)
            self._channel = grpc.secure_channel(addr, creds, options=options)
            self._tls = ssl.create_default_context(cafile=tls_ca)
            if tls_cert is not None:
                self._tls.load_cert_chain(tls_cert, tls_key)
        else:
            self._channel = grpc.insecure_channel(addr, options=options)
        if self._token:
            self._channel = grpc.intercept_channel(self._channel, _BearerInterceptor(self._token))
        try:
            self._stub = pb_grpc.KVPoolServiceStub(self._channel)
            try:
                grpc.channel_ready_future(self._channel).result(timeout=timeout)
            except grpc.FutureTimeoutError:
                raise errors.Unavailable(f"kvpool: cannot reach {addr} within {timeout} s") from None
            self.info = _rpc(self._stub.Info, pb.InfoRequest(), timeout)
            self._bytes = None
            want = "data" if path == "tcp" else path
            if want in ("auto", "shm"):
                try:
                    if not self.info.shm_socket:
                        raise errors.Unavailable(f"kvpool: node {self.info.node_id} offers no shared memory")
                    if self.info.host_id != host_id():
                        raise errors.Unavailable(f"kvpool: node {self.info.node_id} is on another host")
                    args = (self.info.shm_socket, self.info.node_id, timeout, verify_shared_reads, location_cache, self.info.reserve_ahead)
                    self._bytes = _ReattachingShm(_ShmPath(*args), args)
                    want = "shm"
                except errors.Unavailable:
                    if want == "shm":
                        raise
                    want = "data"
            if want == "data" and not self.info.data_channel:
                want = "grpc"
            if want == "data":
                self._bytes = _DataPath(host, port, timeout, max_idle_conns, self._token, self._tls, tcp_congestion)
            elif want == "grpc":
                self._bytes = _GrpcPath(self._stub, timeout)
            self.path = want
        except BaseException:
            self._channel.close()
            raise

    # --- lifetime -----------------------------------------------------

    def scoped(self, tenant=None, namespace=None):
        """A client of another tenant or namespace sharing this one's
        connections. Closing it is a no-op; closing this one ends both."""
        c = object.__new__(Client)
        c.__dict__.update(self.__dict__)
        c._owner = False
        if tenant is not None:
            c._tenant = _name("tenant", tenant)
        if namespace is not None:
            c._namespace = _name("namespace", namespace)
        return c

    @property
    def tenant(self):
        return self._tenant.decode()

    @property
    def namespace(self):
        return self._namespace.decode()

    @property
    def node_id(self):
        return self.info.node_id

    def close(self):
        """Ends the connections and the mapping. Idempotent."""
        if not self._owner or self._bytes is None:
            return
        b, self._bytes = self._bytes, _Closed()
        b.close()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- block bytes --------------------------------------------------

    def put(self, key, value, replicas=1):
        """Stores value (bytes, bytearray, numpy array, CPU tensor) under
        key. Equal bytes again succeed (existed=True); different bytes raise
        AlreadyExists. replicas > 1 asks the node to place that many copies
        on distinct nodes before it answers."""
        return self._put_path(self._tenant, self._namespace, _key(key), _readable(value), replicas)

    def _put_path(self, tenant, ns, key, value, replicas):
        if value.nbytes == 0 or value.nbytes > self.info.max_block_bytes:
            raise errors.InvalidArgument(f"kvpool: value of {value.nbytes} bytes, want 1 to {self.info.max_block_bytes}")
        return self._bytes.put(self, tenant, ns, key, value, replicas)

    def get(self, key, lease=None):
        """The block under key, as a new bytearray. lease (True, or seconds)
        also takes a read lease on it."""
        mv, n, _ = self._bytes.get_into(self._tenant, self._namespace, _key(key), None, lease)
        return mv.obj if n == mv.nbytes else bytearray(mv[:n])

    def get_into(self, key, buffer, lease=None):
        """Copies the block under key into buffer (any writable buffer:
        bytearray, numpy array, CPU torch tensor) and returns its length. A
        buffer too small raises InvalidArgument and is left untouched."""
        return self._bytes.get_into(self._tenant, self._namespace, _key(key), _writable(buffer), lease)[1]

    def view(self, key, lease=None):
        """The block under key in place (shm) or as a copy (other paths), as
        a View to use in a with block."""
        return self._bytes.view(self._tenant, self._namespace, _key(key), lease)[0]

    def view_many(self, keys, lease=None):
        """view for each key: one View, or the exception a view would raise
        (NotFound, DataLoss, ...), per key. On the shm path every pin in
        one round trip. The caller releases each View (or ends it in a with
        block), the ones it does not use too: a pin holds the block."""
        keys = [_key(k) for k in keys]
        if not keys:
            return []
        if hasattr(self._bytes, "view_many"):
            return self._bytes.view_many(self._tenant, self._namespace, keys, lease)
        out = []
        for k in keys:
            try:
                out.append(self._bytes.view(self._tenant, self._namespace, k, lease)[0])
            except (errors.NotFound, errors.DataLoss) as e:
                out.append(e)
        return out

    def reserve(self, key, size):
        """Writable space for a new block of size bytes; see Reservation."""
        if size <= 0 or size > self.info.max_block_bytes:
            raise errors.InvalidArgument(f"kvpool: reservation of {size} bytes, want 1 to {self.info.max_block_bytes}")
        return self._bytes.reserve(self, self._tenant, self._namespace, _key(key), size)

    def reserve_many(self, keys, size):
        """Writable space for a new block of size bytes under each key: one
        Reservation, or the exception the node answered (ResourceExhausted,
        ...), per key. On the shm path all of them in one round trip; fill
        them and end them with commit_many (or each with commit or abort)."""
        if size <= 0 or size > self.info.max_block_bytes:
            raise errors.InvalidArgument(f"kvpool: reservation of {size} bytes, want 1 to {self.info.max_block_bytes}")
        keys = [_key(k) for k in keys]
        if not keys:
            return []
        if hasattr(self._bytes, "reserve_many"):
            return self._bytes.reserve_many(self, self._tenant, self._namespace, keys, size)
        return [self._bytes.reserve(self, self._tenant, self._namespace, k, size) for k in keys]

    def commit_many(self, reservations, replicas=1):
        """Commits reservations of this client, as each one's commit would:
        one PutResult or exception (AlreadyExists, ...) per reservation. On
        the shm path every one in one round trip. A reservation that already
        ended raises FailedPrecondition before anything is committed."""
        reservations = self._own_open(reservations, "commit_many")
        shm = [r for r in reservations if r._handle is not None]
        results = {}
        if shm:
            entries = []
            for r in shm:
                r._done = True
                entries.append((r._handle, replicas, r._crc))
            for r, res in zip(shm, self._bytes.commit_many(entries)):
                results[id(r)] = res
        out = []
        for r in reservations:
            out.append(results[id(r)] if id(r) in results else _commit_or_refusal(r, replicas))
        return out

    def fill_and_commit(self, reservations, fill, replicas=1):
        """Fills reservations of this client in order, fill(i, reservation)
        writing the bytes of the i-th, and commits each one filled: one
        PutResult or exception (AlreadyExists, ...) per reservation, as
        commit_many. On the shm path the commits of filled blocks go to the
        node 8 MiB of blocks at a time, without a checksum taken here: the
        node takes each, on a core of its own while the next blocks fill,
        instead of this thread reading the block back (a third of a paged
        save's time on one core), and the answers are read after the last
        fill. The session is held throughout: other threads' calls on this
        client wait. A fill that raises ends the batch: the reservations
        before it are committed, it and the rest aborted, and the exception
        propagates."""
        reservations = self._own_open(reservations, "fill_and_commit")
        if reservations and all(r._handle is not None for r in reservations):
            return self._bytes.fill_and_commit(reservations, fill, replicas)
        out = []
        for i, r in enumerate(reservations):
            try:
                fill(i, r)
            except BaseException:
                for rest in reservations[i:]:
                    rest.abort()
                raise
            out.append(_commit_or_refusal(r, replicas))
        return out

    def _own_open(self, reservations, what):
        """reservations as a list, each open and this client's: else
        FailedPrecondition or InvalidArgument, before anything is done."""
        reservations = list(reservations)
        for r in reservations:
            if r._done:
                raise errors.FailedPrecondition("kvpool: reservation already ended")
            if r._client is not self:
                raise errors.InvalidArgument(f"kvpool: {what} of another client's reservation")
        return reservations

    def remove(self, key, force=False):
        """Deletes the block under key (NotFound if absent,
        FailedPrecondition under a read lease unless force)."""
        err = self._bytes.remove(self._tenant, self._namespace, [_key(key)], force)[0]
        if err is not None:
            raise err

    def remove_many(self, keys, force=False):
        """Deletes the blocks under keys; returns how many it removed."""
        errs = self._bytes.remove(self._tenant, self._namespace, [_key(k) for k in keys], force)
        for e in errs:
            if e is not None and not isinstance(e, errors.NotFound):
                raise e
        return sum(e is None for e in errs)

    def put_many(self, items, replicas=1):
        """Stores (key, value) pairs; one PutResult or exception per item.
        On the shm path a window of items of one size is reserved in one
        round trip, copied in, and committed in one more, as an engine
        saving a request's blocks wants."""
        items = [_put_item(k, v) for k, v in items]
        if isinstance(self._bytes, _DataPath):
            return self._put_pipelined(items, replicas)
        if not hasattr(self._bytes, "reserve_many"):
            return [self._put_one(it, replicas) for it in items]
        out = []
        i = 0
        while i < len(items):
            size = _item_size(items[i])
            j = i + 1
            while j < len(items) and j - i < put_window_blocks(size) and _item_size(items[j]) == size:
                j += 1
            if j - i == 1 or size <= 0 or size > self.info.max_block_bytes:
                out += [self._put_one(it, replicas) for it in items[i:j]]
            else:
                out += self._put_window(items[i:j], size, replicas)
            i = j
        return out

    def _put_pipelined(self, items, replicas):
        """put_many on the data path: the items the node may take go out
        pipelined, a window at a time; each refused item keeps its
        refusal."""
        out = list(items)
        ok = []
        for i, it in enumerate(items):
            if not isinstance(it, Exception):
                if 0 < it[1].nbytes <= self.info.max_block_bytes:
                    ok.append(i)
                else:
                    out[i] = self._put_one(it, replicas)  # its InvalidArgument
        for off in range(0, len(ok), _PUT_WINDOW_BLOCKS):
            part = ok[off:off + _PUT_WINDOW_BLOCKS]
            for i, r in zip(part, self._bytes.put_many(self._tenant, self._namespace, [items[i] for i in part], replicas)):
                out[i] = r
        return out

    def _put_one(self, item, replicas):
        if isinstance(item, Exception):
            return item
        try:
            return self._put_path(self._tenant, self._namespace, item[0], item[1], replicas)
        except (errors.AlreadyExists, errors.ResourceExhausted, errors.InvalidArgument, errors.DataLoss) as e:
            return e

    def _put_window(self, items, size, replicas):
        """Puts items of size bytes each through reserve_many and
        commit_many: two round trips for the window."""
        ress = self._bytes.reserve_many(self, self._tenant, self._namespace, [k for k, _ in items], size)
        filled = []
        try:
            for r, (_, value) in zip(ress, items):
                if not isinstance(r, Exception):
                    r._crc = _copy_checksummed(r._mv, value)
                    filled.append(r)
        except BaseException:
            for r in ress:
                if not isinstance(r, Exception):
                    r.abort()
            raise
        committed = iter(self.commit_many(filled, replicas))
        return [r if isinstance(r, Exception) else next(committed) for r in ress]

    def get_many(self, keys):
        """The blocks under keys: one bytearray or exception per key
        (pipelined on the data channel)."""
        keys = [_key(k) for k in keys]
        if isinstance(self._bytes, _DataPath):
            res = self._bytes.get_many(self._tenant, self._namespace, keys)
            return [r if isinstance(r, Exception) else bytearray(r[0][:r[1]]) for r in res]
        out = []
        for k in keys:
            try:
                out.append(self.get(k))
            except (errors.NotFound, errors.DataLoss) as e:
                out.append(e)
        return out

    # --- control ------------------------------------------------------

    def _keys(self, keys):
        return [_key(k) for k in keys]

    def exists(self, keys):
        """For each key, whether the node holds it (in memory or on its
        disk tier). On the shm and data paths, with a node that answers
        Exists frames, one round trip on the session for up to 256 keys;
        else a gRPC call."""
        if keys and self.info.exists_frames and isinstance(self._bytes, (_ReattachingShm, _DataPath)):
            return self._bytes.exists(self._tenant, self._namespace, self._keys(keys))
        r = _rpc(self._stub.Exists, pb.ExistsRequest(tenant=self.tenant, namespace=self.namespace, keys=self._keys(keys)), self.timeout)
        return list(r.exists)

    def locate(self, chain, lease=None):
        """How many leading keys of chain the node holds. With lease (True,
        or seconds) it also leases that prefix and returns (blocks, lease
        end in Unix ms)."""
        flags, ms = _lease_arg(lease)
        r = _rpc(self._stub.Locate, pb.LocateRequest(tenant=self.tenant, namespace=self.namespace, keys=self._keys(chain), lease=bool(flags), lease_ms=ms), self.timeout)
        return (r.prefix_blocks, r.lease_until_unix_ms) if flags else r.prefix_blocks

    def fetch(self, keys, timeout=None):
        """Makes the blocks local: each key the node lacks is pulled from
        the best node holding it. timeout (seconds) bounds one holder's
        transfer. One FetchResult per key."""
        ms = 0 if timeout is None else max(1, int(timeout * 1000))
        start = time.monotonic()
        r = _rpc(self._stub.Fetch, pb.FetchRequest(tenant=self.tenant, namespace=self.namespace, keys=self._keys(keys), timeout_ms=ms,
                                                   previous_call_overhead_us=self._fetch_overhead_us,
                                                   previous_call_blocks=self._fetch_blocks), self.timeout)
        # The node learns what a call costs beyond its own fetch from the
        # next one, and predicts the wait a caller sees with it.
        call, took = time.monotonic() - start, max((x.fetch_seconds for x in r.results), default=0.0)
        if 0 < took < call:
            # With the call's length: what a call costs beyond the node's
            # fetch grows with its chain.
            self._fetch_overhead_us, self._fetch_blocks = int((call - took) * 1e6), len(keys)
        return [FetchResult(x.source_node, x.size_bytes, errors.from_code(x.status.code, x.status.message) if x.status.code else None) for x in r.results]

    def route(self, keys):
        """For each key, the live nodes holding it, best link first."""
        r = _rpc(self._stub.Route, pb.RouteRequest(tenant=self.tenant, namespace=self.namespace, keys=self._keys(keys)), self.timeout)
        return [[Holder(h.node_id, h.addr, h.bytes_per_second, h.rtt_micros) for h in b.holders] for b in r.blocks]

    def plan(self, chain, model="", block_tokens=0, prompt_tokens=0, link_bytes_per_second=0.0, candidates=(), place=False):
        """Where a request for chain should run, and whether to fetch or
        recompute there: a kvpool.v1.PlanResponse, cheapest node first.
        With place, the caller sends the request to the winner, and the
        node counts it in the plans it answers next (until the winner's
        engine reports again)."""
        return _rpc(self._stub.Plan, pb.PlanRequest(tenant=self.tenant, namespace=self.namespace, keys=self._keys(chain), model=model,
                    block_tokens=block_tokens, prompt_tokens=prompt_tokens, link_bytes_per_second=link_bytes_per_second,
                    candidates=list(candidates), place=place), self.timeout)

    def estimate(self, chain, node_id="", model="", block_tokens=0, prompt_tokens=0, link_bytes_per_second=0.0):
        """What serving chain costs on one node (default: this one): a
        kvpool.v1.EstimateResponse with every term."""
        return _rpc(self._stub.Estimate, pb.EstimateRequest(tenant=self.tenant, namespace=self.namespace, keys=self._keys(chain), model=model,
                    block_tokens=block_tokens, prompt_tokens=prompt_tokens, link_bytes_per_second=link_bytes_per_second, node_id=node_id), self.timeout)

    def report_load(self, queue_seconds, prefill_tokens_per_second, prompt_tokens=0, model=""):
        """Tells the node this engine's queue time and prefill speed; the
        node gossips them to the cluster for plans."""
        _rpc(self._stub.ReportLoad, pb.ReportLoadRequest(queue_seconds=queue_seconds, prefill_tokens_per_second=prefill_tokens_per_second,
             prefill_prompt_tokens=prompt_tokens, model=model), self.timeout)

    def stats(self):
        """The node's capacity, usage, pins, reservations and tenants: a
        kvpool.v1.StatsResponse."""
        return _rpc(self._stub.Stats, pb.StatsRequest(), self.timeout)


class _Closed:
    """The byte path of a closed client: every call is Unavailable."""

    def __getattr__(self, name):
        def closed(*args, **kwargs):
            raise errors.Unavailable("kvpool: client is closed")

        return closed

    def close(self):
        pass
