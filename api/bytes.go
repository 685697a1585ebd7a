package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/kvpool/kvpool/api/wire"
)

// bytePath moves block bytes over one of the three paths: the node's
// shared memory (shmPath), the framed data channel (dataPath) or gRPC
// (grpcPath). A Client holds exactly one, chosen at Dial, and every
// byte-moving method goes through it, so no method can quietly take
// another path. Implementations are safe for concurrent use.
type bytePath interface {
	// put stores value under k; copies > 1 asks the node to place copies
	// on other nodes until that many hold the block.
	put(ctx context.Context, k BlockKey, value []byte, copies uint32) (PutResult, error)
	// putMany stores values[i] under keys[i] in tenant/namespace, as one
	// batch where the path can, and returns an error per block; the error
	// is for the whole call.
	putMany(ctx context.Context, tenant, namespace string, keys, values [][]byte) ([]error, error)
	// get copies the block under k into dst, or into a new slice when dst
	// is nil, verifying its checksum (shared memory only when configured),
	// and takes a read lease when l asks for one.
	get(ctx context.Context, k BlockKey, dst []byte, l lease) ([]byte, error)
	// view pins the block in place where the path can (shared memory) and
	// otherwise copies it out.
	view(ctx context.Context, k BlockKey, l lease) (*View, error)
	// reserve holds size bytes for the block k: in the node's segment on
	// shared memory, a private buffer that Commit puts otherwise.
	reserve(ctx context.Context, k BlockKey, size int) (*Reservation, error)
	// remove deletes the blocks under keys and returns an error per key
	// (ErrNotFound for a missing one); the error is for the whole call.
	remove(ctx context.Context, tenant, namespace string, keys [][]byte, force bool) ([]error, error)
	// close releases the path's connections and mappings, waiting for
	// copies in flight.
	close() error
}

// lease is a read-lease request: on asks for one, ms is its length (0:
// the node's default).
type lease struct {
	on bool
	ms uint32
}

func leaseMs(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	return uint32(min(d.Milliseconds(), 1<<31))
}

// PutResult says what a Put did.
type PutResult struct {
	Existed bool   // an identical block was already stored
	CRC     uint32 // the stored checksum
}

// Put stores value under k. Putting equal bytes again succeeds; different
// bytes fail with ErrAlreadyExists. Other errors: ErrInvalidArgument,
// ErrResourceExhausted, ErrDataLoss (bytes damaged on the way),
// ErrUnavailable.
func (c *Client) Put(ctx context.Context, k BlockKey, value []byte) error {
	_, err := c.PutResult(ctx, k, value)
	return err
}

// PutResult is Put that also reports whether the block existed.
func (c *Client) PutResult(ctx context.Context, k BlockKey, value []byte) (PutResult, error) {
	if err := c.checkValue(k, len(value)); err != nil {
		return PutResult{}, err
	}
	return c.bytes.put(ctx, k, value, 0)
}

// PutAsync stores value under k as Put does, but on the shared-memory
// path it returns once the value is in the node's segment and its commit
// is posted, without waiting for the node's answer: an engine saving its
// blocks copies the next one while the node commits this one (a
// write-behind put). value may be reused when it returns. Other paths
// wait, as Put does.
//
// The block is visible to this Client's later calls (each settles the
// commit in flight first) and, microseconds later, to everyone. A commit
// the node refuses after PutAsync returned (ErrAlreadyExists for
// different bytes under the key, or the session's end) is reported by
// Flush or Close, naming the key. An error PutAsync returns is this
// put's (bad arguments, no room to reserve, a session that broke before
// the commit went out, or a refusal answered before it returned: a client
// in the node's own process waits for each answer), and the block was
// not stored.
func (c *Client) PutAsync(ctx context.Context, k BlockKey, value []byte) error {
	if err := c.checkValue(k, len(value)); err != nil {
		return err
	}
	if b, ok := c.bytes.(writeBehindPath); ok {
		return b.putBehind(ctx, k, value)
	}
	_, err := c.bytes.put(ctx, k, value, 0)
	return err
}

// Flush waits for the commit of the last PutAsync, if it is in flight,
// and returns the failures of PutAsync calls since the last Flush,
// joined, each naming its key: nil means every block they put is stored.
// At most 64 failures are named; the rest are counted.
func (c *Client) Flush(ctx context.Context) error {
	if b, ok := c.bytes.(writeBehindPath); ok {
		return b.flushBehind(ctx)
	}
	return nil
}

// writeBehindPath is a bytePath whose puts can return before their
// commits are answered (shared memory): see PutAsync.
type writeBehindPath interface {
	putBehind(ctx context.Context, k BlockKey, value []byte) error
	flushBehind(ctx context.Context) error
}

// PutReplicas stores value under k on the client's node and has that node
// place copies on other nodes until `copies` distinct nodes hold it
// (nodes that already do count). It returns once every copy is committed,
// or an error saying how many were placed (the local copy stays).
func (c *Client) PutReplicas(ctx context.Context, k BlockKey, value []byte, copies int) error {
	if copies < 1 || copies > 1<<16 {
		return fmt.Errorf("%w: %d copies", ErrInvalidArgument, copies)
	}
	if err := c.checkValue(k, len(value)); err != nil {
		return err
	}
	_, err := c.bytes.put(ctx, k, value, uint32(copies))
	return err
}

// PutMany stores values[i] under keys[i] in tenant/namespace: the blocks
// an engine saves for one request, as one batch. Over shared memory one
// round trip reserves a window of up to 64 blocks, the values are copied
// in, and one more commits them all; over the data channel the puts of a
// window are pipelined on one connection (their responses read after the
// last block's bytes); over gRPC they go one after another. errs[i] is
// the i-th block's error (nil: stored, or equal bytes already were), as
// Put would return it; err is for the call (bad arguments, a broken
// session), after which blocks not reported stored may or may not be.
func (c *Client) PutMany(ctx context.Context, tenant, namespace string, keys, values [][]byte) (errs []error, err error) {
	if len(keys) != len(values) {
		return nil, fmt.Errorf("%w: %d keys for %d values", ErrInvalidArgument, len(keys), len(values))
	}
	for i, k := range keys {
		if err := c.checkValue(BlockKey{Tenant: tenant, Namespace: namespace, Key: k}, len(values[i])); err != nil {
			return nil, fmt.Errorf("block %d: %w", i, err)
		}
	}
	return c.bytes.putMany(ctx, tenant, namespace, keys, values)
}

// putEach is putMany for paths that send one block after another.
func putEach(ctx context.Context, p bytePath, tenant, namespace string, keys, values [][]byte) ([]error, error) {
	errs := make([]error, len(keys))
	for i, k := range keys {
		_, err := p.put(ctx, BlockKey{Tenant: tenant, Namespace: namespace, Key: k}, values[i], 0)
		if err != nil && !isRemote(err) {
			return errs, err
		}
		errs[i] = err
	}
	return errs, nil
}

// checkValue validates a block before it is sent.
func (c *Client) checkValue(k BlockKey, size int) error {
	if err := k.Validate(); err != nil {
		return err
	}
	if size <= 0 {
		return fmt.Errorf("%w: empty value", ErrInvalidArgument)
	}
	if max := c.info.GetMaxBlockBytes(); uint64(size) > max {
		return fmt.Errorf("%w: value of %d bytes exceeds the node's max block size of %d bytes", ErrInvalidArgument, size, max)
	}
	return nil
}

// Get copies the block under k into dst and returns its length. The bytes
// are verified against the block's checksum (ErrDataLoss when they do not
// match). A dst shorter than the block gives ErrInvalidArgument and leaves
// dst unspecified. Other errors: ErrNotFound, ErrUnavailable.
func (c *Client) Get(ctx context.Context, k BlockKey, dst []byte) (int, error) {
	if err := k.Validate(); err != nil {
		return 0, err
	}
	if dst == nil {
		dst = []byte{}
	}
	v, err := c.bytes.get(ctx, k, dst, lease{})
	return len(v), err
}

// GetValue returns the block under k in a new slice.
func (c *Client) GetValue(ctx context.Context, k BlockKey) ([]byte, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	return c.bytes.get(ctx, k, nil, lease{})
}

// GetLease is GetValue that also takes a read lease of d on the block
// (d ≤ 0: the node's default), over the client's path.
func (c *Client) GetLease(ctx context.Context, k BlockKey, d time.Duration) ([]byte, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	return c.bytes.get(ctx, k, nil, lease{on: true, ms: leaseMs(d)})
}

// View pins the block under k and returns its bytes in place. Without the
// shared-memory path it falls back to a copy, so callers can use one code
// path everywhere. Callers MUST Close the view.
func (c *Client) View(ctx context.Context, k BlockKey) (*View, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	return c.bytes.view(ctx, k, lease{})
}

// Reserve reserves size bytes for the block k. On the shared-memory path
// the bytes are the block's final place in the node's segment, so an
// engine can DMA straight into them. Callers MUST Commit or Abort; a
// reservation left open is reclaimed by the node after its timeout.
func (c *Client) Reserve(ctx context.Context, k BlockKey, size int) (*Reservation, error) {
	if err := c.checkValue(k, size); err != nil {
		return nil, err
	}
	return c.bytes.reserve(ctx, k, size)
}

// Remove deletes the block under k. Errors: ErrNotFound,
// ErrInvalidArgument, ErrFailedPrecondition (under a read lease),
// ErrUnavailable.
func (c *Client) Remove(ctx context.Context, k BlockKey) error { return c.removeOne(ctx, k, false) }

// RemoveForce removes a block even under a read lease.
func (c *Client) RemoveForce(ctx context.Context, k BlockKey) error {
	return c.removeOne(ctx, k, true)
}

func (c *Client) removeOne(ctx context.Context, k BlockKey, force bool) error {
	if err := k.Validate(); err != nil {
		return err
	}
	errs, err := c.bytes.remove(ctx, k.Tenant, k.Namespace, [][]byte{k.Key}, force)
	if err != nil {
		return err
	}
	return errs[0]
}

// RemoveMany deletes the blocks under keys and returns how many it
// removed; keys the node does not hold are skipped. On the data channel
// and shared memory the removals are pipelined: one round trip per 256
// keys.
func (c *Client) RemoveMany(ctx context.Context, tenant, namespace string, keys [][]byte) (int, error) {
	for _, k := range keys {
		if err := (BlockKey{Tenant: tenant, Namespace: namespace, Key: k}).Validate(); err != nil {
			return 0, err
		}
	}
	errs, err := c.bytes.remove(ctx, tenant, namespace, keys, false)
	removed := 0
	for _, e := range errs {
		switch {
		case e == nil:
			removed++
		case !errors.Is(e, ErrNotFound) && err == nil:
			err = e
		}
	}
	return removed, err
}

// View is a block pinned in the node's shared memory. Its bytes are read in
// place, with no copy, until Close. An engine can register them with its
// accelerator and DMA from them directly.
type View struct {
	s      *shmPath // nil for a copy (paths without shared memory)
	handle uint64
	offset int64
	mem    []byte
	crc    uint32
	once   sync.Once
}

// Bytes returns the block. They MUST NOT be written, and MUST NOT be used
// after Close (or after the Client's Close).
func (v *View) Bytes() []byte { return v.mem }

// CRC returns the checksum the node stored with the block.
func (v *View) CRC() uint32 { return v.crc }

// Verify checks the bytes against the stored checksum.
func (v *View) Verify() error {
	if crc := Checksum(v.mem); crc != v.crc {
		return fmt.Errorf("%w: client: shared block has CRC %08x, the node stored %08x", ErrDataLoss, crc, v.crc)
	}
	return nil
}

// Close releases the pin: the node learns of it with the client's next
// request, or within a millisecond when there is none. It is idempotent.
func (v *View) Close() {
	v.once.Do(func() {
		if v.s != nil {
			v.s.release(v.handle)
			if v.s.views.Add(-1) == 0 && v.s.viewClosed != nil {
				v.s.viewClosed()
			}
		}
	})
}

// Reservation is space for a new block. Without shared memory it is a
// private buffer that Commit puts over the client's path.
type Reservation struct {
	path   bytePath
	s      *shmPath // set for a reservation in the node's segment
	k      BlockKey
	handle uint64
	mem    []byte
	done   bool
}

// Bytes is where the block's value must be written, in full, before
// Commit. It MUST NOT be used after Commit or Abort.
func (r *Reservation) Bytes() []byte { return r.mem }

// Commit publishes the reservation as a block, with the checksum of its
// bytes taken here, where they are still in cache.
func (r *Reservation) Commit(ctx context.Context) (PutResult, error) {
	if r.done {
		return PutResult{}, fmt.Errorf("%w: reservation already ended", ErrFailedPrecondition)
	}
	r.done = true
	if r.s == nil {
		return r.path.put(ctx, r.k, r.mem, 0)
	}
	var crc uint32
	if err := r.s.mapped(func() error { crc = Checksum(r.mem); return nil }); err != nil {
		return PutResult{}, err
	}
	return r.s.commit(ctx, r.handle, 0, crc, nil, 0, false)
}

// Abort gives the space back. It is a no-op after Commit or Abort.
func (r *Reservation) Abort() {
	if r.done {
		return
	}
	r.done = true
	if r.s != nil {
		r.s.abort(r.handle)
	}
}

var errShortBuffer = fmt.Errorf("%w: buffer too small", ErrInvalidArgument)

func shortBuffer(have int, need uint64) error {
	return fmt.Errorf("%w: %d bytes for a %d-byte block", errShortBuffer, have, need)
}

// ioError classifies a failed socket operation: the caller's context
// error when it ended, else Unavailable.
func ioError(ctx context.Context, what string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("client: %s: %w", what, cerr)
	}
	return fmt.Errorf("%w: client: %s: %v", ErrUnavailable, what, err)
}

// isRemote reports whether err came from the node (the connection is
// fine) rather than from the connection.
func isRemote(err error) bool {
	var re *RemoteError
	return errors.As(err, &re)
}

// wireConfig makes the data channel report node errors through the one
// table (FromCode), as every other edge does.
var wireConfig = wire.ConnConfig{Status: FromWireStatus}

func keyRequest(op wire.Op, k BlockKey) wire.Request {
	return wire.Request{Op: op, Tenant: []byte(k.Tenant), Namespace: []byte(k.Namespace), Key: k.Key}
}

// RecvChunkBytes is how much of a value a receiver (client Get, node Put)
// reads from the socket before checksumming it: small enough that the CRC
// finds the bytes in L1/L2 right after the kernel wrote them. Measured on
// 2 MiB values with one client (bench --rounds 3): 64 KiB gives 0.95× the
// raw-TCP baseline for Get and 1.07× for Put; 256 KiB gives 0.86–0.90×
// and 0.95×; 32 KiB costs too many syscalls (0.78–0.82× for Get).
const RecvChunkBytes = 64 << 10

// ReadChecksummed fills dst from r in pieces of RecvChunkBytes and returns
// the CRC-32C of what it read, computed piece by piece while the bytes are
// in cache. A stream that ends early is io.ErrUnexpectedEOF.
func ReadChecksummed(r io.Reader, dst []byte) (uint32, error) {
	var crc uint32
	for off := 0; off < len(dst); {
		k, err := r.Read(dst[off:min(off+RecvChunkBytes, len(dst))])
		crc = ChecksumArrived(crc, dst, off, off+k)
		off += k
		if err != nil && off < len(dst) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
	}
	return crc, nil
}

// asyncChecksumBytes is the size from which checksumAsync uses a helper
// goroutine: below it the handoff costs more than it hides.
const asyncChecksumBytes = 256 << 10

// checksumAsync starts the CRC-32C of b and returns a func that waits for
// it. b MUST NOT change until then.
func checksumAsync(b []byte) func() uint32 {
	if len(b) < asyncChecksumBytes {
		crc := Checksum(b)
		return func() uint32 { return crc }
	}
	ch := make(chan uint32, 1)
	go func() { ch <- Checksum(b) }()
	return func() uint32 { return <-ch }
}
