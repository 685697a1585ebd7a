package wire

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// A Mailbox is a same-host session's second channel: a few pages of
// memory that the client and its node share (the client makes them, a
// sealed memfd, and hands them over with OpMailbox), through which a
// request and its answer pass without a system call. On the unix socket a
// commit's round trip is two writes and two reads, about 5 µs here with
// both ends polling, more than twice what the node spends serving it; a
// 2 MiB put's copy takes 50 µs, so that is a tenth of the put. Through the
// mailbox the round trip is two cache-line transfers.
//
// The protocol, one request at a time (the client's session lock):
//
//   - The client writes its frames (any releases and aborts it queued,
//     then one request that has a response) and their length, then
//     publishes the next sequence number (Post). Frames it wrote to the
//     socket before are served first: the node looks at the sequence
//     number before it reads the socket, and a socket that still holds
//     bytes is read first.
//   - The node copies the frames into its own memory (Take) and serves
//     them as it would from the socket, then writes the responses and
//     publishes the same sequence number (Respond).
//   - Either side may park instead of polling: it raises its parked word,
//     looks once more, and sleeps on the socket. (On the node's side the
//     word is up while nobody watches the mailbox: a node may have more
//     than one watcher, see Watch.) The other side, having
//     published, reads that word and, when it is raised, sends a frame on
//     the socket that does nothing but wake it (OpWake to the node, a
//     response with FlagWake to the client). Both the publication and the
//     look are sequentially consistent atomics, so one of the two sides
//     always sees the other (Dekker).
//
// The node trusts nothing it reads here: lengths are bounded before any
// copy, the frames are decoded from its private copy, and only ops that
// neither carry a value nor stream one are served (MailboxOp). A client
// that scribbles over the mailbox confuses only itself.
//
// Methods of the client side (Post, Answered, Answer, SetClientParked,
// NodeParked) and of the node side (Pending, Take, Respond, Watch,
// Unwatch) may run concurrently with each other; each side's own calls
// are sequential, except Watch and Unwatch, which the node's watchers call
// concurrently.
type Mailbox struct {
	mem []byte
	// answered is the node's last published sequence number (node side
	// only; the shared word may be scribbled by the client). Atomic: in a
	// same-process session (see LocalServer) the client's goroutine
	// serves posts while the node's may still look.
	answered atomic.Uint64
	// watchers counts who on the node's side watches the mailbox now
	// (see Watch). Node side only.
	watchers atomic.Int32
}

// Mailbox layout: the words each side writes on cache lines of their own.
const (
	// MailboxBytes is a mailbox's size, which the node requires exactly.
	MailboxBytes = 8192

	mbReqSeq       = 0   // uint64, client
	mbReqLen       = 8   // uint32, client
	mbRespSeq      = 64  // uint64, node
	mbRespLen      = 72  // uint32, node
	mbNodeParked   = 128 // uint32, node
	mbClientParked = 192 // uint32, client
	mbRequest      = 256
	// MailboxRequestBytes bounds the frames of one post: a request with
	// the longest names and key, behind up to 50 releases.
	MailboxRequestBytes = 2048
	mbResponse          = mbRequest + MailboxRequestBytes
	// MailboxResponseBytes bounds the answer: one response with the
	// longest message fits.
	MailboxResponseBytes = MailboxBytes - mbResponse
)

// NewMailbox wraps mem, MailboxBytes of shared memory aligned to 64 bytes
// (a mapping is).
func NewMailbox(mem []byte) (*Mailbox, error) {
	if len(mem) != MailboxBytes {
		return nil, fmt.Errorf("%w: mailbox of %d bytes, want %d", ErrProtocol, len(mem), MailboxBytes)
	}
	if uintptr(unsafe.Pointer(&mem[0]))%64 != 0 {
		return nil, fmt.Errorf("%w: mailbox not 64-byte aligned", ErrProtocol)
	}
	return &Mailbox{mem: mem}, nil
}

func (m *Mailbox) u64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&m.mem[off]))
}

func (m *Mailbox) u32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&m.mem[off]))
}

// Post publishes frames, which must fit MailboxRequestBytes, as the
// request that follows the last answered one, and reports its sequence
// number and whether the node was parked then (the caller must then wake
// it with OpWake on the socket). REQUIRES: the previous post answered.
func (m *Mailbox) Post(frames []byte) (seq uint64, nodeParked bool) {
	copy(m.mem[mbRequest:mbRequest+MailboxRequestBytes], frames)
	m.u32(mbReqLen).Store(uint32(len(frames)))
	seq = m.u64(mbReqSeq).Load() + 1
	m.u64(mbReqSeq).Store(seq)
	return seq, m.u32(mbNodeParked).Load() != 0
}

// Answered reports whether the node has answered post seq.
func (m *Mailbox) Answered(seq uint64) bool { return m.u64(mbRespSeq).Load() == seq }

// Answer returns the answer's bytes, in the shared memory (the caller
// copies them before it posts again), or reports that the node wrote the
// answer to the socket instead, being too long for the mailbox.
// REQUIRES: Answered.
func (m *Mailbox) Answer() (ans []byte, onSocket bool, err error) {
	n := m.u32(mbRespLen).Load()
	if n&answerOnSocket != 0 {
		return nil, true, nil
	}
	if n > MailboxResponseBytes {
		return nil, false, fmt.Errorf("%w: mailbox answer of %d bytes", ErrProtocol, n)
	}
	return m.mem[mbResponse : mbResponse+n], false, nil
}

// answerOnSocket, in the answer's length word, says the answer went to the
// socket.
const answerOnSocket = 1 << 31

// NodeParked reports whether nobody on the node's side watches the
// mailbox now: a post would have to wake it.
func (m *Mailbox) NodeParked() bool { return m.u32(mbNodeParked).Load() != 0 }

// SetClientParked raises or lowers the client's parked word.
func (m *Mailbox) SetClientParked(parked bool) { m.u32(mbClientParked).Store(b2u(parked)) }

// Pending reports whether a post waits for the node.
func (m *Mailbox) Pending() bool { return m.u64(mbReqSeq).Load() != m.answered.Load() }

// Take copies the pending post's frames into buf (at least
// MailboxRequestBytes) and returns them with the post's sequence number.
func (m *Mailbox) Take(buf []byte) (seq uint64, frames []byte, err error) {
	seq = m.u64(mbReqSeq).Load()
	n := int(m.u32(mbReqLen).Load())
	if n > MailboxRequestBytes || n > len(buf) {
		return seq, nil, fmt.Errorf("%w: mailbox request of %d bytes, at most %d", ErrProtocol, n, MailboxRequestBytes)
	}
	return seq, buf[:copy(buf[:n], m.mem[mbRequest:mbRequest+n])], nil
}

// Respond publishes resp as the answer to post seq. An answer longer
// than MailboxResponseBytes is not copied: the mailbox says it is on the
// socket, and the caller MUST write it there. clientParked reports
// whether the client was parked then; when the answer is in the mailbox,
// the caller must then wake it with a FlagWake response on the socket.
func (m *Mailbox) Respond(seq uint64, resp []byte) (onSocket, clientParked bool) {
	n := uint32(len(resp))
	if onSocket = len(resp) > MailboxResponseBytes; onSocket {
		n = answerOnSocket
	} else {
		copy(m.mem[mbResponse:], resp)
	}
	m.u32(mbRespLen).Store(n)
	m.answered.Store(seq)
	m.u64(mbRespSeq).Store(seq)
	return onSocket, m.u32(mbClientParked).Load() != 0
}

// Watch counts one more watcher of the mailbox on the node's side (its
// session's reader while it is not parked, a sweeper of many mailboxes
// while it sweeps) and lowers the node's parked word: a post is seen
// without a wake. Every Watch is undone by one Unwatch.
func (m *Mailbox) Watch() {
	m.watchers.Add(1)
	m.u32(mbNodeParked).Store(0)
}

// Unwatch counts one watcher less; the last one raises the node's parked
// word. It then reports whether a post is pending, which the caller must
// serve (or leave to another watcher): a post made before the word went
// up brings no OpWake.
//
// The word ends up raised whenever the count ends at zero, however the
// watchers interleave: a watcher lowers it only after its own Watch and
// before its own Unwatch, and the Unwatch that brings the count to zero
// follows every other (the count's updates are one atomic chain) and
// raises it after. A race can leave the word up while someone watches,
// which costs a client a needless OpWake, never a lost post.
func (m *Mailbox) Unwatch() (pending bool) {
	if m.watchers.Add(-1) == 0 {
		m.u32(mbNodeParked).Store(1)
	}
	return m.Pending()
}

// MailboxOp reports whether op may come through a mailbox: ops that read
// no value from the socket and write none to it.
func MailboxOp(op Op) bool {
	switch op {
	case OpView, OpRelease, OpReserve, OpCommit, OpAbort, OpRemove, OpExists:
		return true
	}
	return false
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
