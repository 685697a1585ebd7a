// Package wire is the framed binary protocol that carries block bytes
// between a client and a node, beside gRPC.
//
// Why not gRPC for bytes: protobuf marshalling copies every value twice and
// allocates it once more, which caps grpc-go at about 1 GB/s for 2 MiB
// messages on our machines, while one raw TCP connection carries 4.5 GB/s.
// The data channel is a plain byte stream whose frames have fixed-size
// headers, so the node writes block bytes straight from the shared-memory
// arena to the socket and reads them straight from the socket into the
// arena, and the client does the same with the caller's buffer: one copy
// per side, as raw TCP.
//
// A TCP data connection starts with the four bytes "KVPD" and a version
// byte plus three zero bytes; the node serves gRPC and the data channel on
// one port and tells them apart by those first bytes. A unix-socket
// connection (same host) starts with the node's Hello, sent with the
// segment's file descriptor attached; it needs no preamble.
//
// After that the client sends requests and reads responses in order; it may
// pipeline requests. Each request is a 32-byte header, then the tenant,
// namespace and key bytes; a Put follows them with the value and an 8-byte
// trailer (CRC-32C, "KVPE"). Each response is a 32-byte header, then the
// error message when the status is not OK, then the value of a Get. All
// integers are little-endian.
//
//	request header              response header
//	 0 op                        0 status (a gRPC code; 0 is OK)
//	 1 flags                     1 flags
//	 2 tenant length             2 message length (u16)
//	 3 namespace length          4 CRC-32C of the value (u32)
//	 4 key length (u16)          8 value length (u64)
//	 6 reserved (0)             16 offset in the segment (u64)
//	 8 CRC-32C (u32)            24 handle (u64)
//	12 argument (u32): copies for Put and Commit, lease ms for Get
//	   and View with FlagLease, else 0
//	16 value length (u64)
//	24 handle (u64)
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"syscall"
)

// Preamble opens a TCP data connection.
var Preamble = [8]byte{'K', 'V', 'P', 'D', Version, 0, 0, 0}

// PreambleFlagToken, in byte 5 of a preamble (the data channel's and the
// tcp transport's), says a bearer token follows it: its length as a
// little-endian uint16 in bytes 6 and 7, then that many bytes.
const PreambleFlagToken = 1

// MaxTokenBytes bounds a token in a preamble.
const MaxTokenBytes = 1024

// AppendPreamble appends preamble, with token after it when not empty.
func AppendPreamble(b []byte, preamble [8]byte, token string) []byte {
	if token == "" {
		return append(b, preamble[:]...)
	}
	preamble[5] = PreambleFlagToken
	binary.LittleEndian.PutUint16(preamble[6:], uint16(len(token)))
	return append(append(b, preamble[:]...), token...)
}

// ReadPreambleToken reads what follows a preamble whose first five bytes
// matched: nothing, or the token its flags announce. Any other flag, or a
// token longer than MaxTokenBytes, is ErrProtocol.
func ReadPreambleToken(r io.Reader, preamble [8]byte) (string, error) {
	switch {
	case preamble[5] == 0 && preamble[6] == 0 && preamble[7] == 0:
		return "", nil
	case preamble[5] != PreambleFlagToken:
		return "", fmt.Errorf("%w: preamble flags %#x", ErrProtocol, preamble[5])
	}
	n := int(binary.LittleEndian.Uint16(preamble[6:]))
	if n == 0 || n > MaxTokenBytes {
		return "", fmt.Errorf("%w: preamble token of %d bytes (1 to %d)", ErrProtocol, n, MaxTokenBytes)
	}
	tok := make([]byte, n)
	if _, err := io.ReadFull(r, tok); err != nil {
		return "", err
	}
	return string(tok), nil
}

// Version is the protocol version in the preamble and the Hello.
const Version = 1

// TrailerMagic ends every Put value.
const TrailerMagic = 0x4550564b // "KVPE" little-endian

// Sizes of the fixed parts of frames.
const (
	RequestHeaderBytes  = 32
	ResponseHeaderBytes = 32
	TrailerBytes        = 8
)

// Limits a decoder enforces before it reads variable-length parts.
const (
	MaxNameBytes    = 64
	MaxKeyBytes     = 128
	MaxMessageBytes = 4096
)

// Op is a request's operation.
type Op uint8

const (
	opInvalid Op = iota
	// OpGet reads a block: the response carries its CRC and value.
	OpGet
	// OpPut stores a block: the request carries the value and trailer.
	OpPut
	// OpRemove deletes a block.
	OpRemove
	// OpSource asks the node to send ValueLen bytes of filler: a raw link
	// baseline measured over the same connection as real traffic.
	OpSource
	// OpSink sends ValueLen bytes that the node reads and discards.
	OpSink
	// OpView pins a block for a same-host client: the response carries its
	// offset in the segment, size, CRC and a handle for OpRelease.
	OpView
	// OpRelease drops a pin taken by OpView. It has no response.
	OpRelease
	// OpReserve reserves ValueLen bytes in the segment for a same-host
	// writer: the response carries the offset and a handle.
	OpReserve
	// OpCommit commits the reservation Handle; FlagChecksum asks the node
	// to check CRC against the bytes it finds, FlagWriterChecksum hands it
	// the writer's CRC to store as it is, and Replicas asks for copies as
	// a Put does. A non-empty Key commits the block under that key
	// instead of the one reserved (Tenant and Namespace must be the
	// reservation's): how a spare reserved ahead (FlagReserveNext) is
	// used for the next put.
	OpCommit
	// OpAbort abandons the reservation Handle. It has no response.
	OpAbort
	// OpFetch makes a chain of blocks local, pulling from peers what the
	// node lacks (see fetch.go for its value and its response's).
	OpFetch
	// OpMailbox hands the node a same-host session's mailbox (see
	// Mailbox): a sealed memfd of MailboxBytes, sent with the frame on the
	// unix socket (SCM_RIGHTS). Only a node whose Info says shm_mailbox
	// knows it.
	OpMailbox
	// OpWake does nothing: a client sends it after posting to the mailbox
	// of a node that had parked on the socket, or just before it posts
	// (Conn.WakeAhead): a wake that finds nothing posted has the node's
	// reader spin for the post even if its last spins found nothing. It
	// has no response.
	OpWake
	// OpExists asks whether the node holds a block, in memory or on its
	// disk tier: the response's FlagExisted says it does. One frame per
	// key, pipelined: a client that holds a session asks for a request's
	// blocks in one round trip, with no gRPC call.
	OpExists
	opCount
)

// NumOps bounds Op values: every valid op is below it.
const NumOps = int(opCount)

var opNames = [...]string{"invalid", "get", "put", "remove", "source", "sink", "view", "release", "reserve", "commit", "abort", "fetch", "mailbox", "wake", "exists"}

func (o Op) String() string {
	if o < opCount {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// HasResponse reports whether the node answers o.
func (o Op) HasResponse() bool { return o != OpRelease && o != OpAbort && o != OpWake }

// Request flags.
const (
	// FlagChecksum: the CRC field (or, for a Put, the trailer's CRC) holds
	// the value's checksum and the node must verify it.
	FlagChecksum = 1 << 0
	// FlagLease (Get, View): also take a read lease of LeaseMs on the
	// block, or of the node's default when LeaseMs is 0.
	FlagLease = 1 << 1
	// FlagForce (Remove): remove the block even under a read lease.
	FlagForce = 1 << 2
	// FlagWriterChecksum (Commit): CRC is the checksum the same-host
	// writer took of the bytes it wrote in place, while they were in its
	// cache; the node stores it without reading the block again. Reading
	// 2 MiB that another core just wrote is most of a commit's cost, and
	// the check proves little on this path: the writer holds the mapping
	// and could change the bytes after any check. A wrong CRC is caught by
	// every reader that crosses a socket (DataLoss), never served as good.
	// With FlagChecksum as well, the node verifies instead.
	FlagWriterChecksum = 1 << 3
	// FlagReserveNext (Commit): once committed, also reserve a spare of the
	// same size, tenant and namespace for this session's next put, and
	// name it in the response (FlagReserved). The writer's next put is
	// then a copy and one round trip (a Commit with the new Key) instead
	// of two. A spare belongs to the session: the node does not reclaim
	// it on the reservation timeout, only when the session aborts it or
	// ends. (Reserve): the reservation is such a spare, made on its own:
	// a write-behind writer asks for more than the one a commit brings, so
	// it copies into one while the node makes the next. A session holds
	// as many spares as the node's Info says (session_spares); only a
	// node that says 2 or more takes the flag on a Reserve.
	FlagReserveNext = 1 << 4
	// FlagServeLocally (Mailbox): the client is the node's own process
	// and serves its posts itself (see LocalServer): the node registers
	// the session, answers with its token in Handle, and does not watch
	// the mailbox. A client in another process may not ask.
	FlagServeLocally = 1 << 5
)

// flagsAllowed are the request flags each op accepts.
var flagsAllowed = [opCount]uint8{
	OpGet: FlagLease, OpPut: FlagChecksum, OpRemove: FlagForce, OpView: FlagLease, OpReserve: FlagReserveNext,
	OpCommit:  FlagChecksum | FlagWriterChecksum | FlagReserveNext,
	OpMailbox: FlagServeLocally,
}

// Response flags.
const (
	// FlagExisted: a Put or Commit found an identical block already
	// stored; an Exists found the block.
	FlagExisted = 1 << 0
	// FlagClose: the node closes the connection after this response (the
	// request left the stream out of step); the client must not reuse it.
	FlagClose = 1 << 1
	// FlagReserved: a Commit or Reserve with FlagReserveNext got its
	// spare, named by the response's Offset and Handle (its size is the
	// block's).
	FlagReserved = 1 << 2
	// FlagWake: not an answer to any request, but the node waking a
	// client that parked on the socket while it waited for an answer in
	// its mailbox (see Mailbox). A client skips it wherever it comes.
	FlagWake = 1 << 3
)

// Request is a decoded request header with its names and key. The byte
// slices alias the decoder's buffer and are valid until the next read.
type Request struct {
	Op    Op
	Flags uint8
	CRC   uint32
	// Replicas asks a Put or Commit to place this many copies on distinct
	// nodes in all (0 and 1 mean just this node).
	Replicas uint32
	// LeaseMs is the read lease a Get or View with FlagLease asks for, in
	// milliseconds (0: the node's default). It shares the header field
	// with Replicas: no op carries both.
	LeaseMs uint32
	// TimeoutMs bounds each holder's transfer of a Fetch, in milliseconds
	// (0: the node's default). It shares the header field too.
	TimeoutMs uint32
	ValueLen  uint64
	Handle    uint64
	// CallOverheadUs, on a Fetch, is how much longer the client's
	// previous Fetch took, timed around its call, than the node said
	// its fetch took (FetchResult.Took), in microseconds; 0 when the
	// client does not know. PreviousCallBlocks is how many keys that
	// call asked for (0: not said): what a call costs beyond the node's
	// fetch grows with its chain (the answer's results, and the node's
	// bookkeeping of more blocks on the same cores). The two share the
	// header field with Handle, which a Fetch does not carry: the
	// overhead its low 32 bits (AppendRequest saturates it), the blocks
	// its high 32, so a client that sends only an overhead says no
	// blocks. (A node that predates the split reads both as one overhead
	// too large to be plausible, and ignores the report.)
	CallOverheadUs     uint64
	PreviousCallBlocks uint32
	Tenant             []byte
	Namespace          []byte
	Key                []byte
}

// ErrProtocol marks a malformed frame; the connection cannot continue.
var ErrProtocol = errors.New("wire: protocol error")

// AppendRequest appends r's header, names and key to b.
func AppendRequest(b []byte, r *Request) []byte {
	var h [RequestHeaderBytes]byte
	h[0] = byte(r.Op)
	h[1] = r.Flags
	h[2] = byte(len(r.Tenant))
	h[3] = byte(len(r.Namespace))
	binary.LittleEndian.PutUint16(h[4:], uint16(len(r.Key)))
	binary.LittleEndian.PutUint32(h[8:], r.CRC)
	binary.LittleEndian.PutUint32(h[12:], r.Replicas|r.LeaseMs|r.TimeoutMs)
	binary.LittleEndian.PutUint64(h[16:], r.ValueLen)
	binary.LittleEndian.PutUint64(h[24:], r.Handle|min(r.CallOverheadUs, math.MaxUint32)|uint64(r.PreviousCallBlocks)<<32)
	b = append(b, h[:]...)
	b = append(b, r.Tenant...)
	b = append(b, r.Namespace...)
	return append(b, r.Key...)
}

// DecodeRequestHeader parses a request header and returns the number of
// name and key bytes that follow it. It rejects unknown ops, nonzero
// reserved bytes and oversized names or keys.
func DecodeRequestHeader(h []byte, r *Request) (int, error) {
	if len(h) < RequestHeaderBytes {
		return 0, fmt.Errorf("%w: short request header", ErrProtocol)
	}
	r.Op = Op(h[0])
	r.Flags = h[1]
	tl, nl := int(h[2]), int(h[3])
	kl := int(binary.LittleEndian.Uint16(h[4:]))
	r.CRC = binary.LittleEndian.Uint32(h[8:])
	arg := binary.LittleEndian.Uint32(h[12:])
	r.Replicas, r.LeaseMs, r.TimeoutMs = 0, 0, 0
	r.ValueLen = binary.LittleEndian.Uint64(h[16:])
	r.Handle = binary.LittleEndian.Uint64(h[24:])
	r.CallOverheadUs, r.PreviousCallBlocks = 0, 0
	if r.Op == OpFetch {
		r.Handle, r.CallOverheadUs, r.PreviousCallBlocks = 0, r.Handle&math.MaxUint32, uint32(r.Handle>>32)
	}
	switch {
	case r.Op == opInvalid || r.Op >= opCount:
		return 0, fmt.Errorf("%w: unknown op %d", ErrProtocol, h[0])
	case r.Flags&^flagsAllowed[r.Op] != 0:
		return 0, fmt.Errorf("%w: flags %#x on a %v request", ErrProtocol, r.Flags, r.Op)
	case r.Op == OpPut || r.Op == OpCommit:
		r.Replicas = arg
	case r.Op == OpFetch:
		r.TimeoutMs = arg
	case r.Flags&FlagLease != 0:
		r.LeaseMs = arg
	case arg != 0:
		return 0, fmt.Errorf("%w: reserved header bytes are not zero", ErrProtocol)
	}
	switch {
	case binary.LittleEndian.Uint16(h[6:]) != 0:
		return 0, fmt.Errorf("%w: reserved header bytes are not zero", ErrProtocol)
	case tl > MaxNameBytes || nl > MaxNameBytes:
		return 0, fmt.Errorf("%w: name longer than %d bytes", ErrProtocol, MaxNameBytes)
	case kl > MaxKeyBytes:
		return 0, fmt.Errorf("%w: key of %d bytes, more than %d", ErrProtocol, kl, MaxKeyBytes)
	}
	return tl + nl + kl, nil
}

// SplitNames points r's Tenant, Namespace and Key at rest, the bytes that
// followed the header h.
func SplitNames(h, rest []byte, r *Request) {
	tl, nl := int(h[2]), int(h[3])
	r.Tenant = rest[:tl:tl]
	r.Namespace = rest[tl : tl+nl : tl+nl]
	r.Key = rest[tl+nl:]
}

// ReadRequest reads one request header, names and key from rd into r,
// using buf (at least RequestHeaderBytes+2*MaxNameBytes+MaxKeyBytes bytes)
// as storage. It returns io.EOF only when rd ends cleanly between frames.
func ReadRequest(rd io.Reader, buf []byte, r *Request) error {
	h := buf[:RequestHeaderBytes]
	if _, err := io.ReadFull(rd, h); err != nil {
		return err
	}
	n, err := DecodeRequestHeader(h, r)
	if err != nil {
		return err
	}
	rest := buf[RequestHeaderBytes : RequestHeaderBytes+n]
	if _, err := io.ReadFull(rd, rest); err != nil {
		return noEOF(err)
	}
	SplitNames(h, rest, r)
	return nil
}

// RequestBufferBytes is the buffer ReadRequest needs.
const RequestBufferBytes = RequestHeaderBytes + 2*MaxNameBytes + MaxKeyBytes

// Response is a decoded response header.
type Response struct {
	Status   uint8 // a gRPC code
	Flags    uint8
	CRC      uint32
	ValueLen uint64
	Offset   uint64
	Handle   uint64
	Message  string
}

// AppendResponse appends r's header and message to b.
func AppendResponse(b []byte, r *Response) []byte {
	msg := r.Message
	if len(msg) > MaxMessageBytes {
		msg = msg[:MaxMessageBytes]
	}
	var h [ResponseHeaderBytes]byte
	h[0] = r.Status
	h[1] = r.Flags
	binary.LittleEndian.PutUint16(h[2:], uint16(len(msg)))
	binary.LittleEndian.PutUint32(h[4:], r.CRC)
	binary.LittleEndian.PutUint64(h[8:], r.ValueLen)
	binary.LittleEndian.PutUint64(h[16:], r.Offset)
	binary.LittleEndian.PutUint64(h[24:], r.Handle)
	return append(append(b, h[:]...), msg...)
}

// DecodeResponseHeader parses a response header and returns the message
// length that follows it.
func DecodeResponseHeader(h []byte, r *Response) (int, error) {
	if len(h) < ResponseHeaderBytes {
		return 0, fmt.Errorf("%w: short response header", ErrProtocol)
	}
	r.Status = h[0]
	r.Flags = h[1]
	ml := int(binary.LittleEndian.Uint16(h[2:]))
	r.CRC = binary.LittleEndian.Uint32(h[4:])
	r.ValueLen = binary.LittleEndian.Uint64(h[8:])
	r.Offset = binary.LittleEndian.Uint64(h[16:])
	r.Handle = binary.LittleEndian.Uint64(h[24:])
	r.Message = ""
	if r.Status > 16 {
		return 0, fmt.Errorf("%w: status %d is not a gRPC code", ErrProtocol, r.Status)
	}
	if ml > MaxMessageBytes {
		return 0, fmt.Errorf("%w: message of %d bytes", ErrProtocol, ml)
	}
	return ml, nil
}

// ReadResponse reads one response header and message.
func ReadResponse(rd io.Reader, r *Response) error {
	var h [ResponseHeaderBytes]byte
	if _, err := io.ReadFull(rd, h[:]); err != nil {
		return noEOF(err)
	}
	ml, err := DecodeResponseHeader(h[:], r)
	if err != nil {
		return err
	}
	if ml > 0 {
		msg := make([]byte, ml)
		if _, err := io.ReadFull(rd, msg); err != nil {
			return noEOF(err)
		}
		r.Message = string(msg)
	}
	return nil
}

// AppendTrailer appends a Put trailer.
func AppendTrailer(b []byte, crc uint32) []byte {
	b = binary.LittleEndian.AppendUint32(b, crc)
	return binary.LittleEndian.AppendUint32(b, TrailerMagic)
}

// DecodeTrailer returns a Put trailer's CRC. A wrong magic means the value
// was not the length its header said.
func DecodeTrailer(t []byte) (uint32, error) {
	if len(t) < TrailerBytes || binary.LittleEndian.Uint32(t[4:]) != TrailerMagic {
		return 0, fmt.Errorf("%w: the value is not the length its header declares (trailer mismatch)", ErrProtocol)
	}
	return binary.LittleEndian.Uint32(t), nil
}

// Hello is what a node sends first on a unix-socket connection, together
// with two file descriptors: the segment, and the version words (one
// uint64 per page, read-only for clients; see store.New).
type Hello struct {
	SegmentBytes uint64
	PageBytes    uint32
	VersionWords uint64
	NodeID       string
}

// VersionSegmentBytes is the size of the version words' segment holding
// words words: rounded up to 4 KiB pages, so node and client map the same
// length.
func VersionSegmentBytes(words uint64) uint64 { return (words*8 + 4095) &^ 4095 }

const (
	helloMagic = "KVPS"
	helloBytes = 28 // magic, version, id length, 2 zero bytes, three sizes
)

// AppendHello encodes h.
func AppendHello(b []byte, h *Hello) []byte {
	b = append(b, helloMagic...)
	b = append(b, Version, byte(len(h.NodeID)), 0, 0)
	b = binary.LittleEndian.AppendUint64(b, h.SegmentBytes)
	b = binary.LittleEndian.AppendUint32(b, h.PageBytes)
	b = binary.LittleEndian.AppendUint64(b, h.VersionWords)
	return append(b, h.NodeID...)
}

// DecodeHello parses a Hello.
func DecodeHello(b []byte, h *Hello) error {
	if len(b) < helloBytes || string(b[:4]) != helloMagic {
		return fmt.Errorf("%w: not a kvpool hello", ErrProtocol)
	}
	if b[4] != Version {
		return fmt.Errorf("%w: hello version %d, want %d", ErrProtocol, b[4], Version)
	}
	n := int(b[5])
	if len(b) != helloBytes+n || b[6] != 0 || b[7] != 0 {
		return fmt.Errorf("%w: hello of %d bytes, want %d", ErrProtocol, len(b), helloBytes+n)
	}
	h.SegmentBytes = binary.LittleEndian.Uint64(b[8:])
	h.PageBytes = binary.LittleEndian.Uint32(b[16:])
	h.VersionWords = binary.LittleEndian.Uint64(b[20:])
	h.NodeID = string(b[helloBytes:])
	return nil
}

// SendHello writes h on c with the descriptors fds attached (SCM_RIGHTS):
// what a node sends first on a same-host connection.
func SendHello(c *net.UnixConn, h *Hello, fds ...int) error {
	_, _, err := c.WriteMsgUnix(AppendHello(nil, h), syscall.UnixRights(fds...), nil)
	return err
}

// ReceiveHello reads a node's Hello into h and the want descriptors that
// came with it; the caller owns them and MUST close them.
func ReceiveHello(c *net.UnixConn, h *Hello, want int) ([]int, error) {
	buf := make([]byte, helloBytes+255)
	oob := make([]byte, syscall.CmsgSpace(4*want))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	if err == nil && len(msgs) == 1 {
		fds, err = syscall.ParseUnixRights(&msgs[0])
	}
	if err == nil && len(fds) != want {
		err = fmt.Errorf("%w: the hello carried %d descriptors, want %d", ErrProtocol, len(fds), want)
	}
	if err == nil {
		err = DecodeHello(buf[:n], h)
	}
	if err != nil {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return nil, err
	}
	return fds, nil
}

// noEOF turns a clean EOF inside a frame into io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
