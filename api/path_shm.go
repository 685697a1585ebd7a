package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api/internal/crc32c"
	"github.com/kvpool/kvpool/api/internal/seqlock"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/api/wire"
)

// shmPath is a client's attachment to a same-host node: the node's segment
// mapped into this process and one unix-socket session (a data-channel
// Conn) that pins blocks and holds reservations. Metadata round trips on
// the session are serialized by mu; copies of block bytes run outside it,
// in parallel.
type shmPath struct {
	nodeID    string
	pageBytes uint64
	verify    bool // checksum every copy out of the segment
	noCache   bool
	// reserveAhead: the node takes FlagReserveNext and named commits
	// (InfoResponse.reserve_ahead); an older node refuses them.
	reserveAhead bool
	// reserveSpares: the node keeps maxSpares spares for a session and
	// takes FlagReserveNext on a Reserve (InfoResponse.session_spares),
	// with which a write-behind writer asks for the spares beyond the one
	// each commit brings.
	reserveSpares bool

	// live guards the mapping: every copy in or out of the segment holds
	// it for reading, and close takes it for writing before unmapping, so
	// a Close waits for the copies in flight and later calls fail with
	// ErrUnavailable instead of faulting.
	live struct {
		sync.RWMutex
		unmapped bool
	}
	mem []byte
	// versions mirrors the node store's version words (read-only): for
	// each page, the pin handle of the live block starting there, or 0.
	versions    []uint64
	versionsMap []byte

	// cache remembers where blocks this client has read live, so a repeat
	// Get copies straight from the segment with no round trip. versions
	// guards it like a seqlock (package seqlock): a hit counts only if the
	// block's word holds the same handle before and after the copy.
	cacheMu sync.RWMutex
	cache   map[string]location

	mu   sync.Mutex
	conn *wire.Conn
	// mboxMem maps the session's mailbox (wire.Mailbox, which conn
	// uses); nil when the node offers none or the client declined it.
	mboxMem []byte
	broken  error // set once the session fails; later calls fail fast
	closed  bool
	// pending are pin handles released by the caller but not yet sent:
	// they ride in front of the next request, or go out on their own
	// after releaseDelay. Waking the node's process once per Get instead
	// of twice is worth about a third of a 2 MiB copy.
	pending []uint64
	flusher *time.Timer
	// stopPrefault ends prefaultMapping, which closes prefaulted.
	stopPrefault chan struct{}
	prefaulted   chan struct{}
	// spares are reservations the node made ahead of this session's next
	// puts (wire.FlagReserveNext), oldest first: one for puts that wait
	// for their commits, up to WriteBehindSpares for write-behind puts
	// (putBehind), which copy into them while the node commits.
	spares []spare
	// behind are the write-behind puts whose commits are in the post in
	// flight, queued those whose commits wait for the next post (see
	// putBehind); behindErrs are the failures of those answered since the
	// last flushBehind, behindLost how many more there were than it
	// keeps.
	behind       []behindPut
	behindSpares int // spares asked for in the post in flight
	queued       []behindPut
	behindErrs   []error
	behindLost   int
	// putErr is where the putBehind holding mu has the failure of its
	// own put reported (behindPut.report), while it waits for it.
	putErr error
	// views counts the views taken and not closed: a path replaced after
	// its node restarted stays mapped while any is open (reattachingShm),
	// and viewClosed hears when one closes.
	views      atomic.Int64
	viewClosed func()
}

// isBroken reports whether the session with the node has ended.
func (s *shmPath) isBroken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.broken != nil
}

// spare is a reservation reserved ahead: a put of its size into its tenant
// and namespace copies straight into it and names the block as it commits,
// one round trip instead of two (reserve, commit). The node keeps it for
// the session (no reservation timeout) until it is used, aborted, or the
// session ends.
type spare struct {
	tenant, namespace string
	size              int
	handle, offset    uint64
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

func attachShm(ctx context.Context, info *kvpoolv1.InfoResponse, cfg ClientConfig, wc wire.ConnConfig) (*shmPath, error) {
	path := info.GetShmSocket()
	switch {
	case path == "":
		return nil, fmt.Errorf("%w: client: node %s offers no shared memory", ErrUnavailable, info.GetNodeId())
	case info.GetHostId() != HostID():
		return nil, fmt.Errorf("%w: client: node %s is on another host", ErrUnavailable, info.GetNodeId())
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("%w: client: shm socket %s: %v", ErrUnavailable, path, err)
	}
	uc := nc.(*net.UnixConn)
	s, err := readHello(uc, info.GetNodeId())
	if err != nil {
		uc.Close()
		return nil, err
	}
	s.conn = wire.NewConn(uc, wc)
	// Without a load fence on this architecture the cache's seqlock
	// cannot rule out a torn copy: every cached copy is then verified.
	s.verify = cfg.VerifySharedReads || !seqlock.Fenced
	s.noCache = cfg.NoLocationCache
	s.reserveAhead = info.GetReserveAhead()
	s.reserveSpares = s.reserveAhead && info.GetSessionSpares() >= maxSpares
	s.stopPrefault, s.prefaulted = make(chan struct{}), make(chan struct{})
	if cfg.MapLazily {
		close(s.prefaulted)
	} else {
		go s.prefaultMapping(s.stopPrefault, s.prefaulted)
	}
	if info.GetShmMailbox() && !cfg.NoShmMailbox {
		if err := s.openMailbox(ctx, uc, !cfg.NoLocalServe); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

// readHello receives the node's Hello and the segment's descriptors, and
// maps the segment and its version words.
func readHello(uc *net.UnixConn, wantNode string) (*shmPath, error) {
	var h wire.Hello
	fds, err := wire.ReceiveHello(uc, &h, 2)
	if err != nil {
		return nil, fmt.Errorf("%w: client: shm hello: %v", ErrUnavailable, err)
	}
	for _, fd := range fds {
		defer unix.Close(fd) // the mappings outlive the descriptors
	}
	fd, verFD := fds[0], fds[1]
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
	vmem, err := unix.Mmap(verFD, 0, int(wire.VersionSegmentBytes(h.VersionWords)), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("%w: client: map version words: %v", ErrUnavailable, err)
	}
	return &shmPath{
		mem:         mem,
		nodeID:      h.NodeID,
		versions:    unsafe.Slice((*uint64)(unsafe.Pointer(&vmem[0])), h.VersionWords),
		versionsMap: vmem,
		pageBytes:   uint64(h.PageBytes),
		cache:       map[string]location{},
	}, nil
}

var errClientClosed = fmt.Errorf("%w: client is closed", ErrUnavailable)

func (s *shmPath) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	// A write-behind commit in flight is settled first: closing the
	// socket before the node took the post would drop it.
	ctx, cancel := context.WithTimeout(context.Background(), closeSettleTimeout)
	s.drainLocked(ctx)
	cancel()
	err := s.takeBehindErrsLocked()
	s.closed = true
	if s.flusher != nil {
		s.flusher.Stop()
	}
	err = errors.Join(err, s.conn.Close())
	if s.mboxMem != nil {
		// The node may still write its last answer: the mapping is
		// shared, so that lands in pages nobody reads.
		if uerr := unix.Munmap(s.mboxMem); uerr != nil {
			err = errors.Join(err, uerr)
		}
		s.mboxMem = nil
	}
	s.mu.Unlock()
	close(s.stopPrefault)
	<-s.prefaulted
	// Wait for copies in flight, then unmap.
	s.live.Lock()
	defer s.live.Unlock()
	s.live.unmapped = true
	if uerr := unix.Munmap(s.mem); uerr != nil {
		err = errors.Join(err, uerr)
	}
	if uerr := unix.Munmap(s.versionsMap); uerr != nil {
		err = errors.Join(err, uerr)
	}
	return err
}

// closeSettleTimeout bounds how long close waits for the answer to a
// write-behind commit in flight.
const closeSettleTimeout = 5 * time.Second

// usableLocked reports why the session cannot take a request, or nil.
// REQUIRES: s.mu.
func (s *shmPath) usableLocked() error {
	switch {
	case s.broken != nil:
		return s.broken
	case s.closed:
		return errClientClosed
	}
	return nil
}

// roundTrip sends r, after any pending releases, and reads its response,
// with the session lock held.
func (s *shmPath) roundTrip(ctx context.Context, r *wire.Request) (wire.Response, error) {
	var out wire.Response
	err := s.session(ctx, func(c *wire.Conn) error {
		resp, err := c.RoundTrip(ctx, r)
		if resp == nil {
			return ioError(ctx, "shm "+r.Op.String(), err)
		}
		out = *resp
		return err
	})
	return out, err
}

// openMailbox makes the session's mailbox, a sealed memfd, and hands it
// to the node (wire.OpMailbox). A node that declines it leaves the
// session on its socket; a session that broke is an error. With serve
// set, a node in this process (its answer's token finds it; see
// wire.LocalServer) has the session serve its posts in the caller's
// goroutine.
func (s *shmPath) openMailbox(ctx context.Context, uc *net.UnixConn, serve bool) error {
	fd, err := unix.MemfdCreate("kvpool-mailbox", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil // no memfds here: the socket serves
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, wire.MailboxBytes); err != nil {
		return nil
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return nil
	}
	mem, err := unix.Mmap(fd, 0, wire.MailboxBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil
	}
	kept := false
	defer func() {
		if !kept {
			unix.Munmap(mem)
		}
	}()
	mb, err := wire.NewMailbox(mem)
	if err != nil {
		return nil
	}
	defer s.conn.Bind(ctx)()
	req := wire.Request{Op: wire.OpMailbox}
	if serve && wire.PeerIsThisProcess(uc) {
		req.Flags = wire.FlagServeLocally
	}
	frame := wire.AppendRequest(nil, &req)
	_, _, err = uc.WriteMsgUnix(frame, unix.UnixRights(fd), nil)
	var token uint64
	if err == nil {
		var resp *wire.Response
		if resp, err = s.conn.Recv(); resp != nil {
			token = resp.Handle
		}
	}
	switch {
	case err == nil:
		kept, s.mboxMem = true, mem
		s.conn.UseMailbox(mb)
		if req.Flags&wire.FlagServeLocally != 0 {
			local := wire.LookupLocal(token)
			if local == nil {
				// The node in this process agreed and does not watch
				// the mailbox, yet gave no token of this process.
				return fmt.Errorf("%w: client: the node in this process named no session to serve (token %#x)", ErrUnavailable, token)
			}
			s.conn.ServeLocally(local)
		}
		return nil
	case s.conn.Usable():
		return nil // declined: the socket serves
	case isRemote(err):
		// The node refuses this caller and ends the session: every
		// call reports why, as its first request would have.
		s.broken = err
		return nil
	}
	return ioError(ctx, "shm mailbox", err)
}

// queueReleasesLocked queues a release frame for every pending pin.
// REQUIRES: s.mu.
func (s *shmPath) queueReleasesLocked() {
	for _, h := range s.pending {
		s.conn.Queue(&wire.Request{Op: wire.OpRelease, Handle: h})
	}
	s.pending = s.pending[:0]
}

// release queues a pin's release; see pending.
func (s *shmPath) release(h uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.usableLocked() != nil {
		return // the node frees what the session held when it closes
	}
	s.pending = append(s.pending, h)
	s.armFlusherLocked()
}

// armFlusherLocked has flush run releaseDelay from now. REQUIRES: s.mu.
func (s *shmPath) armFlusherLocked() {
	if s.flusher == nil {
		s.flusher = time.AfterFunc(releaseDelay, s.flush)
	} else {
		s.flusher.Reset(releaseDelay)
	}
}

// flush sends pending releases now.
func (s *shmPath) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queued) > 0 && s.usableLocked() == nil {
		// Write-behind commits left queued by a writer that stopped
		// go out now, with the releases.
		ctx, cancel := context.WithTimeout(context.Background(), closeSettleTimeout)
		defer cancel()
		s.settleLocked(ctx)
		s.postQueuedLocked(ctx)
		return
	}
	if len(s.pending) == 0 || s.usableLocked() != nil {
		return
	}
	s.queueReleasesLocked()
	s.conn.NetConn().SetDeadline(time.Time{})
	if err := s.conn.Flush(nil); err != nil {
		s.broken = fmt.Errorf("%w: client: shm release: %v", ErrUnavailable, err)
	}
}

// abort abandons a reservation (no response), with any pending releases
// in front of it.
func (s *shmPath) abort(handle uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.usableLocked() != nil {
		return // the node frees what the session held when it closes
	}
	s.queueReleasesLocked()
	if err := s.conn.Notify(&wire.Request{Op: wire.OpAbort, Handle: handle}, 5*time.Second); err != nil {
		s.broken = fmt.Errorf("%w: client: shm abort: %v", ErrUnavailable, err)
	}
}

// region returns the mapped bytes [off, off+n), checking the node's reply.
func (s *shmPath) region(off, n uint64) ([]byte, error) {
	if off > uint64(len(s.mem)) || n > uint64(len(s.mem))-off {
		return nil, fmt.Errorf("%w: client: node named bytes [%d, +%d) outside its %d-byte segment", ErrInternal, off, n, len(s.mem))
	}
	return s.mem[off : off+n : off+n], nil
}

// mapped runs f with the mapping held (see live), or fails after close.
func (s *shmPath) mapped(f func() error) error {
	s.live.RLock()
	defer s.live.RUnlock()
	if s.live.unmapped {
		return errClientClosed
	}
	return f()
}

// view pins the block and checks its bytes against the node's checksum
// the first time this client sees this version of the block: bytes can
// change behind the node's back (a stray write into the arena, a bad
// DIMM), and a same-host reader must not take them for good. A version it
// read before (the location cache knows its handle) is not read again.
func (s *shmPath) view(ctx context.Context, k BlockKey, l lease) (*View, error) {
	v, err := s.pin(ctx, k, l)
	if err != nil {
		return nil, err
	}
	var kb [cacheKeyBytes]byte
	ck := appendCacheKey(kb[:0], k)
	if !s.noCache {
		s.cacheMu.RLock()
		loc, ok := s.cache[string(ck)]
		s.cacheMu.RUnlock()
		if ok && loc.handle == v.handle {
			return v, nil
		}
	}
	err = s.mapped(func() error {
		if crc := Checksum(v.mem); crc != v.crc {
			return fmt.Errorf("%w: client: %s: shared block has CRC %08x, the node stored %08x", ErrDataLoss, k, crc, v.crc)
		}
		return nil
	})
	if err != nil {
		v.Close()
		return nil, err
	}
	if !s.noCache {
		s.remember(string(ck), location{offset: uint64(v.offset), size: uint64(len(v.mem)), crc: v.crc, handle: v.handle})
	}
	return v, nil
}

// cacheKeyBytes bounds a location-cache key: names, key and separators.
const cacheKeyBytes = 2*MaxNameBytes + MaxKeyBytes + 2

// appendCacheKey appends k's name in the location cache to b: built in a
// caller's stack buffer, it is looked up without allocating.
func appendCacheKey(b []byte, k BlockKey) []byte {
	return append(append(append(append(append(b, k.Tenant...), 0), k.Namespace...), 0), k.Key...)
}

// pin pins the block under k and returns its bytes in place, unchecked.
func (s *shmPath) pin(ctx context.Context, k BlockKey, l lease) (*View, error) {
	r := keyRequest(wire.OpView, k)
	if l.on {
		r.Flags, r.LeaseMs = wire.FlagLease, l.ms
	}
	resp, err := s.roundTrip(ctx, &r)
	if err != nil {
		return nil, err
	}
	v := &View{s: s, handle: resp.Handle, offset: int64(resp.Offset), crc: resp.CRC}
	s.views.Add(1)
	if v.mem, err = s.region(resp.Offset, resp.ValueLen); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}

func (s *shmPath) get(ctx context.Context, k BlockKey, dst []byte, l lease) ([]byte, error) {
	var kb [cacheKeyBytes]byte
	ck := appendCacheKey(kb[:0], k)
	if !s.noCache && !l.on {
		if v, ok, err := s.getCached(ck, k, dst); ok || err != nil {
			return v, err
		}
	}
	v, err := s.pin(ctx, k, l)
	if err != nil {
		return nil, err
	}
	defer v.Close()
	var out []byte
	err = s.mapped(func() (err error) {
		// A read that asked the node checks what it copies (see view);
		// a repeat from the cache relies on that check.
		out, err = s.copyOut(k, v.mem, v.crc, dst, true)
		return err
	})
	if err == nil && !s.noCache {
		s.remember(string(ck), location{offset: uint64(v.offset), size: uint64(len(v.mem)), crc: v.crc, handle: v.handle})
	}
	return out, err
}

// getCached serves k from the location cache. ok is false on a miss (or a
// block that changed), and the caller asks the node.
func (s *shmPath) getCached(ck []byte, k BlockKey, dst []byte) (out []byte, ok bool, err error) {
	s.cacheMu.RLock()
	loc, hit := s.cache[string(ck)]
	s.cacheMu.RUnlock()
	if !hit {
		return nil, false, nil
	}
	if dst != nil && uint64(len(dst)) < loc.size {
		return nil, true, shortBuffer(len(dst), loc.size)
	}
	var copyErr error
	err = s.mapped(func() error {
		// The node clears the word before the block's pages can be
		// reused, so an unchanged word means the copy saw only this
		// block's bytes.
		ok = seqlock.Read(&s.versions[loc.offset/s.pageBytes], loc.handle, func() {
			out, copyErr = s.copyOut(k, s.mem[loc.offset:loc.offset+loc.size], loc.crc, dst, s.verify)
		})
		return nil
	})
	if err == nil && ok {
		err = copyErr // (a torn copy's error is moot: the node is asked)
	}
	if err == nil && !ok {
		s.forget(ck)
		return nil, false, nil
	}
	return out, true, err
}

func (s *shmPath) remember(ck string, loc location) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	if len(s.cache) >= maxCachedLocations {
		clear(s.cache)
	}
	s.cache[ck] = loc
}

func (s *shmPath) forget(ck []byte) {
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	delete(s.cache, string(ck))
}

// copyOut copies a block's bytes out of the segment into dst (a new slice
// when dst is nil), checksumming them when verify is set. REQUIRES: the
// mapping held (mapped).
func (s *shmPath) copyOut(k BlockKey, src []byte, want uint32, dst []byte, verify bool) ([]byte, error) {
	if dst == nil {
		dst = make([]byte, len(src))
	}
	if len(dst) < len(src) {
		return nil, shortBuffer(len(dst), uint64(len(src)))
	}
	dst = dst[:len(src)]
	if !verify {
		copy(dst, src)
		return dst, nil
	}
	// One pass: the checksum is of the bytes as the copy read them.
	if crc := crc32c.Copy(0, dst, src); crc != want {
		return nil, fmt.Errorf("%w: client: %s: shared block has CRC %08x, the node stored %08x", ErrDataLoss, k, crc, want)
	}
	return dst, nil
}

func (s *shmPath) reserve(ctx context.Context, k BlockKey, size int) (*Reservation, error) {
	r := keyRequest(wire.OpReserve, k)
	r.ValueLen = uint64(size)
	resp, err := s.roundTrip(ctx, &r)
	if err != nil {
		return nil, err
	}
	res := &Reservation{path: s, s: s, k: k, handle: resp.Handle}
	if res.mem, err = s.region(resp.Offset, uint64(size)); err != nil {
		res.Abort()
		return nil, err
	}
	return res, nil
}

// commit publishes the reservation handle with crc, the checksum of the
// bytes this client wrote (see wire.FlagWriterChecksum); copies > 1 also
// has the node place copies on other nodes. With next set (a put's
// commit), the node is also asked for the spare of the session's next put
// (of next's tenant, namespace and size), and when named is set the block
// is committed under next's key: the reservation was a spare.
func (s *shmPath) commit(ctx context.Context, handle uint64, copies uint32, crc uint32, next *BlockKey, size int, named bool) (PutResult, error) {
	r := s.commitRequest(handle, crc, next, named)
	r.Replicas = copies
	var out PutResult
	err := s.session(ctx, func(c *wire.Conn) error {
		resp, err := c.RoundTrip(ctx, &r)
		if resp == nil {
			return ioError(ctx, "shm commit", err)
		}
		out = s.committedLocked(resp, err, handle, next, size, named)
		return err
	})
	return out, err
}

// commitRequest is the commit of reservation handle holding bytes of
// checksum crc: with next set, it asks for the spare of the put after it
// (of next's tenant, namespace and size), and with named it commits the
// block under next's key (the reservation was a spare).
func (s *shmPath) commitRequest(handle uint64, crc uint32, next *BlockKey, named bool) wire.Request {
	r := wire.Request{Op: wire.OpCommit, Flags: wire.FlagWriterChecksum, CRC: crc, Handle: handle}
	if next != nil && s.reserveAhead {
		r.Flags |= wire.FlagReserveNext
	}
	if named {
		r.Tenant, r.Namespace, r.Key = []byte(next.Tenant), []byte(next.Namespace), next.Key
	}
	return r
}

// committedLocked takes the answer to a put's commit of handle (see
// commit): it keeps the spare the answer brings and aborts a spare the
// node refused to name. REQUIRES: s.mu.
func (s *shmPath) committedLocked(resp *wire.Response, err error, handle uint64, next *BlockKey, size int, named bool) PutResult {
	if resp.Flags&wire.FlagReserved != 0 {
		s.keepSpareLocked(spare{tenant: next.Tenant, namespace: next.Namespace, size: size, handle: resp.Handle, offset: resp.Offset})
	}
	if err != nil && named {
		// A refused rename leaves the spare open on the node.
		s.conn.Queue(&wire.Request{Op: wire.OpAbort, Handle: handle})
	}
	return PutResult{Existed: resp.Flags&wire.FlagExisted != 0, CRC: resp.CRC}
}

// put writes value in place: reserve (or take the spare reserved ahead),
// copy into the segment, commit, and have the node reserve the next
// put's spare with the commit.
func (s *shmPath) put(ctx context.Context, k BlockKey, value []byte, copies uint32) (PutResult, error) {
	handle, crc, spared, err := s.placeAndCopy(ctx, k, value)
	if err != nil {
		return PutResult{}, err
	}
	return s.commit(ctx, handle, copies, crc, &k, len(value), spared)
}

// placeAndCopy copies value, a put's under k, into its place in the
// segment and returns the place's handle, the checksum and whether the
// place was a spare: the oldest spare that fits, after the write-behind
// commits in flight and queued are answered when the session has none
// (they bring spares), or else a new reservation.
func (s *shmPath) placeAndCopy(ctx context.Context, k BlockKey, value []byte) (handle uint64, crc uint32, spared bool, err error) {
	s.mu.Lock()
	handle, mem, spared := s.takeSpareLocked(k, len(value))
	if !spared && (len(s.behind) > 0 || len(s.queued) > 0) {
		s.drainLocked(ctx)
		handle, mem, spared = s.takeSpareLocked(k, len(value))
	}
	s.mu.Unlock()
	if !spared {
		res, err := s.reserve(ctx, k, len(value))
		if err != nil {
			return 0, 0, false, err
		}
		handle, mem = res.handle, res.mem
	}
	err = s.mapped(func() error { crc = s.copyIn(mem, value, true); return nil })
	return handle, crc, spared, err
}

// behindPut is a write-behind put copied into the segment whose commit
// is not yet answered (see putBehind).
type behindPut struct {
	key    BlockKey
	size   int
	handle uint64
	crc    uint32
	named  bool // the reservation is a spare, committed under key
	// report, when set, is where the put's failure goes instead of the
	// session's kept failures: the call of this put is still running,
	// and returns it.
	report *error
	// batch: a putWindow's block, whose commit asks for no spare.
	batch bool
}

// putBehind puts value under k as put does, except that it returns once
// the value is in the segment and its commit is on its way, not answered:
// the node commits while the writer copies its next value (a write-behind
// put). Commits go out in groups: while one post to the mailbox is in
// flight, later puts' commits wait in the queue and go out together in
// the next post, which the next put (or, when the writer stops, the
// session's flush timer, within releaseDelay) makes once the post in
// flight is answered. A writer waits for the node only when it has no
// spare left to copy into: each commit asks for the next spare, and a
// session short of WriteBehindSpares asks for more. Failures are kept for
// flushBehind. Without a mailbox, or for a client in the node's own
// process, every post is answered before putBehind returns.
func (s *shmPath) putBehind(ctx context.Context, k BlockKey, value []byte) error {
	handle, crc, spared, err := s.placeAndCopy(ctx, k, value)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	// A failure before the commit is posted (the session broke), or of
	// a commit answered at once (no mailbox), is this call's to return,
	// not Flush's: a put that fails here may be retried on a new session.
	// The next put having a place to copy into, the commit may wait in
	// the queue for the next post rather than for this one's answer.
	s.putErr = nil
	b := behindPut{key: k, size: len(value), handle: handle, crc: crc, named: spared, report: &s.putErr}
	if !s.queueCommitLocked(ctx, b, len(s.spares) > 0) {
		s.queued[len(s.queued)-1].report = nil // Flush reports it
		s.armFlusherLocked()
		return nil
	}
	for i := range s.behind {
		if s.behind[i].report == &s.putErr {
			s.behind[i].report = nil // posted: Flush reports what follows
		}
	}
	return s.putErr
}

// queueCommitLocked queues b's commit and, unless mayWait is set and a
// post is in flight with no answer yet, has that post answered and posts
// the queue; it reports whether it posted. REQUIRES: s.mu.
func (s *shmPath) queueCommitLocked(ctx context.Context, b behindPut, mayWait bool) (posted bool) {
	s.queued = append(s.queued, b)
	if inFlight, answered := s.conn.Ahead(); inFlight && !answered && mayWait {
		return false
	}
	s.settleLocked(ctx)
	s.postQueuedLocked(ctx)
	return true
}

// settleLocked waits for the answer to the post of write-behind commits
// in flight, if any (see putBehind), within ctx, takes the spares it
// brings and keeps its failures for flushBehind. REQUIRES: s.mu.
func (s *shmPath) settleLocked(ctx context.Context) {
	puts, spares := s.behind, s.behindSpares
	if len(puts) == 0 && spares == 0 {
		return
	}
	s.behind, s.behindSpares = s.behind[:0], 0
	var err error
	if err = s.usableLocked(); err == nil {
		unbind := s.conn.Bind(ctx)
		if err = s.conn.Settle(); err != nil {
			err = s.breakLocked(err)
		}
		unbind()
	}
	s.answersLocked(puts, spares, err)
}

// postQueuedLocked sends the queued write-behind commits in one post to
// the mailbox, behind any pending releases, with requests for the spares
// the session lacks. REQUIRES: s.mu, no post in flight.
func (s *shmPath) postQueuedLocked(ctx context.Context) {
	puts := s.queued
	if len(puts) == 0 {
		return
	}
	s.queued = s.behind[:0]
	if err := s.usableLocked(); err != nil {
		s.answersLocked(puts, 0, err)
		s.behind = puts[:0]
		return
	}
	s.queueReleasesLocked()
	for i := range puts {
		b := &puts[i]
		next := &b.key
		if b.batch {
			next = nil // a batch's commit asks for no spare
		}
		r := s.commitRequest(b.handle, b.crc, next, b.named)
		s.conn.Queue(&r)
	}
	// Each commit brings the spare of a put to come; ask for the rest.
	spares := 0
	if last := puts[len(puts)-1]; s.reserveSpares && !last.batch {
		for ; len(s.spares)+len(puts)+spares < WriteBehindSpares(last.size); spares++ {
			s.conn.Queue(&wire.Request{Op: wire.OpReserve, Flags: wire.FlagReserveNext, ValueLen: uint64(last.size), Tenant: []byte(last.key.Tenant), Namespace: []byte(last.key.Namespace), Key: last.key.Key})
		}
	}
	defer s.conn.Bind(ctx)()
	// A write-behind put yields its core to the node, whose answer
	// brings its next spares; a batch waits for its answers at its end.
	posted, err := s.conn.PostAhead(!puts[len(puts)-1].batch)
	switch {
	case err != nil:
		s.answersLocked(puts, 0, s.breakLocked(err))
	case posted:
		s.behind, s.behindSpares = puts, spares
		return
	default:
		// Not through the mailbox (there is none, the post is too long
		// for it, or the node is in this process and serves the post
		// in this goroutine): wait, as put does.
		if err := s.conn.Flush(nil); err != nil {
			err = s.breakLocked(err)
		}
		s.answersLocked(puts, spares, err)
	}
	s.behind = puts[:0]
}

// drainLocked settles the post in flight, posts the queued commits and
// settles that post too: every write-behind put is answered. REQUIRES:
// s.mu.
func (s *shmPath) drainLocked(ctx context.Context) {
	s.settleLocked(ctx)
	s.postQueuedLocked(ctx)
	s.settleLocked(ctx)
}

// answersLocked reads the answers to puts' commits, then to the spares
// asked for behind them, keeping the spares and the failures. With err
// set (the session broke before the answers came), each put failed with
// it. REQUIRES: s.mu.
func (s *shmPath) answersLocked(puts []behindPut, spares int, err error) {
	for _, b := range puts {
		if err != nil {
			s.keepBehindErrLocked(b, err)
			continue
		}
		resp, cerr := s.conn.Recv()
		if resp == nil {
			err = s.breakLocked(cerr)
			s.keepBehindErrLocked(b, err)
			continue
		}
		s.committedLocked(resp, cerr, b.handle, &b.key, b.size, b.named)
		if cerr != nil {
			s.keepBehindErrLocked(b, cerr)
		}
	}
	for range spares {
		if err != nil || len(puts) == 0 {
			return
		}
		last := puts[len(puts)-1]
		// A node out of room for a spare refuses it: a later put
		// reserves.
		resp, serr := s.conn.Recv()
		if resp == nil {
			err = s.breakLocked(serr)
		} else if serr == nil && resp.Flags&wire.FlagReserved != 0 {
			s.keepSpareLocked(spare{tenant: last.key.Tenant, namespace: last.key.Namespace, size: last.size, handle: resp.Handle, offset: resp.Offset})
		}
	}
}

// breakLocked marks the session broken by the I/O error err and returns
// the error calls now fail with. REQUIRES: s.mu.
func (s *shmPath) breakLocked(err error) error {
	if s.broken == nil {
		s.broken = fmt.Errorf("%w: client: the shm session with %s ended: %v", ErrUnavailable, s.nodeID, err)
	}
	return s.broken
}

// maxBehindErrs bounds the write-behind failures a session keeps for
// flushBehind; it counts the rest.
const maxBehindErrs = 64

// keepBehindErrLocked keeps the failure of b, a write-behind put, for
// flushBehind, or hands it to the call still running (b.report).
// REQUIRES: s.mu.
func (s *shmPath) keepBehindErrLocked(b behindPut, err error) {
	switch {
	case b.report != nil:
		*b.report = err
	case len(s.behindErrs) >= maxBehindErrs:
		s.behindLost++
	default:
		s.behindErrs = append(s.behindErrs, fmt.Errorf("put %s: %w", b.key, err))
	}
}

// flushBehind has every write-behind commit answered (the post in flight
// and the queued ones), within ctx, and returns the failures of
// write-behind puts since the last flushBehind, joined (nil: every one is
// stored).
func (s *shmPath) flushBehind(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainLocked(ctx)
	return s.takeBehindErrsLocked()
}

// takeBehindErrsLocked returns the kept write-behind failures, joined,
// and forgets them. REQUIRES: s.mu.
func (s *shmPath) takeBehindErrsLocked() error {
	errs := s.behindErrs
	if s.behindLost > 0 {
		errs = append(errs, fmt.Errorf("%d more write-behind puts failed", s.behindLost))
	}
	s.behindErrs, s.behindLost = nil, 0
	return errors.Join(errs...)
}

// putWindowBlocks bounds the blocks of a putMany reserved at once: the
// arena space a batch holds before its commits.
const putWindowBlocks = 64

// putMany puts a batch a window at a time: every reservation of the
// window in one round trip, the copies, every commit in one more.
func (s *shmPath) putMany(ctx context.Context, tenant, namespace string, keys, values [][]byte) ([]error, error) {
	errs := make([]error, len(keys))
	for off := 0; off < len(keys); off += putWindowBlocks {
		end := min(off+putWindowBlocks, len(keys))
		if err := s.putWindow(ctx, []byte(tenant), []byte(namespace), keys[off:end], values[off:end], errs[off:end]); err != nil {
			return errs, err
		}
	}
	return errs, nil
}

func (s *shmPath) putWindow(ctx context.Context, tenant, namespace []byte, keys, values [][]byte, errs []error) error {
	slots := make([]windowSlot, len(keys))
	var ahead bool
	err := s.session(ctx, func(c *wire.Conn) error {
		ahead = c.CanPostAhead()
		defer c.Bind(ctx)()
		for i, k := range keys {
			c.Queue(&wire.Request{Op: wire.OpReserve, ValueLen: uint64(len(values[i])), Tenant: tenant, Namespace: namespace, Key: k})
		}
		if err := c.Flush(nil); err != nil {
			return ioError(ctx, "shm reserve", err)
		}
		for i := range keys {
			resp, err := recv(ctx, c, "shm reserve")
			if err != nil && !isRemote(err) {
				return err
			}
			if errs[i] = err; err != nil {
				continue
			}
			mem, err := s.region(resp.Offset, uint64(len(values[i])))
			if err != nil {
				errs[i] = err
				c.Queue(&wire.Request{Op: wire.OpAbort, Handle: resp.Handle})
				continue
			}
			slots[i] = windowSlot{handle: resp.Handle, mem: mem}
		}
		return nil
	})
	if err != nil {
		return err // the session is broken: the node frees what it held
	}
	if ahead {
		return s.copyAndCommitAhead(ctx, keys, values, slots, errs)
	}
	// The copies run outside the session lock, as a Put's do.
	if err := s.mapped(func() error {
		last := len(slots) - 1
		for last > 0 && slots[last].handle == 0 {
			last--
		}
		for i := range slots {
			if slots[i].handle != 0 {
				slots[i].crc = s.copyIn(slots[i].mem, values[i], i == last)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if !slices.ContainsFunc(slots, func(sl windowSlot) bool { return sl.handle != 0 }) {
		return nil
	}
	return s.session(ctx, func(c *wire.Conn) error {
		defer c.Bind(ctx)()
		for _, sl := range slots {
			if sl.handle != 0 {
				c.Queue(&wire.Request{Op: wire.OpCommit, Flags: wire.FlagWriterChecksum, CRC: sl.crc, Handle: sl.handle})
			}
		}
		if err := c.Flush(nil); err != nil {
			return ioError(ctx, "shm commit", err)
		}
		for i, sl := range slots {
			if sl.handle == 0 {
				continue
			}
			_, err := recv(ctx, c, "shm commit")
			if err != nil && !isRemote(err) {
				return err
			}
			errs[i] = err
		}
		return nil
	})
}

// windowSlot is a putWindow's block's reservation (handle 0: none) and
// the checksum of what was copied into it.
type windowSlot struct {
	handle uint64
	mem    []byte
	crc    uint32
}

// copyAndCommitAhead copies a window's blocks into their reservations and
// posts each block's commit as soon as its copy is done and no post is in
// flight (queued until then, and posted together), so the node commits
// while the writer copies on; then it waits for every answer, and each
// block's error lands in errs. For a session whose posts can go ahead
// (wire.Conn.CanPostAhead): one client's batches of 16 2 MiB blocks to a
// node in another process went from 0.71-0.73 of memcpy to 0.80-0.84,
// four clients' batches moved as many bytes as before.
func (s *shmPath) copyAndCommitAhead(ctx context.Context, keys, values [][]byte, slots []windowSlot, errs []error) error {
	last := len(slots) - 1
	for last > 0 && slots[last].handle == 0 {
		last--
	}
	var err error
	for i, sl := range slots {
		if sl.handle == 0 {
			continue
		}
		var crc uint32
		if err = s.mapped(func() error { crc = s.copyIn(sl.mem, values[i], i == last); return nil }); err != nil {
			break
		}
		s.mu.Lock()
		// The key only names the block; its errors go to errs[i].
		s.queueCommitLocked(ctx, behindPut{key: BlockKey{Key: keys[i]}, size: len(values[i]), handle: sl.handle, crc: crc, report: &errs[i], batch: true}, true)
		s.mu.Unlock()
	}
	// Every report is written before errs is returned.
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drainLocked(ctx)
	if err == nil {
		err = s.broken
	}
	return err
}

// copyIn copies src into a place in the segment and returns its checksum,
// folded from the registers the copy loads: no second pass over src, no
// second core. With last (the copy a commit follows) it wakes a parked
// node wakeAheadBytes before the end (wakeAhead), when the copy is long
// enough to hide some of the wake-up. REQUIRES: s.live held.
func (s *shmPath) copyIn(dst, src []byte, last bool) uint32 {
	if !last || len(src) < minWakeAheadBytes {
		return crc32c.Copy(0, dst, src)
	}
	split := max(0, len(src)-wakeAheadBytes)
	crc := crc32c.Copy(0, dst[:split], src[:split])
	s.wakeAhead()
	return crc32c.Copy(crc, dst[split:], src[split:])
}

// wakeAheadBytes is how much of its last copy a writer has left when it
// wakes a parked node for its commit: 1 MiB, 50-100 µs at the 10-20 GB/s
// one core copies into cold memory, about what a wake-up takes on a
// paravirtualized host.
const wakeAheadBytes = 1 << 20

// minWakeAheadBytes is the shortest last copy a writer wakes the node
// ahead of: a shorter one ends before the node is awake, and the post
// would wake it a second time.
const minWakeAheadBytes = 256 << 10

// wakeAhead wakes the node when it is parked, for the commit the caller
// posts in a moment (wire.Conn.WakeAhead). It skips the wake when another
// call holds the session: that call's round trip wakes the node anyway.
func (s *shmPath) wakeAhead() {
	if !s.mu.TryLock() {
		return
	}
	defer s.mu.Unlock()
	if s.usableLocked() != nil {
		return
	}
	if err := s.conn.WakeAhead(); err != nil {
		s.breakLocked(err)
	}
}

// takeSpareLocked returns the oldest spare's handle and bytes as the
// place for a put of size bytes under k when it fits, and reports whether
// it did. A spare that does not fit is aborted (the abort rides in front
// of the next request): the commit of this put brings one that does.
// REQUIRES: s.mu.
func (s *shmPath) takeSpareLocked(k BlockKey, size int) (handle uint64, mem []byte, ok bool) {
	if s.usableLocked() != nil {
		return 0, nil, false
	}
	for len(s.spares) > 0 {
		sp := s.spares[0]
		s.spares = append(s.spares[:0], s.spares[1:]...)
		if sp.tenant == k.Tenant && sp.namespace == k.Namespace && sp.size == size {
			// keepSpareLocked checked the range.
			return sp.handle, s.mem[sp.offset : sp.offset+uint64(sp.size) : sp.offset+uint64(sp.size)], true
		}
		s.conn.Queue(&wire.Request{Op: wire.OpAbort, Handle: sp.handle})
	}
	return 0, nil, false
}

// maxSpares is how many spares a session keeps at most, as many as the
// node does (pool's maxSessionSpares).
const maxSpares = 4

// writeBehindAheadBytes is how many bytes of spares a write-behind writer
// holds ahead: about what one core copies while a node on a busy host
// answers a post late (several hundred microseconds).
const writeBehindAheadBytes = 8 << 20

// WriteBehindSpares is how many places in its node's segment a client of
// the shared-memory path holds ahead of its write-behind puts (PutAsync)
// of size bytes: so many puts copy on while the node has not answered a
// commit yet. Enough to cover 8 MiB, two at least and four at most: four
// for 2 MiB blocks, two for 16 MiB ones, whose copy outlasts the wait
// (holding more, the writer cycles through more memory and copies
// slower). A client of synchronous puts holds one.
func WriteBehindSpares(size int) int {
	if size <= 0 {
		return maxSpares
	}
	return min(maxSpares, max(2, (writeBehindAheadBytes+size-1)/size))
}

// keepSpareLocked keeps sp as the session's newest spare, or aborts it
// when the session holds maxSpares already. REQUIRES: s.mu.
func (s *shmPath) keepSpareLocked(sp spare) {
	if _, err := s.region(sp.offset, uint64(sp.size)); err != nil || len(s.spares) >= maxSpares {
		s.conn.Queue(&wire.Request{Op: wire.OpAbort, Handle: sp.handle})
		return
	}
	s.spares = append(s.spares, sp)
}

func (s *shmPath) remove(ctx context.Context, tenant, namespace string, keys [][]byte, force bool) ([]error, error) {
	errs := make([]error, len(keys))
	for off := 0; off < len(keys); off += removeWindow {
		end := min(off+removeWindow, len(keys))
		if err := s.session(ctx, func(c *wire.Conn) error {
			return removeOver(ctx, c, tenant, namespace, keys[off:end], force, errs[off:end])
		}); err != nil {
			return errs, err
		}
	}
	return errs, nil
}

// session runs f on the session's connection, after every write-behind
// commit is answered (drainLocked) and any pending releases are queued,
// with the session lock held; a broken connection breaks the session.
func (s *shmPath) session(ctx context.Context, f func(c *wire.Conn) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usableLocked(); err != nil {
		return err
	}
	if s.drainLocked(ctx); s.broken != nil {
		return s.broken
	}
	s.queueReleasesLocked()
	err := f(s.conn)
	if !s.conn.Usable() {
		s.breakLocked(err)
	}
	return err
}
