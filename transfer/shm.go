package transfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
)

// The shm transport moves bytes between processes on one host by mapping
// the peer's registered memory into this process and copying: no socket
// carries block bytes. Only file-backed memory (a memfd, a hugetlbfs or
// tmpfs file) can be shared, so regions are registered with RegisterFile.
//
// A peer address is the path of the unix socket the serving side listens
// on. A client's first op on a region asks the server for it; the server
// answers with the region's file descriptor and a control page (passed
// with SCM_RIGHTS), and the client maps both once. The control page holds
// one generation word per region: Deregister zeroes it, and a copy that
// finds its generation gone fails with ErrNoRegion. The client keeps the
// socket open: a copy made while the peer died fails with ErrPeer (the
// bytes it read may be stale), and the peer's mappings are dropped.
//
// Trust is as for any shared memory: whoever may connect to the socket may
// read and write every registered region. The socket's file mode decides.

// SHMPreamble opens every connection to a shm transport's socket.
var SHMPreamble = [8]byte{'K', 'V', 'P', 'S', 'H', 'M', '0', '1'}

const (
	shmReqBytes    = 4  // region id
	shmRespBytes   = 24 // status, pad, slot, offset, length
	shmSlots       = 512
	shmControlSize = shmSlots * 8
	// shmChunkBytes is how much one copy moves between checks of the
	// context, and what a checksummed read sums while it is still in L2:
	// 256 KiB fetched 10.3 GB/s against 9.7 with 1 MiB (bench --remote
	// --transport shm).
	shmChunkBytes = 256 << 10
)

// SHMConfig configures a shm transport.
type SHMConfig struct {
	// Workers is how many goroutines copy one batch's ops in parallel.
	// Default 2: memory bandwidth on our hosts saturates with two copies.
	Workers int
	// DialTimeout bounds connecting to a peer's socket and its answer,
	// and, serving, how long a new connection may take to send its
	// preamble. Default 1 s.
	DialTimeout time.Duration
	// IOTimeout bounds the rest of a served request once its first byte
	// is in. A connection between requests may stay idle as long as its
	// peer lives: the peer holds it open to learn, by its end, that this
	// process died. Default 5 s.
	IOTimeout time.Duration
}

// SHM is the same-host transport. Safe for concurrent use.
type SHM struct {
	cfg SHMConfig

	// Serving side.
	smu     sync.Mutex
	regions map[RegionID]*shmRegion
	control *os.File // a memfd of shmSlots generation words
	ctlMem  []byte
	nextGen uint64

	// Client side.
	mu          sync.Mutex
	peers       map[string]*shmPeer
	oldControls [][]byte // control pages of retired peers, unmapped by Close
	closed      bool
	wg          sync.WaitGroup
}

type shmRegion struct {
	file   *os.File
	offset int64
	length uint64
	slot   int
	gen    uint64
}

// shmPeer is one peer this side has connected to: its socket, its control
// page and the regions mapped so far.
type shmPeer struct {
	addr    string
	mu      sync.Mutex // serializes requests on conn
	conn    *net.UnixConn
	control []byte                   // under SHM.mu
	maps    map[RegionID]*shmMapping // under SHM.mu
	dead    atomic.Bool
}

// shmMapping is one mapped region of a peer. refs counts ops copying from
// or to it; the memory is unmapped once it is retired and unused.
type shmMapping struct {
	mem     []byte
	control []byte // the peer's control page; outlives the mapping
	slot    int
	gen     uint64
	refs    int // under SHM.mu
	retired bool
}

// NewSHM returns a shm transport.
func NewSHM(cfg SHMConfig) *SHM {
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = time.Second
	}
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = 5 * time.Second
	}
	return &SHM{cfg: cfg, regions: map[RegionID]*shmRegion{}, peers: map[string]*shmPeer{}}
}

// Name implements Transport.
func (s *SHM) Name() string { return ProtocolSHM.String() }

// ErrNotShareable: the memory is not backed by a file another process can
// map.
var ErrNotShareable = errors.New("transfer: shm regions must be file-backed; use RegisterFile")

// Register implements Transport. Anonymous memory cannot be mapped by
// another process, so it always fails with ErrNotShareable.
func (s *SHM) Register(id RegionID, mem []byte) error {
	return fmt.Errorf("region %d: %w", id, ErrNotShareable)
}

// RegisterFile exposes length bytes of f from offset (a multiple of the
// page size) as region id. The transport keeps its own duplicate of the
// descriptor; the caller keeps f.
func (s *SHM) RegisterFile(id RegionID, f *os.File, offset int64, length uint64) error {
	if offset%int64(os.Getpagesize()) != 0 {
		return fmt.Errorf("transfer: region %d: offset %d is not page-aligned", id, offset)
	}
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		return fmt.Errorf("transfer: region %d: dup: %w", id, err)
	}
	dup := os.NewFile(uintptr(fd), f.Name())
	s.smu.Lock()
	defer s.smu.Unlock()
	if err := s.ensureControl(); err != nil {
		dup.Close()
		return err
	}
	if _, ok := s.regions[id]; ok {
		dup.Close()
		return fmt.Errorf("transfer: region %d is already registered", id)
	}
	slot := -1
	used := make([]bool, shmSlots)
	for _, r := range s.regions {
		used[r.slot] = true
	}
	for k := range used {
		if !used[k] {
			slot = k
			break
		}
	}
	if slot < 0 {
		dup.Close()
		return fmt.Errorf("transfer: region %d: all %d shm slots are in use", id, shmSlots)
	}
	s.nextGen++
	r := &shmRegion{file: dup, offset: offset, length: length, slot: slot, gen: s.nextGen}
	s.regions[id] = r
	atomic.StoreUint64(shmWord(s.ctlMem, slot), r.gen)
	return nil
}

func (s *SHM) ensureControl() error {
	if s.control != nil {
		return nil
	}
	fd, err := unix.MemfdCreate("kvpool-shm-control", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("transfer: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "kvpool-shm-control")
	if err := f.Truncate(shmControlSize); err != nil {
		f.Close()
		return fmt.Errorf("transfer: control page: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, shmControlSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return fmt.Errorf("transfer: control page: mmap: %w", err)
	}
	s.control, s.ctlMem = f, mem
	return nil
}

// shmWord is the generation word of slot in a control page.
func shmWord(mem []byte, slot int) *uint64 {
	return (*uint64)(unsafe.Pointer(&mem[slot*8]))
}

// Deregister implements Transport: ops that copy from or to the region
// after this fail with ErrNoRegion. A copy already under way when it is
// called may still finish; callers deregister memory they will keep
// mapped (as RDMA does: deregistration revokes access, not pages).
func (s *SHM) Deregister(id RegionID) {
	s.smu.Lock()
	defer s.smu.Unlock()
	r, ok := s.regions[id]
	if !ok {
		return
	}
	atomic.StoreUint64(shmWord(s.ctlMem, r.slot), 0)
	r.file.Close()
	delete(s.regions, id)
}

// ServeConn answers one client connection (after its SHMPreamble has been
// read) until it closes or ctx ends.
func (s *SHM) ServeConn(ctx context.Context, c *net.UnixConn) error {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var req [shmReqBytes]byte
	for {
		c.SetReadDeadline(time.Time{})
		if _, err := io.ReadFull(c, req[:1]); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		c.SetReadDeadline(time.Now().Add(s.cfg.IOTimeout))
		if _, err := io.ReadFull(c, req[1:]); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("truncated request: %w", err)
		}
		id := RegionID(binary.LittleEndian.Uint32(req[:]))
		var resp [shmRespBytes]byte
		s.smu.Lock()
		r, ok := s.regions[id]
		var rights []byte
		if ok {
			binary.LittleEndian.PutUint32(resp[4:], uint32(r.slot))
			binary.LittleEndian.PutUint64(resp[8:], uint64(r.offset))
			binary.LittleEndian.PutUint64(resp[16:], r.length)
			rights = unix.UnixRights(int(r.file.Fd()), int(s.control.Fd()))
		} else {
			resp[0] = 1
		}
		// The descriptors are sent while smu is held, so Deregister cannot
		// close them under the write.
		_, _, err := c.WriteMsgUnix(resp[:], rights, nil)
		s.smu.Unlock()
		if err != nil {
			return err
		}
	}
}

// Serve accepts connections on ln until ctx ends, reading each one's
// preamble and serving it.
func (s *SHM) Serve(ctx context.Context, ln *net.UnixListener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		wg.Go(func() {
			defer c.Close()
			s.ServeAccepted(ctx, c)
		})
	}
}

// ServeAccepted serves a connection just accepted on the shm socket: it
// reads the preamble (within DialTimeout), then answers requests until
// the peer closes c or ctx ends. The caller closes c.
func (s *SHM) ServeAccepted(ctx context.Context, c *net.UnixConn) {
	var pre [8]byte
	c.SetReadDeadline(time.Now().Add(s.cfg.DialTimeout))
	if _, err := io.ReadFull(c, pre[:]); err != nil || pre != SHMPreamble {
		return
	}
	s.ServeConn(ctx, c)
}

// peer returns the connection to addr, dialing it if needed.
func (s *SHM) peer(addr string) (*shmPeer, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if p, ok := s.peers[addr]; ok && !p.dead.Load() {
		s.mu.Unlock()
		return p, nil
	}
	s.mu.Unlock()
	d := net.Dialer{Timeout: s.cfg.DialTimeout}
	nc, err := d.Dial("unix", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrPeer, addr, err)
	}
	c := nc.(*net.UnixConn)
	c.SetWriteDeadline(time.Now().Add(s.cfg.DialTimeout))
	if _, err := c.Write(SHMPreamble[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: %s: %v", ErrPeer, addr, err)
	}
	c.SetWriteDeadline(time.Time{})
	p := &shmPeer{addr: addr, conn: c, maps: map[RegionID]*shmMapping{}}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return nil, ErrClosed
	}
	if old, ok := s.peers[addr]; ok {
		if !old.dead.Load() {
			c.Close()
			return old, nil
		}
		s.retireLocked(old)
	}
	s.peers[addr] = p
	return p, nil
}

// mapping returns region id of p, mapped, with a reference the caller
// must drop with unref.
func (s *SHM) mapping(p *shmPeer, id RegionID) (*shmMapping, error) {
	s.mu.Lock()
	if m, ok := p.maps[id]; ok {
		m.refs++
		s.mu.Unlock()
		return m, nil
	}
	s.mu.Unlock()

	p.mu.Lock()
	defer p.mu.Unlock()
	s.mu.Lock()
	if m, ok := p.maps[id]; ok { // mapped while we waited
		m.refs++
		s.mu.Unlock()
		return m, nil
	}
	s.mu.Unlock()
	m, err := s.request(p, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.dead.Load() {
		unix.Munmap(m.mem)
		return nil, fmt.Errorf("%w: %s went away", ErrPeer, p.addr)
	}
	m.refs++
	p.maps[id] = m
	return m, nil
}

// request asks p for region id and maps what it answers.
//
// REQUIRES: p.mu.
func (s *SHM) request(p *shmPeer, id RegionID) (*shmMapping, error) {
	fail := func(err error) (*shmMapping, error) {
		p.dead.Store(true)
		return nil, fmt.Errorf("%w: %s: %v", ErrPeer, p.addr, err)
	}
	var req [shmReqBytes]byte
	binary.LittleEndian.PutUint32(req[:], uint32(id))
	p.conn.SetDeadline(time.Now().Add(s.cfg.DialTimeout))
	defer p.conn.SetDeadline(time.Time{})
	if _, err := p.conn.Write(req[:]); err != nil {
		return fail(err)
	}
	var resp [shmRespBytes]byte
	oob := make([]byte, unix.CmsgSpace(2*4))
	n, oobn, _, _, err := p.conn.ReadMsgUnix(resp[:], oob)
	if err != nil {
		return fail(err)
	}
	var fds []int
	if oobn > 0 {
		cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return fail(perr)
		}
		for _, cm := range cmsgs {
			got, _ := unix.ParseUnixRights(&cm)
			fds = append(fds, got...)
		}
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if n != shmRespBytes {
		return fail(fmt.Errorf("short answer (%d bytes)", n))
	}
	if resp[0] != 0 {
		return nil, fmt.Errorf("%w: region %d on %s", ErrNoRegion, id, p.addr)
	}
	if len(fds) != 2 {
		return fail(fmt.Errorf("answer carried %d descriptors, want 2", len(fds)))
	}
	slot := int(binary.LittleEndian.Uint32(resp[4:]))
	offset := int64(binary.LittleEndian.Uint64(resp[8:]))
	length := binary.LittleEndian.Uint64(resp[16:])
	if slot >= shmSlots || length > 1<<46 {
		return fail(fmt.Errorf("bad answer: slot %d, length %d", slot, length))
	}
	s.mu.Lock()
	ctl := p.control
	s.mu.Unlock()
	if ctl == nil {
		mapped, err := unix.Mmap(fds[1], 0, shmControlSize, unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			return fail(fmt.Errorf("map control page: %v", err))
		}
		s.mu.Lock()
		if p.dead.Load() {
			s.mu.Unlock()
			unix.Munmap(mapped)
			return nil, fmt.Errorf("%w: %s went away", ErrPeer, p.addr)
		}
		p.control, ctl = mapped, mapped
		s.mu.Unlock()
	}
	m := &shmMapping{slot: slot, control: ctl, gen: atomic.LoadUint64(shmWord(ctl, slot))}
	if length > 0 {
		mem, err := unix.Mmap(fds[0], offset, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("%w: region %d on %s: mmap: %v", ErrNoRegion, id, p.addr, err)
		}
		m.mem = mem
	}
	if m.gen == 0 {
		unix.Munmap(m.mem)
		return nil, fmt.Errorf("%w: region %d on %s was withdrawn", ErrNoRegion, id, p.addr)
	}
	return m, nil
}

func (s *SHM) unref(m *shmMapping) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m.refs--
	if m.retired && m.refs == 0 && m.mem != nil {
		unix.Munmap(m.mem)
		m.mem = nil
	}
}

// forget drops a withdrawn region's mapping, so that the next op asks the
// peer again (the id may have been registered anew).
func (s *SHM) forget(p *shmPeer, id RegionID, m *shmMapping) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.maps[id] == m {
		delete(p.maps, id)
		m.retired = true // unref unmaps it once the last op lets go
	}
}

// retireLocked drops p: its socket closes and each mapping is unmapped
// once no op uses it. s.mu is held.
func (s *SHM) retireLocked(p *shmPeer) {
	p.dead.Store(true)
	p.conn.Close()
	for id, m := range p.maps {
		m.retired = true
		if m.refs == 0 && m.mem != nil {
			unix.Munmap(m.mem)
			m.mem = nil
		}
		delete(p.maps, id)
	}
	if p.control != nil {
		// An op still copying may check this page after the retirement;
		// it stays mapped (4 KiB per peer incarnation) until Close.
		s.oldControls = append(s.oldControls, p.control)
		p.control = nil
	}
	if s.peers[p.addr] == p {
		delete(s.peers, p.addr)
	}
}

// alive reports whether p's process still has its end of the socket open:
// a non-blocking peek sees end of file once it died.
func (p *shmPeer) alive() bool {
	if p.dead.Load() {
		return false
	}
	raw, err := p.conn.SyscallConn()
	if err != nil {
		return false
	}
	ok := true
	raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if n == 0 && err == nil {
			ok = false
		} else if err != nil && err != unix.EAGAIN && err != unix.EINTR {
			ok = false
		}
		return true
	})
	if !ok {
		p.dead.Store(true)
	}
	return ok
}

// Submit implements Transport: up to Workers goroutines copy the ops.
func (s *SHM) Submit(ctx context.Context, ops []Op) *Batch {
	b := NewBatch(len(ops))
	if len(ops) == 0 {
		return b
	}
	// The workers are counted under s.mu, where Close marks s closed, so
	// none is added to s.wg once Close may be waiting on it.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		for i := range ops {
			b.Complete(i, 0, ErrClosed)
		}
		return b
	}
	defer s.mu.Unlock()
	var next atomic.Int64
	for range min(s.cfg.Workers, len(ops)) {
		s.wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(ops) {
					return
				}
				crc, err := s.run(ctx, b, &ops[i])
				if err != nil {
					b.Complete(i, 0, fmt.Errorf("transfer: op %d: %w", i, err))
					continue
				}
				b.CompleteCRC(i, uint64(len(ops[i].Local)), crc, nil)
			}
		})
	}
	return b
}

func (s *SHM) run(ctx context.Context, b *Batch, op *Op) (uint32, error) {
	if op.Kind != Read && op.Kind != Write {
		return 0, fmt.Errorf("kind %v", op.Kind)
	}
	if len(op.Name.Key) > 0 || len(op.Name.Tenant)+len(op.Name.Namespace) > 0 {
		return 0, fmt.Errorf("%w: the shm transport serves no named reads", api.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	p, err := s.peer(op.Peer)
	if err != nil {
		return 0, err
	}
	m, err := s.mapping(p, op.Region)
	if err != nil {
		return 0, err
	}
	defer s.unref(m)
	n := uint64(len(op.Local))
	if op.Offset > uint64(len(m.mem)) || n > uint64(len(m.mem))-op.Offset {
		return 0, fmt.Errorf("%w: region %d [%d, +%d) on %s", ErrNoRegion, op.Region, op.Offset, n, op.Peer)
	}
	gen := shmWord(m.control, m.slot)
	if atomic.LoadUint64(gen) != m.gen {
		s.forget(p, op.Region, m)
		return 0, fmt.Errorf("%w: region %d on %s was withdrawn", ErrNoRegion, op.Region, op.Peer)
	}
	b.Responded(0)
	remote := m.mem[op.Offset : op.Offset+n]
	var crc uint32
	for done := uint64(0); done < n; {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		k := min(n-done, shmChunkBytes)
		if op.Kind == Read {
			copy(op.Local[done:done+k], remote[done:done+k])
			if op.Checksum {
				crc = api.UpdateChecksum(crc, op.Local[done:done+k])
			}
		} else {
			copy(remote[done:done+k], op.Local[done:done+k])
		}
		done += k
	}
	if atomic.LoadUint64(gen) != m.gen {
		s.forget(p, op.Region, m)
		return 0, fmt.Errorf("%w: region %d on %s was withdrawn during the copy", ErrNoRegion, op.Region, op.Peer)
	}
	if !p.alive() {
		s.mu.Lock()
		s.retireLocked(p)
		s.mu.Unlock()
		return 0, fmt.Errorf("%w: %s went away during the copy", ErrPeer, op.Peer)
	}
	return crc, nil
}

// Close implements Transport: it waits for copies in flight, then unmaps
// every peer and withdraws every region.
func (s *SHM) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	for _, p := range s.peers {
		s.retireLocked(p)
	}
	for _, c := range s.oldControls {
		unix.Munmap(c)
	}
	s.oldControls = nil
	s.mu.Unlock()
	s.smu.Lock()
	defer s.smu.Unlock()
	for id, r := range s.regions {
		r.file.Close()
		delete(s.regions, id)
	}
	if s.control != nil {
		unix.Munmap(s.ctlMem)
		s.control.Close()
		s.control, s.ctlMem = nil, nil
	}
	return nil
}
