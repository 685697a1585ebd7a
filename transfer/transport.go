package transfer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpool/kvpool/api"
)

// RegionID names registered memory, like an RDMA rkey.
type RegionID uint32

// Access decides whether the caller of a served request may touch
// [offset, +length) of region in direction kind; a non-nil error refuses
// it before any byte moves. A nil Access allows everything. The caller's
// identity comes from ctx (gRPC) or from the connection it was made for
// (tcp).
type Access func(ctx context.Context, kind Kind, region RegionID, offset, length uint64) error

// Kind is an op's direction.
type Kind uint8

const (
	kindInvalid Kind = iota
	// Read copies the peer's bytes into Local (RDMA READ).
	Read
	// Write copies Local into the peer's memory (RDMA WRITE).
	Write
)

func (k Kind) String() string {
	switch k {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Op is one one-sided transfer of len(Local) bytes between Local and the
// peer's region at Offset.
type Op struct {
	Kind   Kind
	Peer   string // the peer's transfer address
	Region RegionID
	Offset uint64
	// Local is the caller's buffer. It MUST NOT be touched until the batch
	// completes.
	Local []byte
	// Checksum asks a read to compute the CRC-32C of the bytes as they
	// arrive, while they are in cache (Batch.OpCRC): the receiver must
	// verify what crossed the wire, and reading it all again afterwards
	// would cost a pass over cold memory.
	Checksum bool
	// Name, when its Key is set, addresses a read by the block's name
	// instead of Region and Offset: the peer pins the block for as long
	// as it sends it, so no pin round trip comes first (transports that
	// implement NamedReader only; others fail the op). Local must have
	// the block's size: a block of another size fails the op with
	// ErrBlockSize and moves nothing. Batch.OpPeerCRC is then the
	// checksum the peer holds for the block.
	Name BlockName
}

// BlockName names a block on a peer: a named read's address.
type BlockName struct {
	Tenant, Namespace, Key []byte
}

// NamedReader is implemented by transports that serve reads addressed by
// a block's name (Op.Name).
type NamedReader interface {
	Transport
	// ReadsByName reports that Submit takes ops with Op.Name set.
	ReadsByName() bool
}

// RTTReporter is implemented by transports that can tell a link's round
// trip without a request of their own: the tcp transport reads the
// kernel's smoothed RTT of a connection to the peer (TCP_INFO).
type RTTReporter interface {
	// RTT returns the round trip to peer, and false when no connection
	// to it is up.
	RTT(peer string) (time.Duration, bool)
}

// BlockSource is what a transport serving named reads needs of the
// node's store: the block's bytes, held in place from PinBlock until
// UnpinBlock. A non-nil error refuses the read before any byte moves: an
// api.ErrNotFound when the block is not there, an
// api.ErrPermissionDenied when the caller may not read it. Safe for
// concurrent use.
type BlockSource interface {
	PinBlock(name BlockName) (PinnedBlock, error)
	UnpinBlock(PinnedBlock)
}

// PinnedBlock is a block held in place for a named read.
type PinnedBlock struct {
	// Mem is the block's bytes; valid until UnpinBlock.
	Mem []byte
	// CRC is the checksum the node holds for them (CRC-32C).
	CRC uint32
	// Handle is the source's, for UnpinBlock.
	Handle uint64
}

// Transport moves bytes one-sidedly between registered memory on peers and
// local buffers. Implementations are safe for concurrent use.
type Transport interface {
	// Name is the transport's Protocol as text: "tcp", "grpc" or "shm".
	Name() string
	// Register exposes mem to peers as region id until Deregister.
	Register(id RegionID, mem []byte) error
	// Deregister withdraws region id; later ops on it fail.
	Deregister(id RegionID)
	// Submit starts ops and returns at once. Cancelling ctx fails the ops
	// still in flight.
	Submit(ctx context.Context, ops []Op) *Batch
	// Close stops the transport. Every batch submitted before it has
	// completed when it returns: ops still pending fail (shm lets a copy
	// under way finish), and later Submits fail with ErrClosed. Calling
	// it again does nothing.
	Close() error
}

// Run submits ops on tr and waits for them, as Submit and then Wait do,
// and returns the batch and Wait's error. Use it when the caller waits
// for the batch at once: tcp then reads the responses on the calling
// goroutine (see TCP.run), which a fetch of one block finishes sooner
// with. The batch's Local buffers are the caller's once Done is closed,
// as after Wait.
func Run(ctx context.Context, tr Transport, ops []Op) (*Batch, error) {
	var b *Batch
	if r, ok := tr.(runner); ok {
		b = r.run(ctx, ops)
	} else {
		b = tr.Submit(ctx, ops)
	}
	return b, b.Wait(ctx)
}

// runner is a transport with a faster Submit for a caller that waits.
type runner interface {
	run(ctx context.Context, ops []Op) *Batch
}

// Errors transports report per op. Each is marked with the api sentinel
// that classifies it, so errors.Is(err, ErrNoRegion) and errors.Is(err,
// api.ErrNotFound) both hold, and api.Code and api.ToStatus map them
// without a table of their own.
var (
	// ErrNoRegion: the peer has no such region, or the range is outside
	// it. It is an api.ErrNotFound.
	ErrNoRegion = mark("transfer: no such region or range", api.ErrNotFound)
	// ErrPeer: the peer could not be reached or failed mid-transfer. It
	// is an api.ErrUnavailable.
	ErrPeer = mark("transfer: peer unavailable", api.ErrUnavailable)
	// ErrClosed: the transport is closed. It is an api.ErrUnavailable.
	ErrClosed = mark("transfer: transport closed", api.ErrUnavailable)
	// ErrBlockSize: a named read's block has another size than the op's
	// buffer. It is an api.ErrFailedPrecondition.
	ErrBlockSize = mark("transfer: block is not the size asked for", api.ErrFailedPrecondition)
)

// markedError is a sentinel with its own message that unwraps to the api
// sentinel classifying it [pebble internal/base/error.go].
type markedError struct {
	msg  string
	kind error
}

func mark(msg string, kind error) error { return &markedError{msg: msg, kind: kind} }

func (e *markedError) Error() string { return e.msg }
func (e *markedError) Unwrap() error { return e.kind }

// Batch is a submitted set of ops. It completes when every op has.
type Batch struct {
	done    chan struct{}
	mu      sync.Mutex
	errs    []error
	crcs    []uint32
	peerCRC []uint32 // named reads': what the peer holds for the block
	pending int
	bytes   uint64
	// onDone runs once, as the last op completes and before Done closes.
	onDone func()
	// responded is set once the first response of any op arrived, at
	// firstAt carrying firstBytes of payload (under mu).
	responded  atomic.Bool
	firstAt    time.Time
	firstBytes uint64
}

// NewBatch returns a batch of n ops; implementations call Complete once
// per op.
func NewBatch(n int) *Batch {
	b := &Batch{done: make(chan struct{}), errs: make([]error, n), crcs: make([]uint32, n), peerCRC: make([]uint32, n), pending: n}
	if n == 0 {
		close(b.done)
	}
	return b
}

// Complete records op i's outcome and how many bytes it moved.
func (b *Batch) Complete(i int, moved uint64, err error) { b.CompleteCRC(i, moved, 0, err) }

// CompleteCRC is Complete for a read that computed its checksum.
func (b *Batch) CompleteCRC(i int, moved uint64, crc uint32, err error) {
	b.CompleteNamed(i, moved, crc, 0, err)
}

// CompleteNamed is CompleteCRC for a named read, with the checksum the
// peer holds for the block (Op.Name).
func (b *Batch) CompleteNamed(i int, moved uint64, crc, peerCRC uint32, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errs[i] = err
	b.crcs[i] = crc
	b.peerCRC[i] = peerCRC
	b.bytes += moved
	b.pending--
	if b.pending == 0 {
		if b.onDone != nil {
			b.onDone()
		}
		close(b.done)
	}
}

// Responded records that a response to one of the batch's ops arrived
// now, with payload bytes of data in it (0 when only a header arrived).
// Only the first call counts; the rest cost one atomic load. Transports
// call it so that links are measured on the data path: the wait for the
// first response is the round trip plus the peer's service time, and the
// bytes after it measure bandwidth without subtracting an estimate.
func (b *Batch) Responded(payload uint64) {
	if b.responded.Load() {
		return
	}
	now := time.Now()
	b.mu.Lock()
	if b.firstAt.IsZero() {
		b.firstAt, b.firstBytes = now, payload
	}
	b.mu.Unlock()
	b.responded.Store(true)
}

// AwaitsFirstResponse reports whether no response has arrived yet: a
// transport that measures what arrived with the first one (a system
// call) does so only then.
func (b *Batch) AwaitsFirstResponse() bool { return !b.responded.Load() }

// FirstResponse returns when the first response arrived and how many
// payload bytes it carried; a zero time if no transport reported one.
func (b *Batch) FirstResponse() (time.Time, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.firstAt, b.firstBytes
}

// OnDone sets f to run as the batch completes, before Done is closed (or
// now, if it already has). Transports use it to disarm cancellation.
func (b *Batch) OnDone(f func()) {
	b.mu.Lock()
	if b.pending > 0 {
		b.onDone = f
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	f()
}

// Done is closed when every op has completed.
func (b *Batch) Done() <-chan struct{} { return b.done }

// Poll reports whether the batch is complete and, if so, its error.
func (b *Batch) Poll() (bool, error) {
	select {
	case <-b.done:
		return true, b.Err()
	default:
		return false, nil
	}
}

// Wait blocks until the batch completes or ctx ends, and returns every
// op's error joined, or ctx's error. NB: when ctx ends first, ops may
// still be running; their Local buffers are the caller's only once Done
// is closed.
func (b *Batch) Wait(ctx context.Context) error {
	select {
	case <-b.done:
		return b.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Err joins the ops' errors; nil while pending ops have none yet.
func (b *Batch) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return errors.Join(b.errs...)
}

// OpErr returns op i's error.
func (b *Batch) OpErr(i int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.errs[i]
}

// OpCRC returns the CRC-32C of what op i read, when it asked for one and
// succeeded.
func (b *Batch) OpCRC(i int) uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.crcs[i]
}

// OpPeerCRC returns the checksum the peer holds for the block named read
// i read (Op.Name), when it succeeded.
func (b *Batch) OpPeerCRC(i int) uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peerCRC[i]
}

// Bytes returns how many bytes completed ops moved.
func (b *Batch) Bytes() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bytes
}

// regions is the registry every transport keeps on its serving side.
type regions struct {
	mu sync.RWMutex
	m  map[RegionID][]byte
}

func (r *regions) register(id RegionID, mem []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[RegionID][]byte{}
	}
	if _, ok := r.m[id]; ok {
		return fmt.Errorf("transfer: region %d is already registered", id)
	}
	r.m[id] = mem
	return nil
}

func (r *regions) deregister(id RegionID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, id)
}

// slice returns [off, off+n) of region id.
func (r *regions) slice(id RegionID, off, n uint64) ([]byte, error) {
	r.mu.RLock()
	mem, ok := r.m[id]
	r.mu.RUnlock()
	if !ok || off > uint64(len(mem)) || n > uint64(len(mem))-off {
		return nil, fmt.Errorf("%w: region %d [%d, +%d)", ErrNoRegion, id, off, n)
	}
	return mem[off : off+n : off+n], nil
}
