package transfer

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
)

// TCPPreamble opens a transfer connection; a node's listener routes
// connections that start with it to ServeConn.
var TCPPreamble = [8]byte{'K', 'V', 'P', 'T', 1, 0, 0, 0}

// TCPConfig configures the tcp transport.
type TCPConfig struct {
	// ConnsPerPeer is how many connections carry each peer's traffic;
	// each takes the next slice of the peer's queue as its window allows.
	// Default 2.
	ConnsPerPeer int
	// SliceBytes is the smallest slice ops are cut into (an op smaller
	// than it goes whole), so one large op spreads over every connection,
	// and the last slices of a batch are small enough to share out
	// evenly. Default 512 KiB.
	SliceBytes int
	// MaxSliceBytes is the largest. Each slice costs a turnaround on
	// both ends (a request read, a response written, often a wake-up),
	// so a batch larger than its peer's connections need to stay busy
	// and finish together is cut coarser: into slices of its bytes for
	// that peer over ConnsPerPeer × 4 (each connection gets four or more
	// at the end), rounded down to 4 KiB, within [SliceBytes,
	// MaxSliceBytes]. Chains of 16 and 64 blocks of 2 MiB over two
	// connections then move in slices of 1 MiB, one block in four of
	// 512 KiB. Default 1 MiB, but SliceBytes where the connections run
	// BBR (Congestion, or the host's default when it is empty): on two
	// vCPUs, interleaved, slices of 1 MiB moved chains of 16 and 64
	// blocks 4 % faster than 512 KiB on CUBIC, and chains of 64 8 %
	// slower on BBR, which paces each connection at its model of the
	// path's rate. SliceBytes or less cuts every op into slices of
	// SliceBytes.
	MaxSliceBytes int
	// WindowBytes bounds what each connection has asked its peer for and
	// whose response has not begun to arrive: at least two slices, and
	// one whatever its size. Slices beyond it wait in the peer's queue
	// and go to whichever connection drains first, so a batch's
	// connections finish together: a peer that fills one socket far
	// ahead of the other no longer leaves a core idle while the other
	// drains its share. Default 1 MiB: two slices of the smallest size,
	// so the peer has the next request when it finishes one.
	WindowBytes int
	// DialTimeout bounds connecting to a peer. Default 2 s.
	DialTimeout time.Duration
	// IdleTimeout closes a served connection that sends no request for
	// this long (the peer's reader sees it at once and redials on its next
	// op). Default 10 min.
	IdleTimeout time.Duration
	// IOTimeout bounds the rest of a served request once its first byte
	// is in, a Write's payload, and the response's write. Default 30 s.
	IOTimeout time.Duration
	// Logger receives the transport's logs: a connection that failed to
	// dial or broke (once per connection, never per slice). Default:
	// discard.
	Logger *slog.Logger
	// TLS, when set, runs each connection to a peer through TLS (with
	// this node's certificate, which identifies it as a node).
	TLS *tls.Config
	// TLSFor, when set, decides per peer address instead of TLS (nil:
	// plaintext).
	TLSFor func(addr string) *tls.Config
	// Token, when set, is sent in each connection's preamble: this node's
	// bearer token, for peers that identify nodes by token.
	Token string
	// Congestion is the TCP congestion control of the connections it
	// dials (wire.SetCongestion; the node sets its own on those it
	// accepts, which send the bytes of reads). "" leaves the host's.
	Congestion string
}

// TCP is the framed TCP transport. Requests name (region, offset,
// length); a read's response carries the bytes, written by the server
// straight from the region and read by the client straight into the op's
// buffer, so each side copies once, as raw TCP does.
type TCP struct {
	cfg TCPConfig
	log *slog.Logger
	regions

	mu     sync.Mutex
	peers  map[string]*tcpPeer
	closed bool
	wg     sync.WaitGroup
}

var (
	_ NamedReader = (*TCP)(nil)
	_ RTTReporter = (*TCP)(nil)
)

// NewTCP returns a tcp transport.
func NewTCP(cfg TCPConfig) *TCP {
	if cfg.ConnsPerPeer <= 0 {
		cfg.ConnsPerPeer = 2
	}
	if cfg.SliceBytes <= 0 {
		cfg.SliceBytes = 512 << 10
	}
	if cfg.MaxSliceBytes == 0 {
		cfg.MaxSliceBytes = 1 << 20
		if wire.EffectiveCongestion(cfg.Congestion) == "bbr" {
			cfg.MaxSliceBytes = cfg.SliceBytes
		}
	}
	cfg.MaxSliceBytes = max(cfg.MaxSliceBytes, cfg.SliceBytes)
	if cfg.WindowBytes <= 0 {
		cfg.WindowBytes = 1 << 20
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 2 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 10 * time.Minute
	}
	if cfg.IOTimeout <= 0 {
		cfg.IOTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &TCP{cfg: cfg, log: cfg.Logger.With("component", "transfer", "transport", "tcp"), peers: map[string]*tcpPeer{}}
}

// Name implements Transport.
func (t *TCP) Name() string { return ProtocolTCP.String() }

// Register implements Transport.
func (t *TCP) Register(id RegionID, mem []byte) error { return t.register(id, mem) }

// Deregister implements Transport.
func (t *TCP) Deregister(id RegionID) { t.deregister(id) }

// RTT implements RTTReporter: the kernel's smoothed round trip of a
// connection to peer (TCP_INFO), the network's own without the peer's
// service time; false while none is connected.
func (t *TCP) RTT(peer string) (time.Duration, bool) {
	t.mu.Lock()
	p := t.peers[peer]
	t.mu.Unlock()
	if p == nil {
		return 0, false
	}
	var nc net.Conn
	p.mu.Lock()
	for _, c := range p.conns {
		if c != nil && !c.broken.Load() {
			if nc = c.connected(); nc != nil {
				break
			}
		}
	}
	p.mu.Unlock()
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	if err := rc.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || info == nil || info.Rtt == 0 {
		return 0, false
	}
	return time.Duration(info.Rtt) * time.Microsecond, true
}

// ReadsByName implements NamedReader: a connection served with a
// BlockSource (ServeConnWith) serves named reads.
func (t *TCP) ReadsByName() bool { return true }

// Frame layouts, little-endian.
//
//	request     kind u8, 3 zero bytes, region u32, offset u64, length u64  (24 B)
//	named read  kind u8 (3), zero u8, name u16, zero u32, offset u64, length u64,
//	            block u64 (32 B), then the name: tenant, namespace and key,
//	            each a u8 length and its bytes (name is their total)
//	response    status u8, 3 zero bytes, crc u32, length u64              (16 B)
//
// A write's request is followed by its bytes; a successful read's
// response is followed by its bytes. A named read asks for [offset,
// +length) of the block, which must be block bytes long; its response's
// crc is the checksum the peer holds for the block (0 for other reads).
// Status 0 is success, 1 a missing region, range or block, 2 a range or
// block the caller may not touch (Access, BlockSource), 3 a block of
// another size (length is then its size, and no bytes follow).
const (
	tcpReqBytes   = 24
	tcpNamedBytes = 32
	tcpRespBytes  = 16
	// tcpNamedRead is a named read's kind byte on the wire.
	tcpNamedRead = 3
	// tcpMaxName is the longest name a named read carries.
	tcpMaxName = 3 * (1 + 255)
)

// Response statuses.
const (
	tcpOK = iota
	tcpMissing
	tcpRefused
	tcpWrongSize
)

// opState is one op of a batch, spread over slices.
type opState struct {
	b        *Batch
	i        int
	peer     *tcpPeer
	bytes    uint64
	checksum bool
	// name is a named read's block (Op.Name); named reads' slices carry
	// offsets within the block.
	name   BlockName
	named  bool
	slices []slice
	left   atomic.Int32
	err    atomic.Pointer[error]
}

// slice is one request on one connection: a piece of an op.
type slice struct {
	op     *opState
	conn   *tcpConn // the connection it was given to; nil while queued (guarded by the peer's mu)
	kind   Kind
	region RegionID
	offset uint64
	local  []byte
	crc    uint32 // of what a checksummed read received
	// peerCRC is, for a named read, the block's checksum the peer sent
	// with this slice's response.
	peerCRC uint32
	// finished is set once its outcome is in: a cancelled batch breaks
	// only connections that still carry an unfinished slice of it.
	finished atomic.Bool
}

func (s *slice) finish(err error) {
	s.finished.Store(true)
	o := s.op
	if err != nil {
		o.err.CompareAndSwap(nil, &err)
	}
	if o.left.Add(-1) != 0 {
		return
	}
	if p := o.err.Load(); p != nil {
		o.b.Complete(o.i, 0, *p)
		return
	}
	var crc uint32
	if o.checksum {
		// Slices finish in any order, over any connection: combine their
		// checksums in offset order.
		for k := range o.slices {
			crc = api.CombineChecksum(crc, o.slices[k].crc, int64(len(o.slices[k].local)))
		}
	}
	peerCRC := o.slices[0].peerCRC
	for k := range o.slices {
		if o.named && o.slices[k].peerCRC != peerCRC {
			// Each slice pinned the block anew: it was replaced between
			// two of them, and the pieces are of different blocks.
			o.b.Complete(o.i, 0, fmt.Errorf("%w: block %x changed while it was read", ErrPeer, o.name.Key))
			return
		}
	}
	o.b.CompleteNamed(o.i, o.bytes, crc, peerCRC, nil)
}

// Submit implements Transport.
func (t *TCP) Submit(ctx context.Context, ops []Op) *Batch {
	b, _, _ := t.submit(ctx, ops, false)
	return b
}

// run is Submit for a caller that waits for the batch next (Run): the
// calling goroutine reads the batch's responses itself rather than sleep
// until the connections' readers have. A fetch then wakes neither those
// readers nor, once they are done, itself: each such wake-up is an
// interprocessor interrupt on the fetch's critical path, and a reader
// woken onto the core the caller is running on waits behind it. A
// connection through TLS is read by its reader, as after Submit.
//
// Only a batch whose requests all fit the connections' windows at once is
// driven: one goroutine waits on one connection at a time, and while it
// waits on one, another whose window it has not refilled idles (chains
// of 16 and 64 blocks measured 5–9 % slower driven). Its readers read a
// larger batch, in parallel.
func (t *TCP) run(ctx context.Context, ops []Op) *Batch {
	var bytes int
	for _, op := range ops {
		bytes += len(op.Local)
	}
	if bytes > t.cfg.ConnsPerPeer*t.cfg.WindowBytes {
		return t.Submit(ctx, ops)
	}
	b, states, peers := t.submit(ctx, ops, true)
	t.drive(ctx, b, states)
	for _, p := range peers {
		p.undrive()
	}
	return b
}

// submit is Submit; driven registers the caller as a driver of every peer
// the ops go to (see drive) before any request is sent, so the
// connections' readers leave the responses to it. It returns the batch,
// its ops' states and the peers.
func (t *TCP) submit(ctx context.Context, ops []Op, driven bool) (*Batch, []*opState, []*tcpPeer) {
	b := NewBatch(len(ops))
	// One allocation per op for its slices: none per slice.
	var (
		peers  []*tcpPeer
		queued [][]*slice // per peer, in op order
		asked  []int      // bytes per peer, which size its slices
		states []*opState
		// at is each op's peer in peers, -1 for one completed with its
		// error.
		at = make([]int, len(ops))
	)
	for i, op := range ops {
		at[i] = -1
		if op.Kind != Read && op.Kind != Write {
			b.Complete(i, 0, fmt.Errorf("transfer: op %d: kind %v", i, op.Kind))
			continue
		}
		if err := checkName(op); err != nil {
			b.Complete(i, 0, fmt.Errorf("transfer: op %d: %w", i, err))
			continue
		}
		peer, err := t.peer(op.Peer)
		if err != nil {
			b.Complete(i, 0, err)
			continue
		}
		k := slices.Index(peers, peer)
		if k < 0 {
			k = len(peers)
			peers, queued, asked = append(peers, peer), append(queued, nil), append(asked, 0)
		}
		at[i] = k
		asked[k] += len(op.Local)
	}
	for i, op := range ops {
		k := at[i]
		if k < 0 {
			continue
		}
		named := len(op.Name.Key) > 0
		size := t.sliceBytes(asked[k])
		pieces := max(1, (len(op.Local)+size-1)/size)
		o := &opState{b: b, i: i, peer: peers[k], bytes: uint64(len(op.Local)), checksum: op.Checksum && op.Kind == Read,
			name: op.Name, named: named, slices: make([]slice, pieces)}
		o.left.Store(int32(pieces))
		states = append(states, o)
		base := op.Offset
		if named {
			base = 0
		}
		for p := range pieces {
			lo := min(p*size, len(op.Local))
			hi := min(lo+size, len(op.Local))
			o.slices[p] = slice{op: o, kind: op.Kind, region: op.Region, offset: base + uint64(lo), local: op.Local[lo:hi:hi]}
			queued[k] = append(queued[k], &o.slices[p])
		}
	}
	for k, p := range peers {
		if driven {
			p.drivers.Add(1)
		}
		p.submit(queued[k])
	}
	if ctx.Done() != nil && len(peers) > 0 {
		stop := context.AfterFunc(ctx, func() {
			// Like an RDMA queue pair going to the error state: the
			// connections carrying this batch are torn down and every op
			// on them fails (other batches on them too; they may retry).
			// Its slices still queued fail without being sent.
			err := fmt.Errorf("transfer: %w", ctx.Err())
			for _, p := range peers {
				p.cancel(b, states, err)
			}
		})
		// Disarmed before Wait returns: a caller that cancels its context
		// after the batch is done must not break connections later
		// batches use.
		b.OnDone(func() { stop() })
	}
	return b, states, peers
}

// sliceBytes is the slice size of a batch that asks bytes of one peer
// (TCPConfig.MaxSliceBytes).
func (t *TCP) sliceBytes(bytes int) int {
	size := bytes / (t.cfg.ConnsPerPeer * 4) &^ (4<<10 - 1)
	return min(max(size, t.cfg.SliceBytes), t.cfg.MaxSliceBytes)
}

// window is what a connection may have asked for before it asks for s
// as well (TCPConfig.WindowBytes).
func (t *TCP) window(s *slice) int { return max(t.cfg.WindowBytes, 2*len(s.local)) }

// drive reads the responses of b's ops (states) on the calling goroutine
// until b is done or ctx ends: whatever has arrived on any connection of
// b's peers (other batches' responses on them too, in order), and when
// nothing has, it waits on a connection that carries an unfinished slice
// of b. It returns early when none of b's unfinished slices is on a
// connection it can read (still queued for a window, or on a TLS or
// broken connection): the caller then waits for b as after Submit, once
// it has stopped driving.
func (t *TCP) drive(ctx context.Context, b *Batch, states []*opState) {
	var (
		peers []*tcpPeer
		conns []*tcpConn
	)
	for _, o := range states {
		if !slices.Contains(peers, o.peer) {
			peers = append(peers, o.peer)
		}
	}
	for {
		if done, _ := b.Poll(); done || ctx.Err() != nil {
			return
		}
		progress := false
		conns = conns[:0]
		for _, p := range peers {
			conns = p.appendConns(conns)
		}
		for _, c := range conns {
			if !c.drivable() || c.pending.Load() == 0 || !c.rmu.TryLock() {
				continue
			}
			moved, err := c.step(stepArrived)
			c.rmu.Unlock()
			if err != nil {
				c.fail(err)
			}
			progress = progress || moved
		}
		if progress {
			continue
		}
		c := unfinishedOn(states)
		if c == nil {
			return
		}
		c.rmu.Lock()
		_, err := c.step(stepWaitFirst)
		c.rmu.Unlock()
		if err != nil {
			c.fail(err)
		}
	}
}

// unfinishedOn returns a connection the driver may wait on: one that
// carries an unfinished slice of states' ops and has responses to come.
func unfinishedOn(states []*opState) *tcpConn {
	for _, o := range states {
		for k := range o.slices {
			s := &o.slices[k]
			if s.finished.Load() {
				continue
			}
			o.peer.mu.Lock()
			c := s.conn
			o.peer.mu.Unlock()
			// pending first: a connection has sent once it is dialed,
			// and its reading state set up.
			if c != nil && c.pending.Load() > 0 && c.drivable() && !c.broken.Load() {
				return c
			}
		}
	}
	return nil
}

// checkName refuses a named op that is not a read, or whose name does not
// fit a request (the peer checks what the name means).
func checkName(op Op) error {
	n := op.Name
	switch {
	case len(n.Key) == 0 && len(n.Tenant)+len(n.Namespace) == 0:
		return nil
	case len(n.Key) == 0:
		return fmt.Errorf("%w: a named read with no key", api.ErrInvalidArgument)
	case op.Kind != Read:
		return fmt.Errorf("%w: only reads are named, not a %v", api.ErrInvalidArgument, op.Kind)
	case len(n.Tenant) > 255 || len(n.Namespace) > 255 || len(n.Key) > 255:
		return fmt.Errorf("%w: a name's parts have at most 255 bytes", api.ErrInvalidArgument)
	}
	return nil
}

// appendName appends n as a named read's request carries it.
func appendName(b []byte, n BlockName) []byte {
	for _, part := range [3][]byte{n.Tenant, n.Namespace, n.Key} {
		b = append(b, byte(len(part)))
		b = append(b, part...)
	}
	return b
}

// parseName reads a name appendName wrote; its parts alias b.
func parseName(b []byte) (BlockName, bool) {
	var parts [3][]byte
	for k := range parts {
		if len(b) == 0 || int(b[0]) > len(b)-1 {
			return BlockName{}, false
		}
		parts[k], b = b[1:1+int(b[0])], b[1+int(b[0]):]
	}
	return BlockName{Tenant: parts[0], Namespace: parts[1], Key: parts[2]}, len(b) == 0 && len(parts[2]) > 0
}

// tcpPeer holds the connections to one peer and the slices waiting for
// room in their windows. Connections pull the next slice as they finish
// one (pump), so none runs dry while another still has a backlog.
type tcpPeer struct {
	t     *TCP
	addr  string
	mu    sync.Mutex
	conns []*tcpConn
	queue []*slice // submitted, given to no connection yet, in order
	// drivers counts the goroutines reading this peer's responses
	// themselves (TCP.run); while there are any, the connections'
	// readers leave the reading to them.
	drivers atomic.Int32
}

// appendConns appends p's connections that are dialed to cs.
func (p *tcpPeer) appendConns(cs []*tcpConn) []*tcpConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if c != nil && c.connected() != nil {
			cs = append(cs, c)
		}
	}
	return cs
}

// queuedElsewhere is what the kernel holds unread on p's dialed
// connections other than c. A connection's reading state is set before it
// counts as dialed and never changes after, so reading its socket from
// here is safe.
func (p *tcpPeer) queuedElsewhere(c *tcpConn) uint64 {
	var buf [8]*tcpConn
	var n uint64
	for _, o := range p.appendConns(buf[:0]) {
		if o != c && o.rd.src != nil {
			n += o.rd.src.queued()
		}
	}
	return n
}

// undrive ends one driver's reading; the last one hands the connections
// with responses still to come back to their readers.
func (p *tcpPeer) undrive() {
	if p.drivers.Add(-1) != 0 {
		return
	}
	var buf [8]*tcpConn
	for _, c := range p.appendConns(buf[:0]) {
		if c.pending.Load() > 0 {
			c.kickReader()
		}
	}
}

func (t *TCP) peer(addr string) (*tcpPeer, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, ErrClosed
	}
	p, ok := t.peers[addr]
	if !ok {
		p = &tcpPeer{t: t, addr: addr, conns: make([]*tcpConn, t.cfg.ConnsPerPeer)}
		t.peers[addr] = p
	}
	return p, nil
}

// submit queues q and gives connections what fits their windows.
func (p *tcpPeer) submit(q []*slice) {
	p.mu.Lock()
	p.queue = append(p.queue, q...)
	p.mu.Unlock()
	p.pump()
}

// pump gives queued slices to connections with room in their windows,
// one slice per connection in turn so a batch spreads over all of them,
// and sends them. A broken (or never dialed) connection is replaced by a
// new one, dialed by its own goroutine; once the transport is closed
// there is none, and the queue fails with ErrClosed.
func (p *tcpPeer) pump() {
	var give [][]*slice // per connection
	closed := false
	p.mu.Lock()
	for more := len(p.queue) > 0; more && !closed; {
		more = false
		for i := range p.conns {
			if len(p.queue) == 0 {
				break
			}
			c := p.conns[i]
			if c == nil || c.broken.Load() {
				if c = newTCPConn(p.t, p); c == nil {
					closed = true
					break
				}
				p.conns[i] = c
			}
			s := p.queue[0]
			if c.given > 0 && c.given+len(s.local) > p.t.window(s) {
				continue
			}
			if give == nil {
				give = make([][]*slice, len(p.conns))
			}
			p.queue[0] = nil
			p.queue = p.queue[1:]
			c.given += len(s.local)
			s.conn = c
			give[i] = append(give[i], s)
			more = true
		}
	}
	if len(p.queue) == 0 {
		p.queue = nil
	}
	conns := append([]*tcpConn(nil), p.conns...)
	p.mu.Unlock()
	for i, q := range give {
		if len(q) > 0 {
			conns[i].enqueue(q)
		}
	}
	if closed {
		p.failQueue(ErrClosed)
	}
}

// done returns s's bytes to its connection's window once its response
// has begun to arrive, and gives the room to the next queued slice: on
// the same connection without an allocation when it fits there, else
// through pump. Only the connection's reader calls it.
func (p *tcpPeer) done(s *slice) {
	c := s.conn
	var next *slice
	p.mu.Lock()
	c.given -= len(s.local)
	if len(p.queue) > 0 && !c.broken.Load() && (c.given == 0 || c.given+len(p.queue[0].local) <= p.t.window(p.queue[0])) {
		next = p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		c.given += len(next.local)
		next.conn = c
	}
	more := len(p.queue) > 0 && next == nil
	p.mu.Unlock()
	switch {
	case next != nil:
		c.next[0] = next
		c.enqueue(c.next[:])
	case more:
		p.pump()
	}
}

// failQueue fails every queued slice with err: the peer could not be
// reached, and the slices behind would meet the same.
func (p *tcpPeer) failQueue(err error) {
	p.mu.Lock()
	q := p.queue
	p.queue = nil
	p.mu.Unlock()
	for _, s := range q {
		s.finish(err)
	}
}

// cancel fails b's slices still queued, and breaks the connections that
// carry an unfinished slice of it (states are b's ops). They are marked
// broken under mu, so no slice given after this reaches them.
func (p *tcpPeer) cancel(b *Batch, states []*opState, err error) {
	var mine []*slice
	var carriers []*tcpConn
	p.mu.Lock()
	p.queue = slices.DeleteFunc(p.queue, func(s *slice) bool {
		if s.op.b == b {
			mine = append(mine, s)
			return true
		}
		return false
	})
	for _, o := range states {
		for k := range o.slices {
			s := &o.slices[k]
			if c := s.conn; c != nil && !s.finished.Load() && !slices.Contains(carriers, c) {
				carriers = append(carriers, c)
				c.breakOff(err)
			}
		}
	}
	p.mu.Unlock()
	for _, s := range mine {
		s.finish(err)
	}
	for _, c := range carriers {
		c.fail(err)
	}
}

// tcpConn is one connection: a writer goroutine sends requests, a reader
// goroutine matches the responses to them, in order. A batch of reads
// submitted while the connection is connected and idle is written by the
// submitting goroutine itself, which spares the writer's wake-up.
type tcpConn struct {
	t    *TCP
	peer *tcpPeer
	addr string
	// given is the bytes of the slices given to it whose responses are
	// not yet in (guarded by peer.mu).
	given int
	next  [1]*slice // the reader's: the slice done hands it (enqueue copies it out)

	mu      sync.Mutex
	queue   []*slice // to send
	writing bool     // someone (the writer or a submitter) is sending: the only one who may
	hdrs    []byte   // request headers being gathered; the sender's
	// direct counts submitters sending on their own; drain waits for
	// them, so no slice enters sent after drain has emptied it. One only
	// starts while the connection is not broken, under mu.
	direct sync.WaitGroup

	wake chan struct{} // the writer has work
	sent chan *slice   // sent and awaiting a response, in order
	// pending counts the slices sent whose responses are not all in
	// (those in sent, and the one being read).
	pending atomic.Int32
	// kick wakes the reader: slices were sent while no driver reads the
	// peer's responses, or the last driver stopped with some to come.
	kick chan struct{}
	// rmu is held by whoever reads the responses (the reader, or a
	// driver), and guards rd.
	rmu     sync.Mutex
	rd      tcpReading
	closing chan struct{} // closed by fail
	once    sync.Once
	broken  atomic.Bool
	errMu   sync.Mutex
	err     error
	ready   chan struct{} // c is set (or the dial failed)
	c       net.Conn
}

// newTCPConn returns a connection to p, its goroutine started (which
// dials it), or nil once t is closed.
func newTCPConn(t *TCP, p *tcpPeer) *tcpConn {
	c := &tcpConn{t: t, peer: p, addr: p.addr, wake: make(chan struct{}, 1), sent: make(chan *slice, 4096), kick: make(chan struct{}, 1),
		closing: make(chan struct{}), ready: make(chan struct{})}
	// The goroutine is counted under t.mu, where Close marks t closed, so
	// none is added to t.wg once Close may be waiting on it.
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.wg.Go(c.run)
	return c
}

func (c *tcpConn) enqueue(s []*slice) {
	c.mu.Lock()
	if c.broken.Load() {
		c.mu.Unlock()
		for _, x := range s {
			x.finish(c.error())
		}
		return
	}
	if nc := c.connected(); nc != nil && !c.writing && len(c.queue) == 0 && allReads(s) {
		// Read requests are a few bytes each: write them here rather
		// than wake the writer for them.
		c.writing = true
		c.direct.Add(1)
		c.mu.Unlock()
		c.send(nc, s)
		c.direct.Done()
		c.mu.Lock()
		c.writing = false
		if len(c.queue) == 0 {
			c.mu.Unlock()
			return
		}
	} else {
		c.queue = append(c.queue, s...)
	}
	c.mu.Unlock()
	c.wakeWriter()
}

func (c *tcpConn) kickReader() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// drivable reports whether a driver may read c: it is dialed and not
// through TLS (whose records only its reader decodes).
func (c *tcpConn) drivable() bool { return c.rd.src != nil }

func (c *tcpConn) wakeWriter() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// connected returns the connection once it is dialed, nil before (or
// when the dial failed).
func (c *tcpConn) connected() net.Conn {
	select {
	case <-c.ready:
		return c.c
	default:
		return nil
	}
}

func allReads(s []*slice) bool {
	for _, x := range s {
		if x.kind != Read {
			return false
		}
	}
	return true
}

func (c *tcpConn) error() error {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	if c.err == nil {
		return fmt.Errorf("%w: %s", ErrPeer, c.addr)
	}
	return c.err
}

// fail breaks the connection; its goroutines then fail every slice it
// holds.
func (c *tcpConn) fail(err error) {
	c.breakOff(err)
	<-c.ready
	if c.c != nil {
		c.c.Close()
	}
}

// breakOff marks the connection broken with err (the first error
// stays), so nothing more is sent on it, and stops its goroutines'
// waits; fail also closes the socket. It does not block.
func (c *tcpConn) breakOff(err error) {
	c.errMu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.errMu.Unlock()
	c.mu.Lock()
	c.broken.Store(true)
	c.mu.Unlock()
	c.once.Do(func() { close(c.closing) })
}

func (c *tcpConn) run() {
	ctx, cancel := context.WithTimeout(context.Background(), c.t.cfg.DialTimeout)
	tlsConfig := c.t.cfg.TLS
	if c.t.cfg.TLSFor != nil {
		tlsConfig = c.t.cfg.TLSFor(c.addr)
	}
	nc, err := wire.DialPreamble(ctx, c.addr, TCPPreamble, tlsConfig, c.t.cfg.Token, c.t.cfg.Congestion)
	cancel()
	if err != nil {
		close(c.ready)
		c.fail(fmt.Errorf("%w: %s: %v", ErrPeer, c.addr, err))
		c.t.log.Debug("transfer connection failed to dial", "peer", c.addr, "err", err)
		c.drain()
		return
	}
	c.c = nc
	c.rd = newTCPReading(nc)
	close(c.ready)
	done := make(chan struct{})
	go func() { defer close(done); c.readLoop() }()
	c.writeLoop(nc)
	// The writer stops once the connection is broken: closing the socket
	// (fail has, or is about to) ends any read of it under way.
	nc.Close()
	<-done
	// Close and cancelled batches break connections on purpose; only the
	// peer or the network failing is worth a line.
	if err := c.error(); errors.Is(err, ErrPeer) {
		c.t.log.Warn("transfer connection broke", "peer", c.addr, "err", err)
	}
	c.drain()
}

// drain fails whatever is still queued or awaiting a response. It runs
// once the connection is broken. The peer's queue then goes to the other
// connections (and a new one in its place), unless this one never
// connected: the peer is unreachable, and the queue fails too.
func (c *tcpConn) drain() {
	c.direct.Wait()
	err := c.error()
	c.mu.Lock()
	q := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, s := range q {
		s.finish(err)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if s := c.rd.cur; s != nil {
		c.rd.cur = nil
		c.finishRead(s, err)
	}
	for {
		select {
		case s := <-c.sent:
			c.finishRead(s, err)
		default:
			if c.c == nil {
				c.peer.failQueue(err)
			} else {
				c.peer.pump()
			}
			return
		}
	}
}

// writeLoop sends what is queued, whenever no submitter is sending.
func (c *tcpConn) writeLoop(nc net.Conn) {
	for {
		c.mu.Lock()
		var q []*slice
		if !c.writing {
			q, c.queue = c.queue, nil
			c.writing = len(q) > 0
		}
		c.mu.Unlock()
		if len(q) == 0 {
			select {
			case <-c.closing:
				return
			case <-c.wake:
				continue
			}
		}
		ok := c.send(nc, q)
		c.mu.Lock()
		c.writing = false
		c.mu.Unlock()
		if !ok {
			return
		}
	}
}

// send writes q's requests on nc, in order, each slice entering c.sent
// before its request leaves. Read requests are 24 bytes each: they are
// gathered and written with one syscall; a write request goes out with
// its bytes in one writev. Only the holder of c.writing calls it. False
// means the connection broke: every slice of q has been failed, or will
// be by drain.
func (c *tcpConn) send(nc net.Conn, q []*slice) bool {
	c.hdrs = c.hdrs[:0]
	flush := func(bufs net.Buffers) error {
		if len(c.hdrs) > 0 {
			bufs = append(net.Buffers{c.hdrs}, bufs...)
		}
		c.hdrs = c.hdrs[:0]
		if len(bufs) == 0 {
			return nil
		}
		_, err := bufs.WriteTo(nc)
		return err
	}
	for i, s := range q {
		// The reader wakes as the slice is queued, before its request
		// leaves: it is then waiting on the socket when the response
		// comes (woken after the write, it cost chains of 16 blocks a
		// tenth of their rate). After pending counts the slice: see
		// tcpPeer.undrive.
		c.pending.Add(1)
		if c.peer.drivers.Load() == 0 || !c.drivable() {
			c.kickReader()
		}
		select {
		case c.sent <- s:
		case <-c.closing:
			c.pending.Add(-1)
			for _, rest := range q[i:] {
				rest.finish(c.error())
			}
			return false
		}
		if o := s.op; o.named {
			var hdr [tcpNamedBytes]byte
			hdr[0] = tcpNamedRead
			binary.LittleEndian.PutUint16(hdr[2:], uint16(3+len(o.name.Tenant)+len(o.name.Namespace)+len(o.name.Key)))
			binary.LittleEndian.PutUint64(hdr[8:], s.offset)
			binary.LittleEndian.PutUint64(hdr[16:], uint64(len(s.local)))
			binary.LittleEndian.PutUint64(hdr[24:], o.bytes)
			c.hdrs = appendName(append(c.hdrs, hdr[:]...), o.name)
		} else {
			var hdr [tcpReqBytes]byte
			hdr[0] = byte(s.kind)
			binary.LittleEndian.PutUint32(hdr[4:], uint32(s.region))
			binary.LittleEndian.PutUint64(hdr[8:], s.offset)
			binary.LittleEndian.PutUint64(hdr[16:], uint64(len(s.local)))
			c.hdrs = append(c.hdrs, hdr[:]...)
		}
		var err error
		switch {
		case s.kind == Write:
			err = flush(net.Buffers{s.local})
		case i == len(q)-1 || len(c.hdrs) >= 64*tcpReqBytes:
			err = flush(nil)
		}
		if err != nil {
			c.fail(fmt.Errorf("%w: %s: %v", ErrPeer, c.addr, err))
			// Slices up to s are in sent: drain fails them. The rest
			// were never sent.
			for _, rest := range q[i+1:] {
				rest.finish(c.error())
			}
			return false
		}
	}
	return true
}

// readLoop reads the responses while no driver does: kicked when slices
// are sent with none reading the peer's responses, or when the last driver
// stops with responses to come.
func (c *tcpConn) readLoop() {
	for {
		select {
		case <-c.kick:
		case <-c.closing:
			return
		}
		for c.pending.Load() > 0 && (c.peer.drivers.Load() == 0 || !c.drivable()) {
			// Waiting under rmu: a driver that comes meanwhile waits for
			// the bytes on their way, then has the connection.
			c.rmu.Lock()
			_, err := c.step(stepWhole)
			c.rmu.Unlock()
			if err != nil {
				c.fail(err)
				return // drain fails what is still to come
			}
		}
	}
}

// tcpReading is where the responses of one connection have got to, so
// that any goroutine holding its rmu can take the reading on from there.
type tcpReading struct {
	br  *bufio.Reader
	src *sockReader // nil through TLS: br then blocks
	hdr [tcpRespBytes]byte
	nh  int    // header bytes in
	cur *slice // the read whose payload is coming, nil between responses
	off int    // cur's payload bytes in
	crc uint32 // of them, when cur is checksummed (api.ChecksumArrived's)
}

// arrived returns how many bytes have arrived and wait to be read: in
// the buffer and, through the raw socket, in the kernel's receive queue
// (SIOCINQ). Through TLS, only the buffer's.
func (r *tcpReading) arrived() uint64 {
	n := uint64(r.br.Buffered())
	if r.src != nil {
		n += r.src.queued()
	}
	return n
}

// queued is what the kernel holds unread on the socket (SIOCINQ). Safe
// to call while another goroutine reads it.
func (s *sockReader) queued() uint64 {
	var n uint64
	s.rc.Control(func(fd uintptr) {
		if q, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil && q > 0 {
			n = uint64(q)
		}
	})
	return n
}

func newTCPReading(nc net.Conn) tcpReading {
	if tc, ok := nc.(syscall.Conn); ok {
		if rc, err := tc.SyscallConn(); err == nil {
			src := &sockReader{rc: rc, nc: nc}
			src.readRaw = src.readOnce
			return tcpReading{br: bufio.NewReaderSize(src, 4<<10), src: src}
		}
	}
	return tcpReading{br: bufio.NewReaderSize(nc, 4<<10)}
}

// errWouldBlock: the socket has nothing to read now.
var errWouldBlock = errors.New("transfer: no bytes have arrived")

// sockReader reads a socket: with wait, through its net.Conn (a read that
// finds nothing parks in the netpoller until bytes arrive); without, with
// one read(2) that returns errWouldBlock when nothing has. The waiting
// reads go through the net.Conn because through the raw connection they
// cost chains of 16 blocks 6 % of their rate.
type sockReader struct {
	rc   syscall.RawConn
	nc   net.Conn
	wait bool
	// readRaw is readOnce, bound once so that a read allocates no
	// closure; p, n and err are its argument and results.
	readRaw func(fd uintptr) bool
	p       []byte
	n       int
	err     error
}

func (r *sockReader) Read(p []byte) (int, error) {
	if r.wait {
		return r.nc.Read(p)
	}
	r.p = p
	rerr := r.rc.Read(r.readRaw)
	n, err := r.n, r.err
	r.p, r.err = nil, nil
	switch {
	case rerr != nil:
		return 0, rerr
	case err == syscall.EAGAIN:
		return 0, errWouldBlock
	case err != nil:
		return 0, err
	case n <= 0:
		return 0, io.EOF
	}
	return n, nil
}

// readOnce is one read(2) of r.p, retried only when interrupted; it never
// asks to wait.
func (r *sockReader) readOnce(fd uintptr) bool {
	for {
		r.n, r.err = syscall.Read(int(fd), r.p)
		if r.err != syscall.EINTR {
			return true
		}
	}
}

// stepMode is how far step reads, and whether it waits for bytes.
type stepMode uint8

const (
	// stepArrived reads what has arrived, and never waits.
	stepArrived stepMode = iota
	// stepWaitFirst waits for bytes when none have arrived, then reads
	// what has.
	stepWaitFirst
	// stepWhole reads one whole response, waiting for its bytes as a
	// plain read does (the reader's way, which then checks for drivers).
	stepWhole
)

// step reads c's responses as mode says and finishes their slices, under
// rmu. It returns whether it read anything. An error breaks the
// connection: the caller fails c with it.
func (c *tcpConn) step(mode stepMode) (progress bool, err error) {
	if c.broken.Load() {
		return false, c.error()
	}
	r := &c.rd
	whole := mode == stepWhole || r.src == nil
	for {
		if r.src != nil {
			r.src.wait = mode == stepWhole || (mode == stepWaitFirst && !progress)
		}
		if r.cur != nil {
			s := r.cur
			piece := s.local[r.off:min(r.off+api.RecvChunkBytes, len(s.local))]
			n, err := r.br.Read(piece)
			if n > 0 {
				progress = true
				if s.op.checksum {
					r.crc = api.ChecksumArrived(r.crc, s.local, r.off, r.off+n)
				}
				r.off += n
			}
			if r.off == len(s.local) {
				s.crc, r.cur = r.crc, nil
				c.finishRead(s, nil)
				if whole {
					return progress, nil
				}
				continue
			}
			if err == errWouldBlock {
				return progress, nil
			}
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return progress, fmt.Errorf("%w: %s: %v", ErrPeer, c.addr, err)
			}
			continue
		}
		if r.nh == 0 && c.pending.Load() == 0 {
			return progress, nil
		}
		n, err := r.br.Read(r.hdr[r.nh:])
		if n > 0 {
			progress = true
			r.nh += n
		}
		if r.nh < len(r.hdr) {
			switch {
			case err == errWouldBlock:
				return progress, nil
			case err == io.EOF:
				err = io.ErrUnexpectedEOF
				fallthrough
			case err != nil:
				return progress, fmt.Errorf("%w: %s: %v", ErrPeer, c.addr, err)
			}
			continue
		}
		r.nh = 0
		var s *slice
		select {
		case s = <-c.sent:
		default:
			return progress, fmt.Errorf("%w: %s sent a response to no request", ErrPeer, c.addr)
		}
		if err := c.respond(s, r.hdr[0], binary.LittleEndian.Uint32(r.hdr[4:]), binary.LittleEndian.Uint64(r.hdr[8:])); err != nil {
			return progress, err
		}
		if whole && r.cur == nil {
			return progress, nil
		}
	}
}

// respond takes s's response header in: it finishes s, or makes it the
// read whose payload comes next. An error (a read of the wrong length)
// breaks the connection; s is finished with it.
func (c *tcpConn) respond(s *slice, status uint8, peerCRC uint32, n uint64) error {
	s.peerCRC = peerCRC
	if s.op.b.AwaitsFirstResponse() {
		// The payload that arrived with the header, or while this reader
		// waited for a processor, is no sample of the bandwidth after it;
		// nor is what the peer's other connections received meanwhile
		// (a batch's slices spread over them). Uncounted, a reader late
		// by a few milliseconds on a busy host made a shaped 50 MB/s
		// link measure 62.
		s.op.b.Responded(min(n, c.rd.arrived()) + c.peer.queuedElsewhere(c))
	}
	// The response is in: its room in the window goes to the next queued
	// slice now, so the peer has that request before it finishes this one.
	c.peer.done(s)
	switch {
	case s.op.named && status != tcpOK:
		c.finishRead(s, c.namedError(s, status, n))
	case status == tcpRefused:
		c.finishRead(s, fmt.Errorf("%w: %s refused %v of region %d [%d, +%d): no grant", api.ErrPermissionDenied, c.addr, s.kind, s.region, s.offset, len(s.local)))
	case status != tcpOK:
		c.finishRead(s, fmt.Errorf("%w: region %d [%d, +%d) on %s", ErrNoRegion, s.region, s.offset, len(s.local), c.addr))
	case s.kind == Read && n != uint64(len(s.local)):
		err := fmt.Errorf("%w: %s sent %d bytes for a %d-byte read", ErrPeer, c.addr, n, len(s.local))
		c.fail(err)
		c.finishRead(s, c.error())
		return err
	case s.kind == Read && n > 0:
		c.rd.cur, c.rd.off, c.rd.crc = s, 0, 0
	default:
		c.finishRead(s, nil)
	}
	return nil
}

// finishRead finishes s, whose response is in (or never will be).
func (c *tcpConn) finishRead(s *slice, err error) {
	c.pending.Add(-1)
	s.finish(err)
}

// namedError is what a named read's slice s failed with, by its
// response's status and length.
func (c *tcpConn) namedError(s *slice, status uint8, n uint64) error {
	name := s.op.name
	switch status {
	case tcpRefused:
		return fmt.Errorf("%w: %s refused a read of %s/%s/%x", api.ErrPermissionDenied, c.addr, name.Tenant, name.Namespace, name.Key)
	case tcpWrongSize:
		return fmt.Errorf("%w: %s holds %s/%s/%x in %d bytes, not %d", ErrBlockSize, c.addr, name.Tenant, name.Namespace, name.Key, n, s.op.bytes)
	}
	return fmt.Errorf("%w: %s holds no block %s/%s/%x", api.ErrNotFound, c.addr, name.Tenant, name.Namespace, name.Key)
}

// readPieces fills dst in reads of at most 64 KiB, the size that drains a
// socket fastest on our machines.
func readPieces(r io.Reader, dst []byte) (int, error) {
	off := 0
	for off < len(dst) {
		k, err := r.Read(dst[off:min(off+64<<10, len(dst))])
		off += k
		if err != nil && off < len(dst) {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return off, err
		}
	}
	return off, nil
}

// ServeConn serves a peer's requests on c, after its preamble, until the
// peer closes it or ctx ends. It returns when the connection is done.
// It serves no named reads.
func (t *TCP) ServeConn(ctx context.Context, c net.Conn) error {
	return t.ServeConnWith(ctx, c, Serving{})
}

// Serving is what one served connection may reach.
type Serving struct {
	// Access checks every request for a region first: a refused one is
	// answered with status 2 (its write's bytes read and dropped) and no
	// byte of the region moves. nil allows every request.
	Access Access
	// Blocks serves named reads (Op.Name): each pins its block for as
	// long as its bytes are sent, and the source decides whether this
	// caller may read it. nil answers every named read as a missing
	// block.
	Blocks BlockSource
}

// ServeConnWith is ServeConn with what the connection may reach.
func (t *TCP) ServeConnWith(ctx context.Context, c net.Conn, serving Serving) error {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	br := bufio.NewReaderSize(c, 4<<10)
	var (
		req  [tcpNamedBytes + tcpMaxName]byte
		resp [tcpRespBytes]byte
		junk []byte
	)
	respond := func(status uint8, crc uint32, n uint64, mem []byte) error {
		resp[0] = status
		binary.LittleEndian.PutUint32(resp[4:], crc)
		binary.LittleEndian.PutUint64(resp[8:], n)
		if len(mem) == 0 {
			_, err := c.Write(resp[:])
			return err
		}
		bufs := net.Buffers{resp[:], mem}
		_, err := bufs.WriteTo(c)
		return err
	}
	for {
		// Idle between requests for up to IdleTimeout; a started request,
		// its payload and its response have IOTimeout.
		c.SetDeadline(time.Now().Add(t.cfg.IdleTimeout))
		_, err := br.Peek(1)
		if err == nil {
			c.SetDeadline(time.Now().Add(t.cfg.IOTimeout))
			_, err = io.ReadFull(br, req[:tcpReqBytes])
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		off, n := binary.LittleEndian.Uint64(req[8:]), binary.LittleEndian.Uint64(req[16:])
		if req[0] == tcpNamedRead {
			nameLen := int(binary.LittleEndian.Uint16(req[2:]))
			if req[1] != 0 || binary.LittleEndian.Uint32(req[4:]) != 0 || nameLen > tcpMaxName {
				return fmt.Errorf("transfer: malformed request from %s", c.RemoteAddr())
			}
			rest := req[tcpReqBytes : tcpNamedBytes+nameLen]
			if _, err := io.ReadFull(br, rest); err != nil {
				return err
			}
			name, ok := parseName(rest[tcpNamedBytes-tcpReqBytes:])
			if !ok {
				return fmt.Errorf("transfer: malformed name in a request from %s", c.RemoteAddr())
			}
			if err := t.serveNamed(serving.Blocks, name, off, n, binary.LittleEndian.Uint64(rest), respond); err != nil {
				return err
			}
			continue
		}
		kind, region := Kind(req[0]), RegionID(binary.LittleEndian.Uint32(req[4:]))
		if (kind != Read && kind != Write) || req[1]|req[2]|req[3] != 0 {
			return fmt.Errorf("transfer: malformed request from %s", c.RemoteAddr())
		}
		var mem []byte
		if serving.Access != nil {
			err = serving.Access(ctx, kind, region, off, n)
		}
		if err == nil {
			mem, err = t.slice(region, off, n)
		}
		if err != nil {
			status := uint8(tcpMissing)
			if errors.Is(err, api.ErrPermissionDenied) {
				status = tcpRefused
			}
			if kind == Write { // keep the stream in step
				if junk == nil {
					junk = make([]byte, 64<<10)
				}
				if _, err := io.CopyBuffer(io.Discard, io.LimitReader(br, int64(n)), junk); err != nil {
					return err
				}
			}
			if err := respond(status, 0, 0, nil); err != nil {
				return err
			}
			continue
		}
		if kind == Write {
			if _, err := readPieces(br, mem); err != nil {
				return err
			}
			if err := respond(tcpOK, 0, 0, nil); err != nil {
				return err
			}
			continue
		}
		if err := respond(tcpOK, 0, n, mem); err != nil {
			return err
		}
	}
}

// serveNamed answers a named read of [off, +n) of the block name, which
// the caller expects to be size bytes long: it pins the block for as long
// as its bytes are written. A returned error ends the connection.
func (t *TCP) serveNamed(blocks BlockSource, name BlockName, off, n, size uint64, respond func(status uint8, crc uint32, n uint64, mem []byte) error) error {
	if blocks == nil {
		return respond(tcpMissing, 0, 0, nil)
	}
	pin, err := blocks.PinBlock(name)
	switch {
	case errors.Is(err, api.ErrPermissionDenied):
		return respond(tcpRefused, 0, 0, nil)
	case err != nil:
		return respond(tcpMissing, 0, 0, nil)
	}
	defer blocks.UnpinBlock(pin)
	have := uint64(len(pin.Mem))
	switch {
	case have != size:
		return respond(tcpWrongSize, pin.CRC, have, nil)
	case off > have || n > have-off:
		return respond(tcpMissing, 0, 0, nil)
	}
	return respond(tcpOK, pin.CRC, n, pin.Mem[off:off+n])
}

// Close fails every connection and waits for their goroutines.
func (t *TCP) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	peers := t.peers
	t.peers = nil
	t.mu.Unlock()
	for _, p := range peers {
		p.mu.Lock()
		for _, c := range p.conns {
			if c != nil {
				c.fail(ErrClosed)
			}
		}
		p.mu.Unlock()
	}
	t.wg.Wait()
	return nil
}
