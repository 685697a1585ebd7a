package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api/wire"
)

// shmClient is a client's attachment to a same-host node: the node's
// segment mapped into this process and one unix-socket session that pins
// blocks and holds reservations. Metadata round trips on the session are
// serialized by mu; copies of block bytes run outside it, in parallel.
type shmClient struct {
	mem    []byte
	nodeID string
	// versions mirrors pool.Store.versions (read-only): for each page, the
	// pin handle of the live block starting there, or 0.
	versions    []uint64
	versionsMap []byte
	pageBytes   uint64
	// cache remembers where blocks this client has read live, so a repeat
	// Get copies straight from the segment with no round trip. versions
	// guards it like a seqlock: a hit counts only if the block's word
	// holds the same handle before and after the copy.
	cacheMu sync.RWMutex
	cache   map[string]location
	noCache bool

	mu     sync.Mutex
	d      *dataConn
	broken error // set once the session fails; later calls fail fast
	closed atomic.Bool
	// pending are pin handles released by the caller but not yet sent:
	// they ride in front of the next request, or go out on their own
	// after releaseDelay. Waking the node's process once per Get instead
	// of twice is worth about a third of a 2 MiB copy.
	pending []uint64
	flusher *time.Timer
}

// location is a cached block: its place in the segment, its checksum and
// the pin handle the node gave it (the value of its versions word).
type location struct {
	offset, size uint64
	crc          uint32
	handle       uint64
}

// maxCachedLocations bounds the location cache; it is cleared when full.
const maxCachedLocations = 1 << 16

// releaseDelay bounds how long a released pin may stay held on the node
// while the client is idle.
const releaseDelay = time.Millisecond

func (c *Client) attachShm(ctx context.Context) (*shmClient, error) {
	path := c.info.GetShmSocket()
	switch {
	case path == "":
		return nil, fmt.Errorf("%w: client: node %s offers no shared memory", ErrUnavailable, c.info.GetNodeId())
	case c.info.GetHostId() != HostID():
		return nil, fmt.Errorf("%w: client: node %s is on another host", ErrUnavailable, c.info.GetNodeId())
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("%w: client: shm socket %s: %v", ErrUnavailable, path, err)
	}
	uc := nc.(*net.UnixConn)
	s, err := readHello(uc, c.info.GetNodeId())
	if err != nil {
		uc.Close()
		return nil, err
	}
	s.d = newDataConn(uc)
	return s, nil
}

// readHello receives the node's Hello and the segment's descriptor, and
// maps the segment.
func readHello(uc *net.UnixConn, wantNode string) (*shmClient, error) {
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(8))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("%w: client: shm hello: %v", ErrUnavailable, err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("%w: client: shm hello carried no descriptor", ErrUnavailable)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	for _, fd := range fds {
		defer unix.Close(fd) // the mappings outlive the descriptors
	}
	if err != nil || len(fds) != 2 {
		return nil, fmt.Errorf("%w: client: shm hello carried %d descriptors, want 2", ErrUnavailable, len(fds))
	}
	fd, verFD := fds[0], fds[1]
	var h wire.Hello
	if err := wire.DecodeHello(buf[:n], &h); err != nil {
		return nil, fmt.Errorf("%w: client: %v", ErrUnavailable, err)
	}
	if h.NodeID != wantNode {
		return nil, fmt.Errorf("%w: client: shm socket belongs to node %q, not %q", ErrUnavailable, h.NodeID, wantNode)
	}
	if h.PageBytes == 0 || h.VersionWords != h.SegmentBytes/uint64(h.PageBytes) {
		return nil, fmt.Errorf("%w: client: hello: %d version words for %d pages", ErrUnavailable, h.VersionWords, h.SegmentBytes/uint64(max(h.PageBytes, 1)))
	}
	mem, err := unix.Mmap(fd, 0, int(h.SegmentBytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%w: client: map segment of %d bytes: %v", ErrUnavailable, h.SegmentBytes, err)
	}
	verBytes := int(h.VersionWords*8+4095) &^ 4095
	vmem, err := unix.Mmap(verFD, 0, verBytes, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("%w: client: map version words: %v", ErrUnavailable, err)
	}
	return &shmClient{
		mem:         mem,
		nodeID:      h.NodeID,
		versions:    unsafe.Slice((*uint64)(unsafe.Pointer(&vmem[0])), h.VersionWords),
		versionsMap: vmem,
		pageBytes:   uint64(h.PageBytes),
		cache:       map[string]location{},
	}, nil
}

func (s *shmClient) close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.flusher != nil {
		s.flusher.Stop()
	}
	err := s.d.c.Close()
	if uerr := unix.Munmap(s.mem); uerr != nil {
		err = errors.Join(err, uerr)
	}
	if uerr := unix.Munmap(s.versionsMap); uerr != nil {
		err = errors.Join(err, uerr)
	}
	return err
}

// roundTrip sends r and reads its response, with the session lock held.
func (s *shmClient) roundTrip(ctx context.Context, r *wire.Request) (wire.Response, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return wire.Response{}, s.broken
	}
	if s.closed.Load() {
		return wire.Response{}, fmt.Errorf("%w: client is closed", ErrUnavailable)
	}
	stop := s.d.bind(ctx)
	defer stop()
	s.d.buf = s.appendReleasesLocked(s.d.buf[:0])
	s.d.buf = wire.AppendRequest(s.d.buf, r)
	if _, err := s.d.c.Write(s.d.buf); err != nil {
		s.broken = ioError(ctx, "shm "+r.Op.String(), err)
		return wire.Response{}, s.broken
	}
	if err := wire.ReadResponse(s.d.br, &s.d.resp); err != nil {
		s.broken = ioError(ctx, "shm "+r.Op.String(), err)
		return wire.Response{}, s.broken
	}
	return s.d.resp, FromCode(codes.Code(s.d.resp.Status), s.d.resp.Message)
}

// appendReleasesLocked appends a release frame for every pending pin.
// REQUIRES: s.mu.
func (s *shmClient) appendReleasesLocked(b []byte) []byte {
	for _, h := range s.pending {
		b = wire.AppendRequest(b, &wire.Request{Op: wire.OpRelease, Handle: h})
	}
	s.pending = s.pending[:0]
	return b
}

// release queues a pin's release; see pending.
func (s *shmClient) release(h uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil || s.closed.Load() {
		return // the node frees what the session held when it closes
	}
	s.pending = append(s.pending, h)
	if s.flusher == nil {
		s.flusher = time.AfterFunc(releaseDelay, s.flush)
	} else {
		s.flusher.Reset(releaseDelay)
	}
}

// flush sends pending releases now.
func (s *shmClient) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pending) == 0 || s.broken != nil || s.closed.Load() {
		return
	}
	s.d.c.SetDeadline(time.Time{})
	if _, err := s.d.c.Write(s.appendReleasesLocked(s.d.buf[:0])); err != nil {
		s.broken = fmt.Errorf("%w: client: shm release: %v", ErrUnavailable, err)
	}
}

// notify sends a request that has no response (abort), with any pending
// releases in front of it.
func (s *shmClient) notify(r *wire.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil || s.closed.Load() {
		return // the node frees what the session held when it closes
	}
	s.d.c.SetDeadline(time.Time{})
	s.d.buf = wire.AppendRequest(s.appendReleasesLocked(s.d.buf[:0]), r)
	if _, err := s.d.c.Write(s.d.buf); err != nil {
		s.broken = fmt.Errorf("%w: client: shm %v: %v", ErrUnavailable, r.Op, err)
	}
}

// region returns the mapped bytes [off, off+n), checking the node's reply.
func (s *shmClient) region(off, n uint64) ([]byte, error) {
	if off > uint64(len(s.mem)) || n > uint64(len(s.mem))-off {
		return nil, fmt.Errorf("%w: client: node named bytes [%d, +%d) outside its %d-byte segment", ErrInternal, off, n, len(s.mem))
	}
	return s.mem[off : off+n : off+n], nil
}

// View is a block pinned in the node's shared memory. Its bytes are read in
// place, with no copy, until Close. An engine can register them with its
// accelerator and DMA from them directly.
type View struct {
	s      *shmClient
	handle uint64
	offset int64
	mem    []byte
	crc    uint32
	once   sync.Once
}

// Bytes returns the block. They MUST NOT be written, and MUST NOT be used
// after Close.
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
		}
	})
}

// View pins the block under k and returns its bytes in place. Without the
// shared-memory path it falls back to a copy (GetValue), so callers can use
// one code path everywhere. Callers MUST Close the view.
func (c *Client) View(ctx context.Context, k BlockKey) (*View, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	if c.path != PathShm {
		v, err := c.GetValue(ctx, k)
		if err != nil {
			return nil, err
		}
		return &View{mem: v, crc: Checksum(v)}, nil
	}
	return c.shm.view(ctx, k)
}

func (s *shmClient) view(ctx context.Context, k BlockKey) (*View, error) {
	r := keyRequest(wire.OpView, k)
	resp, err := s.roundTrip(ctx, &r)
	if err != nil {
		return nil, err
	}
	v := &View{s: s, handle: resp.Handle, offset: int64(resp.Offset), crc: resp.CRC}
	if v.mem, err = s.region(resp.Offset, resp.ValueLen); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}

func (s *shmClient) get(ctx context.Context, k BlockKey, dst []byte, alloc, verify bool) ([]byte, error) {
	var kb [2*MaxNameBytes + MaxKeyBytes + 2]byte
	ck := append(append(append(append(append(kb[:0], k.Tenant...), 0), k.Namespace...), 0), k.Key...)
	if !s.noCache {
		if v, ok, err := s.getCached(ck, k, dst, alloc, verify); ok || err != nil {
			return v, err
		}
	}
	v, err := s.view(ctx, k)
	if err != nil {
		return nil, err
	}
	defer v.Close()
	out, err := s.copyOut(k, v.mem, v.crc, dst, alloc, verify)
	if err == nil && !s.noCache {
		s.remember(string(ck), location{offset: uint64(v.offset), size: uint64(len(v.mem)), crc: v.crc, handle: v.handle})
	}
	return out, err
}

// getCached serves k from the location cache. ok is false on a miss (or a
// block that changed), and the caller asks the node.
func (s *shmClient) getCached(ck []byte, k BlockKey, dst []byte, alloc, verify bool) ([]byte, bool, error) {
	s.cacheMu.RLock()
	loc, hit := s.cache[string(ck)]
	s.cacheMu.RUnlock()
	if !hit {
		return nil, false, nil
	}
	word := &s.versions[loc.offset/s.pageBytes]
	if atomic.LoadUint64(word) != loc.handle {
		s.forget(ck)
		return nil, false, nil
	}
	if !alloc && uint64(len(dst)) < loc.size {
		return nil, true, fmt.Errorf("%w: %d bytes for a %d-byte block", errShortBuffer, len(dst), loc.size)
	}
	out, err := s.copyOut(k, s.mem[loc.offset:loc.offset+loc.size], loc.crc, dst, alloc, verify)
	// The node clears the word before the block's pages can be reused,
	// so an unchanged word means the copy saw only this block's bytes.
	if atomic.LoadUint64(word) != loc.handle {
		s.forget(ck)
		return nil, false, nil
	}
	return out, true, err
}

func (s *shmClient) remember(ck string, loc location) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	if len(s.cache) >= maxCachedLocations {
		clear(s.cache)
	}
	s.cache[ck] = loc
}

func (s *shmClient) forget(ck []byte) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	delete(s.cache, string(ck))
}

// copyOut copies a block's bytes out of the segment, checksumming them
// when verify is set.
func (s *shmClient) copyOut(k BlockKey, src []byte, want uint32, dst []byte, alloc, verify bool) ([]byte, error) {
	if alloc {
		dst = make([]byte, len(src))
	}
	if len(dst) < len(src) {
		return nil, fmt.Errorf("%w: %d bytes for a %d-byte block", errShortBuffer, len(dst), len(src))
	}
	dst = dst[:len(src)]
	if !verify {
		copy(dst, src)
		return dst, nil
	}
	// Checksum each piece right after copying it, while it is in cache.
	var crc uint32
	for off := 0; off < len(dst); off += 64 << 10 {
		end := min(off+64<<10, len(dst))
		copy(dst[off:end], src[off:end])
		crc = UpdateChecksum(crc, dst[off:end])
	}
	if crc != want {
		return nil, fmt.Errorf("%w: client: %s: shared block has CRC %08x, the node stored %08x", ErrDataLoss, k, crc, want)
	}
	return dst, nil
}

// Reservation is space for a new block. Without shared memory it is a
// private buffer that Commit sends with Put.
type Reservation struct {
	c      *Client
	s      *shmClient
	k      BlockKey
	handle uint64
	mem    []byte
	done   bool
}

// Bytes is where the block's value must be written, in full, before
// Commit. It MUST NOT be used after Commit or Abort.
func (r *Reservation) Bytes() []byte { return r.mem }

// Reserve reserves size bytes for the block k. On the shared-memory path
// the bytes are the block's final place in the node's segment, so an
// engine can DMA straight into them. Callers MUST Commit or Abort; a
// reservation left open is reclaimed by the node after its timeout.
func (c *Client) Reserve(ctx context.Context, k BlockKey, size int) (*Reservation, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("%w: reserve %d bytes", ErrInvalidArgument, size)
	}
	if c.path != PathShm {
		if uint64(size) > c.info.GetMaxBlockBytes() {
			return nil, fmt.Errorf("%w: %d bytes exceed the node's max block size of %d", ErrInvalidArgument, size, c.info.GetMaxBlockBytes())
		}
		return &Reservation{c: c, k: k, mem: make([]byte, size)}, nil
	}
	r := keyRequest(wire.OpReserve, k)
	r.ValueLen = uint64(size)
	resp, err := c.shm.roundTrip(ctx, &r)
	if err != nil {
		return nil, err
	}
	res := &Reservation{c: c, s: c.shm, k: k, handle: resp.Handle}
	if res.mem, err = c.shm.region(resp.Offset, uint64(size)); err != nil {
		res.Abort()
		return nil, err
	}
	return res, nil
}

// Commit publishes the reservation as a block; the node checksums it.
func (r *Reservation) Commit(ctx context.Context) (PutResult, error) {
	if r.done {
		return PutResult{}, fmt.Errorf("%w: reservation already ended", ErrFailedPrecondition)
	}
	r.done = true
	if r.s == nil {
		return r.c.put(ctx, r.k, r.mem)
	}
	resp, err := r.s.roundTrip(ctx, &wire.Request{Op: wire.OpCommit, Handle: r.handle})
	if err != nil {
		return PutResult{}, err
	}
	return PutResult{Existed: resp.Flags&wire.FlagExisted != 0, CRC: resp.CRC}, nil
}

// Abort gives the space back. It is a no-op after Commit or Abort.
func (r *Reservation) Abort() {
	if r.done {
		return
	}
	r.done = true
	if r.s != nil {
		r.s.notify(&wire.Request{Op: wire.OpAbort, Handle: r.handle})
	}
}

func (s *shmClient) put(ctx context.Context, k BlockKey, value []byte) (PutResult, error) {
	if len(value) == 0 {
		return PutResult{}, fmt.Errorf("%w: empty value", ErrInvalidArgument)
	}
	r := keyRequest(wire.OpReserve, k)
	r.ValueLen = uint64(len(value))
	resp, err := s.roundTrip(ctx, &r)
	if err != nil {
		return PutResult{}, err
	}
	mem, err := s.region(resp.Offset, uint64(len(value)))
	if err != nil {
		s.notify(&wire.Request{Op: wire.OpAbort, Handle: resp.Handle})
		return PutResult{}, err
	}
	copy(mem, value)
	resp, err = s.roundTrip(ctx, &wire.Request{Op: wire.OpCommit, Handle: resp.Handle})
	if err != nil {
		return PutResult{}, err
	}
	return PutResult{Existed: resp.Flags&wire.FlagExisted != 0, CRC: resp.CRC}, nil
}
