"""The framed data channel (Go package api/wire) in Python.

A TCP data connection opens with the 8-byte preamble "KVPD", version, three
zero bytes; a unix-socket connection to a node's shm socket opens with the
node's Hello, which carries the segment's and the version words' file
descriptors. Then the client sends requests and reads responses in order.
A request is a 32-byte header, the tenant, namespace and key bytes, and for
a Put the value and an 8-byte trailer (CRC-32C, "KVPE"). A response is a
32-byte header, the error message when the status is not OK, then a Get's
value. All integers are little-endian. See api/wire/wire.go for the layout;
the constants here must stay equal to those there.

Conn moves values straight between the socket and the caller's buffer
(recv_into, sendmsg), one copy per side, as a raw socket does.
"""

import select
import socket
import struct
import threading
import time

from . import errors
from ._crc import crc32c

PREAMBLE = b"KVPD\x01\x00\x00\x00"
# Byte 5 of the preamble: a bearer token follows, its length a little-endian
# uint16 in bytes 6-7 (api/wire.PreambleFlagToken, MaxTokenBytes).
PREAMBLE_FLAG_TOKEN = 1
MAX_TOKEN_BYTES = 1024


def preamble(token=None):
    """The data channel's preamble, carrying token when given."""
    if not token:
        return PREAMBLE
    t = token.encode() if isinstance(token, str) else bytes(token)
    if not 0 < len(t) <= MAX_TOKEN_BYTES:
        raise ValueError(f"a token of {len(t)} bytes: want 1 to {MAX_TOKEN_BYTES}")
    return PREAMBLE[:5] + bytes([PREAMBLE_FLAG_TOKEN]) + struct.pack("<H", len(t)) + t
VERSION = 1
TRAILER_MAGIC = 0x4550564B  # "KVPE" little-endian
REQUEST_HEADER_BYTES = 32
RESPONSE_HEADER_BYTES = 32
MAX_NAME_BYTES = 64
MAX_KEY_BYTES = 128
MAX_MESSAGE_BYTES = 4096

OP_GET, OP_PUT, OP_REMOVE, OP_SOURCE, OP_SINK = 1, 2, 3, 4, 5
OP_VIEW, OP_RELEASE, OP_RESERVE, OP_COMMIT, OP_ABORT = 6, 7, 8, 9, 10
OP_EXISTS = 14  # FLAG_EXISTED in the answer: the node holds the block

FLAG_CHECKSUM = 1 << 0  # request: the CRC field (a Put's trailer) must be verified
FLAG_LEASE = 1 << 1  # Get, View: take a read lease of arg ms (0: the node's default)
FLAG_FORCE = 1 << 2  # Remove: even under a read lease
# Commit: the CRC field is the writer's checksum of the bytes it wrote in
# place; the node stores it without reading the block again (see
# api/wire's FlagWriterChecksum).
FLAG_WRITER_CHECKSUM = 1 << 3
# Commit: once committed, also reserve a spare of the same size, tenant and
# namespace for this session's next put and name it in the response
# (FLAG_RESERVED); that put commits it under its own key (a Commit with a
# key): a copy and one round trip instead of two.
FLAG_RESERVE_NEXT = 1 << 4

FLAG_EXISTED = 1 << 0  # response: an identical block was already stored
FLAG_CLOSE = 1 << 1  # response: the node closes the connection after it
FLAG_RESERVED = 1 << 2  # response: a Commit's spare, at offset, with handle

# op, flags, tenant len, namespace len, key len, reserved, crc, arg, value len, handle
_REQUEST = struct.Struct("<BBBBHHIIQQ")
# status, flags, message len, crc, value len, offset, handle
_RESPONSE = struct.Struct("<BBHIQQQ")
_TRAILER = struct.Struct("<II")
# magic, version, id length, two zero bytes, segment bytes, page bytes, version words
_HELLO = struct.Struct("<4sBBxxQIQ")


def encode_request(op, tenant=b"", namespace=b"", key=b"", flags=0, crc=0, arg=0, value_len=0, handle=0):
    """A request's header, names and key."""
    return _REQUEST.pack(op, flags, len(tenant), len(namespace), len(key), 0, crc, arg, value_len, handle) + tenant + namespace + key


def trailer(crc):
    """The 8 bytes that end a Put's value."""
    return _TRAILER.pack(crc, TRAILER_MAGIC)


class Response:
    """A decoded response header."""

    __slots__ = ("status", "flags", "crc", "value_len", "offset", "handle", "message")

    @property
    def existed(self):
        return bool(self.flags & FLAG_EXISTED)


class ProtocolError(errors.Unavailable):
    """The stream is malformed and cannot continue."""


def decode_hello(b):
    """Parses a node's Hello: (segment bytes, page bytes, version words, node id)."""
    if len(b) < _HELLO.size or b[:4] != b"KVPS":
        raise ProtocolError("kvpool: not a kvpool hello")
    _, version, idlen, seg, page, words = _HELLO.unpack_from(b)
    if version != VERSION:
        raise ProtocolError(f"kvpool: hello version {version}, want {VERSION}")
    if len(b) != _HELLO.size + idlen:
        raise ProtocolError(f"kvpool: hello of {len(b)} bytes, want {_HELLO.size + idlen}")
    return seg, page, words, b[_HELLO.size:].decode()


def version_segment_bytes(words):
    """Size of the version words' segment: rounded up to 4 KiB, as the node maps it."""
    return (words * 8 + 4095) & ~4095


# How long a read or write spins on a socket that is not ready before it
# sleeps in poll(2). Waking a sleeping thread (a vCPU, on a VM) costs tens
# of microseconds, more than most waits for a node's answer: spinning
# halves a small round trip (70 to 27 us on a unix socket here).
SPIN_SECONDS = 50e-6
# One thread of the process spins at a time; the others sleep in poll(2).
# Spinning threads would take turns on the GIL and on the cores the node
# and the copies need.
_spinner = threading.Lock()


# The TCP congestion control of data-channel connections, as the Go
# client's and the node's (wire.DefaultCongestion): BBR, many hosts'
# default, paces each connection at its model of the path, and on bursts
# after idle time that model can fall far below the link.
DEFAULT_CONGESTION = "cubic"


def set_congestion(sock, algo):
    """Sets sock's TCP congestion control (Linux TCP_CONGESTION) to algo;
    None, "" and "host" leave the host's. Raises InvalidArgument, saying
    what the kernel has and allows, when it refuses algo."""
    if not algo or algo == "host":
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, algo.encode())
    except OSError as e:
        def proc(name):
            try:
                with open("/proc/sys/net/ipv4/" + name) as f:
                    return f.read().strip()
            except OSError:
                return "unknown"
        raise errors.InvalidArgument(
            f"kvpool: TCP congestion control {algo!r}: {e.strerror} (the kernel has: "
            f"{proc('tcp_available_congestion_control')}; this process may choose: "
            f"{proc('tcp_allowed_congestion_control')}), or use 'host'") from None


def connect(host, port, timeout, congestion=DEFAULT_CONGESTION):
    """socket.create_connection, with congestion control congestion set
    before the handshake: a connection that starts under BBR keeps BBR's
    pacing after it changes algorithm."""
    last = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            set_congestion(sock, congestion)
            sock.settimeout(timeout)
            sock.connect(addr)
            return sock
        except errors.InvalidArgument:
            sock.close()
            raise
        except OSError as e:
            sock.close()
            last = e
    raise last if last is not None else OSError(f"no address for {host}:{port}")


def congestion_or_default(algo):
    """algo, or for None and "" DEFAULT_CONGESTION where this process may
    set it and "host" where it may not: a default never stops a client."""
    if algo:
        return algo
    try:
        validate_congestion(DEFAULT_CONGESTION)
    except errors.InvalidArgument:
        return "host"
    return DEFAULT_CONGESTION


def validate_congestion(algo):
    """Raises InvalidArgument if set_congestion would refuse algo here:
    tries it on a socket that connects nowhere."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        set_congestion(sock, algo)


class Conn:
    """One data-channel connection. Not safe for concurrent use: a pool or a
    session lock serializes callers. After any I/O error, or a response with
    FLAG_CLOSE, usable is False and the connection must be closed.

    The socket is non-blocking: every read and write tries the syscall at
    once, spins for SPIN_SECONDS while it is not ready, then waits in
    poll(2) for at most timeout seconds (socket.timeout past it)."""

    def __init__(self, sock, timeout=10.0):
        self.sock = sock
        self.timeout = timeout
        sock.settimeout(0)
        self.usable = True
        self._hdr = bytearray(RESPONSE_HEADER_BYTES)
        self._hdr_view = memoryview(self._hdr)

    @classmethod
    def dial(cls, host, port, timeout, token=None, tls=None, congestion=DEFAULT_CONGESTION):
        """Connects to a node's data channel with TCP congestion control
        congestion (see set_congestion), through TLS with tls (an
        ssl.SSLContext, verifying the node as host), then the preamble with
        token."""
        sock = connect(host, port, timeout, congestion)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
            sock.sendall(preamble(token))
            return TLSConn(sock, timeout)
        sock.sendall(preamble(token))
        return cls(sock, timeout)

    def close(self):
        self.usable = False
        self.sock.close()

    def settimeout(self, timeout):
        self.timeout = timeout

    def _recv(self, view, n):
        """Receives up to n bytes into view: at least one, or EOF (0)."""
        recv_into = self.sock.recv_into
        try:
            return recv_into(view, n)
        except (BlockingIOError, InterruptedError):
            pass
        if _spinner.acquire(False):
            try:
                end = time.perf_counter() + SPIN_SECONDS
                while time.perf_counter() < end:
                    try:
                        return recv_into(view, n)
                    except (BlockingIOError, InterruptedError):
                        pass
            finally:
                _spinner.release()
        while True:
            self._block(select.POLLIN)
            try:
                return recv_into(view, n)
            except (BlockingIOError, InterruptedError):
                pass

    def _block(self, event):
        p = select.poll()
        p.register(self.sock, event | select.POLLERR | select.POLLHUP)
        if not p.poll(self.timeout * 1000 if self.timeout is not None else None):
            raise socket.timeout("kvpool: timed out")

    def send(self, *bufs):
        """Writes bufs in order with as few syscalls as the kernel allows (writev)."""
        try:
            views = [memoryview(b).cast("B") for b in bufs if len(b)]
            end = 0.0
            while views:
                try:
                    n = self.sock.sendmsg(views)
                except (BlockingIOError, InterruptedError):
                    if not end:
                        end = time.perf_counter() + SPIN_SECONDS
                    elif time.perf_counter() > end:
                        self._block(select.POLLOUT)
                        end = 0.0
                    continue
                end = 0.0
                while views and n >= views[0].nbytes:
                    n -= views[0].nbytes
                    views.pop(0)
                if n:
                    views[0] = views[0][n:]
        except OSError:
            self.usable = False
            raise

    def recv_into(self, view):
        """Fills view (a writable memoryview of bytes) from the stream."""
        n, size = 0, view.nbytes
        try:
            while n < size:
                k = self._recv(view[n:], size - n)
                if k == 0:
                    raise ConnectionError("kvpool: the node closed the connection")
                n += k
        except OSError:
            self.usable = False
            raise

    def recv_checksummed(self, view, chunk=256 << 10):
        """Fills view from the stream and returns the CRC-32C of the bytes,
        taken piece by piece while they are still in cache."""
        crc, n, size, done = 0, 0, view.nbytes, 0
        try:
            while n < size:
                k = self._recv(view[n:], size - n)
                if k == 0:
                    raise ConnectionError("kvpool: the node closed the connection")
                n += k
                if n - done >= chunk or n == size:
                    crc = crc32c(view[done:n], crc)
                    done = n
        except OSError:
            self.usable = False
            raise
        return crc

    def discard(self, n):
        """Reads and drops n value bytes, keeping the stream in step."""
        scratch = memoryview(bytearray(min(n, 1 << 20)))
        while n > 0:
            k = min(n, scratch.nbytes)
            self.recv_into(scratch[:k])
            n -= k

    def recv_response(self):
        """Reads the next response header and message. A non-OK status is
        raised as the exception the code maps to (errors.CODES)."""
        self.recv_into(self._hdr_view)
        r = Response()
        r.status, r.flags, ml, r.crc, r.value_len, r.offset, r.handle = _RESPONSE.unpack(self._hdr)
        if r.status > 16 or ml > MAX_MESSAGE_BYTES:
            self.usable = False
            raise ProtocolError(f"kvpool: malformed response (status {r.status}, message of {ml} bytes)")
        r.message = ""
        if ml:
            msg = bytearray(ml)
            self.recv_into(memoryview(msg))
            r.message = msg.decode(errors="replace")
        if r.flags & FLAG_CLOSE:
            self.usable = False
        if r.status:
            raise errors.from_code(r.status, r.message)
        return r

    def round_trip(self, request, *prefix):
        """Sends prefix frames (notifications such as releases) and request,
        and reads request's response."""
        self.send(*prefix, request)
        return self.recv_response()


class TLSConn(Conn):
    """A data-channel connection through TLS. Its socket blocks (with the
    timeout): TLS records cannot be polled for the way a plain socket's
    bytes can, and the cipher dominates the cost anyway."""

    def __init__(self, sock, timeout=10.0):
        super().__init__(sock, timeout)
        sock.settimeout(timeout)

    def settimeout(self, timeout):
        self.timeout = timeout
        self.sock.settimeout(timeout)

    def _recv(self, view, n):
        return self.sock.recv_into(view, n)

    def send(self, *bufs):
        try:
            for b in bufs:
                if len(b):
                    self.sock.sendall(memoryview(b).cast("B"))
        except OSError:
            self.usable = False
            raise
