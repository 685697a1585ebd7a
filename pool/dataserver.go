package pool

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/pool/store"
)

// The data channel's server: the framed protocol of api/wire on the
// node's TCP port (after the preamble) and on the shm socket (after the
// Hello). Errors reach the client as the status byte of a response,
// mapped once through api.Code.
//
// Same-host clients connect to the node's unix socket, receive the
// segment's file descriptor with the Hello, map it, and from then on move
// block bytes themselves: only metadata (view, release, reserve, commit)
// goes over the socket. The socket also serves the ordinary Get and Put
// frames.
//
// Trust: a client that maps the segment can write anywhere in it, as with
// any shared-memory cache (CUDA IPC, Mooncake, LMCache). The socket's file
// permissions decide who may connect. What a session holds (pins and
// reservations) is released when its connection closes, so a client that
// dies leaks nothing.

// dataStore is what the data channel needs of the store. *store.Store
// implements it.
type dataStore interface {
	blockWriter
	blockReader
	ReleaseHandle(h uint64) error
	Exists(tenant, ns []byte, keys [][]byte) ([]bool, error)
	RemoveForce(tenant, ns, key []byte, force bool) error
	Rekey(r *store.Reservation, key []byte) error
	ReserveSpare(tenant, ns, key []byte, size int64) (*store.Reservation, error)
	ValidateSize(size int64) error
}

// dataServer serves data connections.
type dataServer struct {
	store       dataStore
	replicas    replicator
	fetch       chainFetcher
	leases      leaseLimits
	metrics     *metrics
	log         *slog.Logger
	ioTimeout   time.Duration
	idleTimeout time.Duration
	spinWait    time.Duration  // see ServerConfig.SpinWait
	noBench     bool           // see ServerConfig.NoBenchFrames
	spinners    *wire.Spinners // shared by every connection's reader
	// sweeper serves the mailboxes of same-host sessions from other
	// processes; nil: each session's reader watches its own.
	sweeper *mailboxSweeper
	gate    *gatekeeper // nil: every caller may do everything
	// spares counts the reservations sessions hold for their next puts
	// (see session.spare): open reservations nobody leaked.
	spares atomic.Int64
	// grants, when set (a secured node), records what peer nodes pinned
	// and reserved, which is all the transports let them touch.
	grants *grants
	// hello is what a same-host client receives first: the Hello and the
	// descriptors of the segment and of the version words.
	hello func() (*wire.Hello, []int)
}

// sourceBuf is what OpSource sends: the link baseline does not care about
// the bytes, only that they are not copied from anywhere first.
var sourceBuf = make([]byte, 4<<20)

// dataConn is the server side of one data connection. sess holds the
// pins and reservations the connection takes (view, reserve): a same-host
// client's over the unix socket, a peer node's over TCP.
type dataConn struct {
	ctx  context.Context
	s    *dataServer
	c    net.Conn
	br   *bufio.Reader
	req  wire.Request
	rbuf [wire.RequestBufferBytes]byte
	// out holds responses not yet written: while the next request of a
	// pipelined batch is already here (see pipelined), they wait to go
	// out with its answer, so a batch of 64 pins costs one write, not 64
	// (each a loopback send that also wakes the reader). Everything the
	// connection writes goes after them, and the serve loop writes them
	// before it waits for input.
	out []byte
	// iov and bufs are writeAfterQueued's gather list, kept here so a Get
	// allocates none.
	iov  [2][]byte
	bufs net.Buffers
	sess *session
	junk []byte // scratch for discarded bytes, allocated on first use

	// A same-host session's: sr reads its socket; mbox is the mailbox
	// its client handed over (OpMailbox), mapped at mboxMem, nil until
	// then; mreq and mrd hold and read the frames of the post being
	// served, during which inMailbox holds the answers back from the
	// socket (see serveMailbox).
	sr        *wire.SessionReader
	mbox      *wire.Mailbox
	mboxMem   []byte
	mreq      []byte
	mrd       bytes.Reader
	inMailbox bool

	// Posts may be served outside the serve loop (servePostAside): by a
	// same-process client in its own goroutine (see wire.LocalServer) or
	// by the node's sweeper, so mu serializes the serving of frames and
	// posts (and the session's end) between those goroutines and the
	// serve loop; ended is set, under mu, once the session has ended;
	// localPosts counts the posts served aside, which keep the session
	// from idling out; unregister removes the session's token. mu is
	// taken on every session, where little contends for it.
	mu         sync.Mutex
	ended      bool
	localPosts atomic.Uint64
	unregister func()
	// swept: the node's sweeper watches the session's mailbox too (set
	// once, when the mailbox opens).
	swept bool
}

// session is what one connection holds: pins and reservations taken by a
// same-host client over the unix socket, or by a peer node pulling or
// pushing blocks over TCP.
type session struct {
	pins map[uint64]int                // pin handle -> times held
	res  map[uint64]*store.Reservation // open reservations by handle
	// caller is who opened the session; callerErr, when set, is why the
	// node does not accept its credentials: every frame is answered with
	// it and the connection closes.
	caller    auth.Identity
	callerErr error
	// grants this session gave its caller, a peer node, by pin or
	// reservation handle; nil unless the node keeps grants.
	grants map[uint64]grant
	// spare holds the handles of the reservations the node made ahead of
	// this session's next puts (wire.FlagReserveNext), 0 where none:
	// maxSessionSpares at most, so that a writer whose commits go out
	// ahead of their answers (a write-behind put) copies into one while
	// the node makes the next.
	spare [maxSessionSpares]uint64
	// spares counts the node's spares (dataServer.spares); nil outside a
	// data server.
	spares *atomic.Int64
	// shm: the session came through the shm socket, and may hand over a
	// mailbox.
	shm bool
	// open counts the reservations in res, large those of more than
	// quickFillBytes (see filling).
	open, large atomic.Int32
}

func newSession() *session {
	return &session{pins: map[uint64]int{}, res: map[uint64]*store.Reservation{}}
}

// newCallerSession is a session for a caller identified (or not) at the
// door.
func newCallerSession(id auth.Identity, err error) *session {
	s := newSession()
	s.caller, s.callerErr = id, err
	return s
}

// end releases everything the session holds.
func (s *session) end(st dataStore, g *grants) {
	for h, k := range s.pins {
		for range k {
			st.ReleaseHandle(h)
			s.ungrant(g, h, false)
		}
	}
	for h := range s.res {
		s.ungrant(g, h, false)
	}
	for _, r := range s.res {
		st.Abort(r)
	}
	s.pins, s.res = nil, nil
	s.open.Store(0)
	s.large.Store(0)
	for _, h := range s.spare {
		s.endSpare(h)
	}
}

// maxSessionSpares bounds the spares a session holds (session.spare).
const maxSessionSpares = 4

// spareRoom reports whether the session may hold one more spare.
func (s *session) spareRoom() bool { return slices.Contains(s.spare[:], 0) }

// addSpare notes handle as one of the session's spares. REQUIRES:
// spareRoom.
func (s *session) addSpare(handle uint64) {
	s.spare[slices.Index(s.spare[:], 0)] = handle
	s.spares.Add(1)
}

// endSpare notes that the reservation handle has ended (committed or
// aborted), which matters when it is the session's spare.
func (s *session) endSpare(handle uint64) {
	if i := slices.Index(s.spare[:], handle); handle != 0 && i >= 0 {
		s.spare[i] = 0
		s.spares.Add(-1)
	}
}

// grant lets the session's caller, when it is a peer node, touch gr of
// the arena through a transport while handle is held.
func (s *session) grant(g *grants, handle uint64, gr grant) {
	if g == nil || s.caller.Role != auth.RoleNode {
		return
	}
	if s.grants == nil {
		s.grants = map[uint64]grant{}
	}
	s.grants[handle] = gr
	g.add(s.caller.Name, gr)
}

// ungrant takes back one hold of handle's grant; last forgets it.
func (s *session) ungrant(g *grants, handle uint64, last bool) {
	if gr, ok := s.grants[handle]; ok {
		g.remove(s.caller.Name, gr)
		if last {
			delete(s.grants, handle)
		}
	}
}

// serveShm greets a same-host client with the Hello and the segment's
// descriptors, then serves its session.
func (s *dataServer) serveShm(c *net.UnixConn) {
	sess := newSession()
	sess.shm = true
	if s.gate != nil && !s.gate.open {
		sess.caller, sess.callerErr = localCaller(c, s.gate.shmAllow)
	}
	hello, fds := s.hello()
	c.SetWriteDeadline(time.Now().Add(s.ioTimeout))
	err := wire.SendHello(c, hello, fds...)
	c.SetWriteDeadline(time.Time{})
	if err != nil {
		s.log.Warn("shm hello failed", "err", err)
		return
	}
	s.serve(context.Background(), c, sess)
}

// localCaller identifies a same-host client on the shm socket by its
// uid (SO_PEERCRED). The node's own user could read the node's memory
// anyway, and any client of the socket maps the whole arena: it is
// trusted with everything (admin), as is a uid allowed without a tenant.
// A uid allowed as UID=TENANT acts for that tenant only. Any other uid is
// refused.
func localCaller(c *net.UnixConn, allow map[uint32]string) (auth.Identity, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return auth.Identity{}, err
	}
	var cred *unix.Ucred
	var cerr error
	raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil {
		return auth.Identity{}, fmt.Errorf("%w: shm socket peer credentials: %v", api.ErrUnauthenticated, cerr)
	}
	name := fmt.Sprintf("local-uid-%d", cred.Uid)
	if int(cred.Uid) == os.Getuid() {
		return auth.Identity{Role: auth.RoleAdmin, Name: name}, nil
	}
	tenant, ok := allow[cred.Uid]
	switch {
	case !ok:
		return auth.Identity{}, fmt.Errorf("%w: uid %d may not use this node's shared memory (see --shm-allow)", api.ErrPermissionDenied, cred.Uid)
	case tenant == "":
		return auth.Identity{Role: auth.RoleAdmin, Name: name}, nil
	}
	return auth.Identity{Role: auth.RoleTenant, Tenant: tenant, Name: name}, nil
}

// reservationSpin is how long a session with an open reservation polls for
// its commit: about the time to fill 8 MiB at memory speed.
const reservationSpin = time.Millisecond

// quickFillBytes bounds the reservations a session's reader stays awake
// for (reservationSpin) even while writers outnumber half the cores: one
// this small is filled and committed within a few hundred microseconds
// even by writers taking turns on the cores, and a commit that finds the
// reader asleep costs more than the spin. The writer wakes it through the
// socket (15-20 µs in a write(2) on a paravirtualized host), and the
// node's thread, woken, interrupts a copy on the other core, which on
// that host costs the copy 33-41 µs of progress (see
// BenchmarkCopyInterrupted in api/internal/crc32c). Measured there, 2 MiB
// blocks from four writers to a node in another process: 0.38-0.41 of
// memcpy spinning, 0.33-0.37 not. A 16 MiB reservation takes a
// millisecond or more to fill; a spin that long takes the core from the
// copies (0.66-0.74 against 0.72-0.77 not spinning).
const quickFillBytes = 4 << 20

// addRes and dropRes open and close a reservation of the session.
func (s *session) addRes(r *store.Reservation) {
	s.res[r.Handle()] = r
	s.open.Add(1)
	if r.Size() > quickFillBytes {
		s.large.Add(1)
	}
}

func (s *session) dropRes(r *store.Reservation) {
	delete(s.res, r.Handle())
	s.open.Add(-1)
	if r.Size() > quickFillBytes {
		s.large.Add(-1)
	}
}

// filling reports whether the session holds an open reservation, and
// quick whether every one is at most quickFillBytes. Safe for concurrent
// use: the session's reader asks while the node's sweeper may serve its
// posts.
func (s *session) filling() (open, quick bool) {
	return s.open.Load() > 0, s.large.Load() == 0
}

// serve runs one data connection until the peer closes it, a frame is
// malformed, or the node shuts down (which closes c).
func (s *dataServer) serve(ctx context.Context, c net.Conn, sess *session) {
	sess.spares = &s.spares
	d := &dataConn{ctx: ctx, s: s, c: c, out: make([]byte, 0, 4<<10), sess: sess}
	var spin func() time.Duration
	if s.spinWait > 0 {
		spin = func() time.Duration {
			if d.swept && s.sweeper.sweeping() {
				return 0 // the sweeper watches the mailbox: no spin
			}
			// A same-host writer holding a reservation is filling it and
			// commits the moment it is done: stay awake for that, while
			// few sessions write, or while its reservations are small
			// (see quickFillBytes). Each writer's copy keeps a core busy;
			// once writers outnumber half the cores, a long spin here
			// takes the core another writer copies on (measured, 2 cores
			// and 2 writers: 0.63 of memcpy spinning, 0.95 not).
			if open, quick := sess.filling(); open && (s.spares.Load() <= int64(max(1, runtime.GOMAXPROCS(0)/2)) || quick) {
				return max(s.spinWait, reservationSpin)
			}
			return s.spinWait
		}
	}
	if uc, ok := c.(*net.UnixConn); ok && sess.shm {
		sr, err := wire.NewSessionReader(uc, spin, s.spinners)
		if err != nil {
			s.log.Warn("shm session", "err", err)
			return
		}
		d.sr = sr
		d.br = bufio.NewReaderSize(sr, 64<<10)
	} else {
		d.br = bufio.NewReaderSize(wire.NewPollingReader(c, spin, s.spinners), 64<<10)
	}
	defer d.end()
	for ctx.Err() == nil {
		// Idle between frames for up to idleTimeout; once a frame's first
		// byte is in, the rest of it has ioTimeout. Only here, between
		// frames, may a read end for a post in the mailbox.
		c.SetReadDeadline(time.Now().Add(s.idleTimeout))
		posts := d.localPosts.Load()
		d.arm(true)
		_, err := d.br.Peek(1)
		d.arm(false)
		if errors.Is(err, wire.ErrMailboxRequest) {
			c.SetDeadline(time.Now().Add(s.ioTimeout))
			d.mu.Lock()
			var err error
			if d.mbox.Pending() { // (unless the sweeper served it meanwhile)
				err = d.serveMailbox(servedByReader)
			}
			d.mu.Unlock()
			if err != nil {
				d.logMailboxClose(err)
				return
			}
			if d.swept {
				s.sweeper.served(d)
			}
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && d.localPosts.Load() != posts {
			continue // its client served posts meanwhile: not idle
		}
		if err = d.serveFrame(err); err != nil {
			return
		}
	}
}

// serveFrame reads and serves the frame whose first byte is buffered (or
// handles peekErr, the reason none is), under the session's lock; an
// error means the connection must close.
func (d *dataConn) serveFrame(peekErr error) error {
	s, c := d.s, d.c
	d.mu.Lock()
	defer d.mu.Unlock()
	err := peekErr
	if err == nil {
		c.SetReadDeadline(time.Now().Add(s.ioTimeout))
		err = wire.ReadRequest(d.br, d.rbuf[:], &d.req)
	}
	if err != nil {
		if errors.Is(err, wire.ErrProtocol) {
			s.metrics.dataOp(wire.Op(0), codes.InvalidArgument)
			d.respondClose(api.Errorf(api.ErrInvalidArgument, "%v", err))
			s.log.Warn("closing data connection after a malformed frame", "remote", remote(c), "err", err)
		} else if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, os.ErrDeadlineExceeded) {
			s.log.Debug("data connection ended", "remote", remote(c), "err", err)
		}
		return err
	}
	c.SetDeadline(time.Now().Add(s.ioTimeout))
	err = d.handle()
	if err == nil && !d.pipelined() {
		err = d.flush()
	}
	if err != nil {
		// The stream is out of step (bad trailer, short read, failed
		// write): it cannot carry another frame. What it answered
		// before goes out first, as far as it can.
		d.flush()
		if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, errRefused) {
			s.log.Warn("closing data connection", "remote", remote(c), "op", d.req.Op.String(), "err", err)
		}
	}
	return err
}

// end releases what the session holds and, for a same-host session,
// its mailbox, under the session's lock: a client in this process that
// serves its own posts finds it ended.
func (d *dataConn) end() {
	if d.swept {
		d.s.sweeper.remove(d)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ended = true
	if d.unregister != nil {
		d.unregister()
	}
	d.sess.end(d.s.store, d.s.grants)
	if d.sr != nil {
		d.closeMailbox()
	}
}

func remote(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil && a.String() != "" {
		return a.String()
	}
	return "unix"
}

// errRefused ends a data connection whose caller may not do what it
// asked; the client was told why.
var errRefused = errors.New("pool: request refused")

// authorize checks d.req against the access table, before any of its
// work (or any byte of its value) is done.
func (d *dataConn) authorize() error {
	if d.sess.callerErr != nil {
		return d.sess.callerErr
	}
	if d.s.gate == nil || d.s.gate.open {
		return nil // everyone may do everything: no per-frame work
	}
	r := &d.req
	switch r.Op {
	case wire.OpGet, wire.OpView, wire.OpExists:
		return d.s.gate.check(d.sess.caller, auth.OpRead, string(r.Tenant))
	case wire.OpPut, wire.OpReserve, wire.OpRemove:
		return d.s.gate.check(d.sess.caller, auth.OpWrite, string(r.Tenant))
	case wire.OpSource, wire.OpSink:
		return d.s.gate.check(d.sess.caller, auth.OpInfo, "")
	case wire.OpFetch:
		return d.s.gate.check(d.sess.caller, auth.OpPlan, string(r.Tenant))
	}
	// Release, Commit and Abort act on what this session pinned or
	// reserved, which was checked then; still, they are no business of a
	// caller the node does not know.
	return d.s.gate.check(d.sess.caller, auth.OpInfo, "")
}

// refusalLinger is how long a refused connection's input is drained
// before it closes.
const refusalLinger = 200 * time.Millisecond

// linger half-closes the connection after a refusal and drains, for a
// moment, what the client had already sent (a put's value): closing with
// unread input would reset the connection, and the reset can destroy the
// answer before the client reads why it was refused.
func (d *dataConn) linger() {
	if cw, ok := d.c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	d.c.SetReadDeadline(time.Now().Add(refusalLinger))
	io.Copy(io.Discard, d.br)
}

// handle serves d.req. A returned error means the connection must close.
func (d *dataConn) handle() error {
	r, st := &d.req, d.s.store
	if err := d.authorize(); err != nil {
		d.s.metrics.dataOp(r.Op, api.Code(err))
		d.respondClose(err)
		if !d.inMailbox {
			// (A post's answer is in the mailbox, which a reset of the
			// socket does not touch.)
			d.linger()
		}
		return errRefused
	}
	switch r.Op {
	case wire.OpGet:
		return d.get()
	case wire.OpPut:
		return d.put()
	case wire.OpRemove:
		err := st.RemoveForce(r.Tenant, r.Namespace, r.Key, r.Flags&wire.FlagForce != 0)
		d.s.metrics.dataOp(r.Op, api.Code(err))
		return d.respond(err, &wire.Response{})
	case wire.OpExists:
		in, err := st.Exists(r.Tenant, r.Namespace, [][]byte{r.Key})
		d.s.metrics.dataOp(r.Op, api.Code(err))
		resp := &wire.Response{}
		if err == nil && in[0] {
			resp.Flags = wire.FlagExisted
		}
		return d.respond(err, resp)
	case wire.OpSource:
		return d.source()
	case wire.OpSink:
		return d.sink()
	case wire.OpFetch:
		return d.fetchChain()
	case wire.OpMailbox:
		token, err := d.openMailbox()
		d.s.metrics.dataOp(r.Op, api.Code(err))
		return d.respond(err, &wire.Response{Handle: token})
	case wire.OpWake:
		// It woke the serve loop, which serves the mailbox next. One
		// that finds nothing posted came ahead of a writer's commit
		// (wire.Conn.WakeAhead): the next read spins for it. (A wake
		// behind a post leaves the reader's backoff alone, so a client
		// whose posts come far apart is not spun for after each.)
		if d.sr != nil && d.mbox != nil && !d.mbox.Pending() {
			d.sr.ExpectPost()
		}
		return nil
	case wire.OpView:
		pin, err := d.acquire()
		if err != nil {
			return d.respondErr(err)
		}
		d.sess.pins[pin.Handle()]++
		d.sess.grant(d.s.grants, pin.Handle(), grant{offset: uint64(pin.Offset), length: uint64(len(pin.Mem))})
		return d.respond(nil, &wire.Response{CRC: pin.CRC, ValueLen: uint64(len(pin.Mem)), Offset: uint64(pin.Offset), Handle: pin.Handle()})
	case wire.OpRelease:
		if d.sess.pins[r.Handle] == 0 {
			d.s.metrics.dataOp(r.Op, codes.InvalidArgument)
			return fmt.Errorf("release of pin %#x that this session does not hold", r.Handle)
		}
		d.sess.ungrant(d.s.grants, r.Handle, d.sess.pins[r.Handle] == 1)
		if d.sess.pins[r.Handle]--; d.sess.pins[r.Handle] == 0 {
			delete(d.sess.pins, r.Handle)
		}
		err := st.ReleaseHandle(r.Handle)
		d.s.metrics.dataOp(r.Op, api.Code(err))
		return err
	case wire.OpReserve:
		if r.Flags&wire.FlagReserveNext != 0 {
			// A spare asked for on its own (a write-behind writer's
			// second).
			var resp wire.Response
			err := d.reserveSpare(r.Tenant, r.Namespace, r.Key, int64(min(r.ValueLen, 1<<62)), &resp)
			d.s.metrics.dataOp(r.Op, api.Code(err))
			if err != nil {
				return d.respondErr(err)
			}
			return d.respond(nil, &resp)
		}
		res, err := st.Reserve(r.Tenant, r.Namespace, r.Key, int64(min(r.ValueLen, 1<<62)), false)
		d.s.metrics.dataOp(r.Op, api.Code(err))
		if err != nil {
			return d.respondErr(err)
		}
		d.sess.addRes(res)
		d.sess.grant(d.s.grants, res.Handle(), grant{offset: uint64(res.Offset()), length: r.ValueLen, write: true, reservation: res.Handle()})
		return d.respond(nil, &wire.Response{ValueLen: r.ValueLen, Offset: uint64(res.Offset()), Handle: res.Handle()})
	case wire.OpCommit:
		res, ok := d.sess.res[r.Handle]
		if !ok {
			d.s.metrics.dataOp(r.Op, codes.FailedPrecondition)
			return d.respondErr(api.Errorf(api.ErrFailedPrecondition, "pool: no open reservation %d in this session", r.Handle))
		}
		tenant, namespace, _ := res.Name()
		if len(r.Key) > 0 {
			// A spare reserved ahead, named now (see FlagReserveNext).
			var err error
			if string(r.Tenant) == tenant && string(r.Namespace) == namespace {
				err = st.Rekey(res, r.Key)
			} else {
				err = api.Errorf(api.ErrInvalidArgument, "pool: reservation %d is for %s/%s, not %s/%s", r.Handle, tenant, namespace, r.Tenant, r.Namespace)
			}
			if err != nil {
				d.s.metrics.dataOp(r.Op, api.Code(err))
				return d.respondErr(err) // the reservation stays open
			}
		}
		d.sess.ungrant(d.s.grants, r.Handle, true)
		d.sess.dropRes(res)
		d.sess.endSpare(r.Handle)
		verify := r.Flags&wire.FlagChecksum != 0
		cr, err := st.Commit(res, r.CRC, !verify && r.Flags&wire.FlagWriterChecksum != 0, r.CRC, verify)
		if err == nil && r.Replicas > 1 {
			_, _, key := res.Name()
			err = d.replicate([]byte(tenant), []byte(namespace), key)
		}
		d.s.metrics.dataOp(r.Op, api.Code(err))
		resp := committed(cr, uint64(res.Size()))
		if err == nil && r.Flags&wire.FlagReserveNext != 0 {
			// The next put reserves when there is no room for a spare.
			tenant, namespace, key := res.Name()
			_ = d.reserveSpare([]byte(tenant), []byte(namespace), key, res.Size(), resp)
		}
		return d.respond(err, resp)
	case wire.OpAbort:
		if res, ok := d.sess.res[r.Handle]; ok {
			d.sess.ungrant(d.s.grants, r.Handle, true)
			d.sess.dropRes(res)
			d.sess.endSpare(r.Handle)
			st.Abort(res)
		}
		d.s.metrics.dataOp(r.Op, codes.OK)
		return nil
	}
	return fmt.Errorf("unhandled op %v", r.Op)
}

// reserveSpare reserves a place for the session's next put of size
// bytes under tenant and namespace (key names it until a named commit
// renames it) and names it in resp. The session owns it: the sweeper
// leaves it alone, and it is aborted when the session ends. A spare never
// evicts (Store.ReserveSpare): without room for one, the next put
// reserves, which may. A session holds maxSessionSpares at most.
func (d *dataConn) reserveSpare(tenant, namespace, key []byte, size int64, resp *wire.Response) error {
	if d.sess.spares == nil || !d.sess.spareRoom() {
		return api.Errorf(api.ErrResourceExhausted, "pool: the session holds %d spares already", maxSessionSpares)
	}
	spare, err := d.s.store.ReserveSpare(tenant, namespace, key, size)
	if err != nil {
		return err
	}
	d.sess.addRes(spare)
	d.sess.addSpare(spare.Handle())
	d.sess.grant(d.s.grants, spare.Handle(), grant{offset: uint64(spare.Offset()), length: uint64(spare.Size()), write: true, reservation: spare.Handle()})
	resp.Flags |= wire.FlagReserved
	resp.Offset, resp.Handle, resp.ValueLen = uint64(spare.Offset()), spare.Handle(), uint64(size)
	return nil
}

// committed is the response to a Put or Commit.
func committed(cr store.CommitResult, size uint64) *wire.Response {
	resp := &wire.Response{CRC: cr.CRC, ValueLen: size}
	if cr.Existed {
		resp.Flags = wire.FlagExisted
	}
	return resp
}

// acquire pins the requested block, taking the read lease it asks for,
// and counts the op.
func (d *dataConn) acquire() (store.Pin, error) {
	r := &d.req
	pin, err := d.s.store.Acquire(r.Tenant, r.Namespace, r.Key)
	if err == nil && r.Flags&wire.FlagLease != 0 {
		if l := d.s.leases.of(r.LeaseMs, true); l > 0 {
			d.s.store.Lease(r.Tenant, r.Namespace, [][]byte{r.Key}, l)
		}
	}
	d.s.metrics.dataOp(r.Op, api.Code(err))
	return pin, err
}

// replicate places the copies of the block a Put or Commit asks for.
func (d *dataConn) replicate(tenant, namespace, key []byte) error {
	if d.req.Replicas <= 1 {
		return nil
	}
	// Placing copies can take a while; the connection's I/O deadline
	// must not cut the response short.
	d.c.SetDeadline(time.Time{})
	_, err := d.s.replicas.Replicate(d.ctx, tenant, namespace, key, int(d.req.Replicas))
	return err
}

// respond queues the answer to the request being served (resp, or err);
// the serve loop writes it.
func (d *dataConn) respond(err error, resp *wire.Response) error {
	if err != nil {
		return d.respondErr(err)
	}
	d.out = wire.AppendResponse(d.out, resp)
	return nil
}

// flush writes the queued responses.
func (d *dataConn) flush() error {
	if len(d.out) == 0 || d.inMailbox {
		return nil
	}
	_, err := d.c.Write(d.out)
	d.out = d.out[:0]
	return err
}

// writeAfterQueued writes the queued responses, then b (one writev).
func (d *dataConn) writeAfterQueued(b []byte) error {
	d.iov = [2][]byte{d.out, b}
	d.bufs = d.iov[:]
	_, err := d.bufs.WriteTo(d.c)
	d.iov, d.out = [2][]byte{}, d.out[:0]
	return err
}

// pipelined reports whether the whole of the next request is already
// buffered and is one whose serving neither waits for input nor takes
// long (a pin, release, get, remove, reservation or commit without
// replicas): its answer may then join the queued ones. A request still
// arriving, or one that reads a value or works for a while (Put, Fetch),
// gets the queue written first.
func (d *dataConn) pipelined() bool {
	n := d.br.Buffered()
	if n < wire.RequestHeaderBytes {
		return false
	}
	h, err := d.br.Peek(wire.RequestHeaderBytes)
	if err != nil {
		return false
	}
	var next wire.Request
	rest, err := wire.DecodeRequestHeader(h, &next)
	if err != nil || n < wire.RequestHeaderBytes+rest {
		return false
	}
	switch next.Op {
	case wire.OpView, wire.OpRelease, wire.OpGet, wire.OpRemove, wire.OpReserve, wire.OpAbort, wire.OpExists:
		return true
	case wire.OpCommit:
		return next.Replicas <= 1
	}
	return false
}

func (d *dataConn) respondErr(err error) error {
	return d.respondErrFlags(err, 0)
}

// respondClose reports err and tells the client the connection ends
// here: written at once, with whatever was queued before it.
func (d *dataConn) respondClose(err error) {
	d.respondErrFlags(err, wire.FlagClose)
	d.flush()
}

func (d *dataConn) respondErrFlags(err error, flags uint8) error {
	d.out = wire.AppendResponse(d.out, &wire.Response{Status: uint8(api.Code(err)), Flags: flags, Message: err.Error()})
	return nil
}

// discard reads and drops n bytes in large reads.
func (d *dataConn) discard(n uint64) error {
	if d.junk == nil {
		d.junk = make([]byte, 256<<10)
	}
	for n > 0 {
		k, err := d.br.Read(d.junk[:min(n, uint64(len(d.junk)))])
		n -= uint64(k)
		if err != nil {
			if err == io.EOF && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			if n > 0 {
				return err
			}
		}
	}
	return nil
}

func (d *dataConn) get() error {
	pin, err := d.acquire()
	if err != nil {
		return d.respondErr(err)
	}
	defer d.s.store.Release(pin)
	d.out = wire.AppendResponse(d.out, &wire.Response{CRC: pin.CRC, ValueLen: uint64(len(pin.Mem))})
	// One writev: header and value straight from the arena.
	err = d.writeAfterQueued(pin.Mem)
	d.s.metrics.bytesSent.Add(float64(len(pin.Mem)))
	return err
}

// put reads a value into a reservation, checksumming each chunk while it is
// still in cache, checks the trailer and commits.
func (d *dataConn) put() error {
	r, st := &d.req, d.s.store
	size := r.ValueLen
	if err := st.ValidateSize(int64(min(size, 1<<62))); err != nil {
		// A size we refuse: we cannot skip a body we will not read.
		d.s.metrics.dataOp(wire.OpPut, codes.InvalidArgument)
		d.respondClose(err)
		return fmt.Errorf("refused a %d-byte put: %w", size, err)
	}
	res, err := st.Reserve(r.Tenant, r.Namespace, r.Key, int64(size), true)
	if err != nil {
		// Keep the stream in step: read and drop the value and trailer.
		if derr := d.discard(size + wire.TrailerBytes); derr != nil {
			return derr
		}
		d.s.metrics.dataOp(wire.OpPut, api.Code(err))
		return d.respondErr(err)
	}
	done := false
	defer func() {
		if !done {
			st.Abort(res)
		}
	}()
	crc, err := api.ReadChecksummed(d.br, res.Bytes())
	if err != nil {
		d.s.metrics.dataOp(wire.OpPut, codes.Canceled)
		return fmt.Errorf("value ended early: %w", err)
	}
	d.s.metrics.bytesReceived.Add(float64(size))
	var t [wire.TrailerBytes]byte
	if _, err := io.ReadFull(d.br, t[:]); err != nil {
		return fmt.Errorf("trailer: %w", err)
	}
	want, err := wire.DecodeTrailer(t[:])
	if err != nil {
		d.s.metrics.dataOp(wire.OpPut, codes.InvalidArgument)
		d.respondClose(api.Errorf(api.ErrInvalidArgument, "%v", err))
		return err
	}
	done = true
	cr, err := st.Commit(res, crc, true, want, r.Flags&wire.FlagChecksum != 0)
	if err == nil {
		err = d.replicate(r.Tenant, r.Namespace, r.Key)
	}
	d.s.metrics.dataOp(wire.OpPut, api.Code(err))
	return d.respond(err, committed(cr, 0))
}

// fetchChain serves a Fetch frame: it reads the chain, makes its blocks
// local as the gRPC Fetch does, and answers with a result per key.
func (d *dataConn) fetchChain() error {
	r := &d.req
	if r.ValueLen > wire.MaxChainBytes {
		// We cannot skip a value we will not read.
		err := api.Errorf(api.ErrInvalidArgument, "pool: a %d-byte chain; at most %d", r.ValueLen, wire.MaxChainBytes)
		d.s.metrics.dataOp(wire.OpFetch, codes.InvalidArgument)
		d.respondClose(err)
		return err
	}
	v := make([]byte, r.ValueLen)
	if _, err := io.ReadFull(d.br, v); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("chain: %w", err)
	}
	keys, err := wire.DecodeChain(v)
	if err != nil {
		d.s.metrics.dataOp(wire.OpFetch, codes.InvalidArgument)
		d.respondClose(api.Errorf(api.ErrInvalidArgument, "%v", err))
		return err
	}
	d.s.fetch.ReportCallOverhead(overheadFromMicros(r.CallOverheadUs), int(r.PreviousCallBlocks))
	// Pulling from peers takes as long as it takes (the fetch's timeout
	// bounds it), not the connection's I/O deadline.
	d.c.SetDeadline(time.Time{})
	// The client gets its answer once the blocks are committed, before
	// the fetch's bookkeeping (pin releases, link fits).
	var werr error
	_, err = d.s.fetch.Fetch(d.ctx, string(r.Tenant), string(r.Namespace), keys, time.Duration(r.TimeoutMs)*time.Millisecond, func(res []api.FetchResult) {
		d.s.metrics.dataOp(wire.OpFetch, codes.OK)
		out := make([]wire.FetchResult, len(res))
		for i, fr := range res {
			out[i] = wire.FetchResult{Status: uint8(api.Code(fr.Err)), Source: fr.Source, Size: uint64(max(fr.Size, 0)), Took: fr.Took}
			if fr.Err != nil {
				out[i].Message = fr.Err.Error()
			}
		}
		body := wire.AppendFetchResults(nil, out)
		d.out = wire.AppendResponse(d.out, &wire.Response{ValueLen: uint64(len(body))})
		d.c.SetWriteDeadline(time.Now().Add(d.s.ioTimeout))
		werr = d.writeAfterQueued(body)
	})
	if err != nil {
		d.s.metrics.dataOp(wire.OpFetch, api.Code(err))
		d.c.SetWriteDeadline(time.Now().Add(d.s.ioTimeout))
		return d.respondErr(err)
	}
	return werr
}

// benchFrame refuses a source or sink frame the node does not serve: all
// of them with NoBenchFrames, else any larger than a block. A 40-byte
// request must not buy an unbounded stream.
func (d *dataConn) benchFrame() error {
	if d.s.noBench {
		return api.Errorf(api.ErrFailedPrecondition, "pool: this node serves no %v frames (--no-bench-frames)", d.req.Op)
	}
	if err := d.s.store.ValidateSize(int64(min(d.req.ValueLen, 1<<62))); err != nil {
		return fmt.Errorf("pool: %v frame: %w", d.req.Op, err)
	}
	return nil
}

func (d *dataConn) source() error {
	size := d.req.ValueLen
	if err := d.benchFrame(); err != nil {
		d.s.metrics.dataOp(wire.OpSource, api.Code(err))
		return d.respondErr(err)
	}
	d.s.metrics.dataOp(wire.OpSource, codes.OK)
	d.out = wire.AppendResponse(d.out, &wire.Response{ValueLen: size})
	if err := d.flush(); err != nil {
		return err
	}
	for size > 0 {
		k := min(size, uint64(len(sourceBuf)))
		if _, err := d.c.Write(sourceBuf[:k]); err != nil {
			return err
		}
		size -= k
	}
	return nil
}

func (d *dataConn) sink() error {
	if err := d.benchFrame(); err != nil {
		// The value follows the header: the stream cannot go on.
		d.s.metrics.dataOp(wire.OpSink, api.Code(err))
		d.respondClose(err)
		return err
	}
	if err := d.discard(d.req.ValueLen); err != nil {
		return err
	}
	d.s.metrics.dataOp(wire.OpSink, codes.OK)
	return d.respond(nil, &wire.Response{})
}
