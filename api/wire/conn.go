package wire

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// Conn is the client side of one data-channel connection: the Go client's
// data path, the same-host session over the unix socket and a node's
// connections to its peers all speak through it. Requests are appended to
// an outgoing buffer (Queue) and written together (Flush), so any number
// of them can be pipelined in one write; responses are read back in order
// (Recv). Buffers are reused from call to call: the steady state allocates
// nothing but error messages.
//
// A Conn is not safe for concurrent use: one caller at a time (a Pool or a
// session mutex serializes them). After an I/O error, or a response with
// FlagClose, the stream is out of step and Usable reports false; the
// caller must close the Conn rather than reuse it.
type Conn struct {
	nc   net.Conn
	br   *bufio.Reader
	out  []byte
	vec  net.Buffers
	resp Response
	// status turns a non-OK response into the caller's error.
	status func(code uint8, msg string) error
	// closing is set when the node announced it closes the connection;
	// failed once an I/O error left the stream out of step.
	closing bool
	failed  bool
	// spinWait and spinners are ConnConfig's: how long a wait for a
	// mailbox's answer polls before it parks on the socket.
	spinWait time.Duration
	spinners *Spinners
	// mbox, when set, carries what Flush can send through it (see
	// UseMailbox); outMailbox and outResponses say whether the queued
	// requests can go, and how many answers they expect; answers holds
	// the mailbox's answer not yet read by Recv, copied to answerBuf.
	mbox               *Mailbox
	outMailbox         bool
	outResponses       int
	answers, answerBuf []byte
	// local, when set, serves the mailbox's posts in the caller's
	// goroutine: the node is in this process (see LocalServer).
	local LocalServer
	// ahead is the sequence number of the post PostAhead made and
	// nobody settled yet (0: none); aheadWoke says that post woke the
	// node.
	ahead     uint64
	aheadWoke bool
	// bound is the context of the innermost Bind, applied to the socket
	// only once an operation is about to touch it (arm); unbindTop is
	// the outermost Bind's unbind, made once.
	bound     binding
	unbindTop func()
	// armed numbers the bindings that reached the socket. deadlineMu
	// orders the socket's deadline between a binding's cancellation
	// (context.AfterFunc, its own goroutine) and the unbind that gives
	// the socket back: only the binding whose number is current may set
	// it.
	armed      uint64
	deadlineMu sync.Mutex
	current    uint64 // guarded by deadlineMu; 0: none
}

// binding is a Bind's context and how far it was applied to the socket:
// armed (its number, 0 until then) once its deadline is set, stop to take
// back its cancellation.
type binding struct {
	ctx   context.Context
	armed uint64
	stop  func() bool
}

// StatusError is a request the node refused, as Recv reports it when the
// Conn has no status mapping (see NewConn): the response's gRPC code and
// message.
type StatusError struct {
	Code    uint8
	Message string
}

func (e *StatusError) Error() string { return fmt.Sprintf("wire: status %d: %s", e.Code, e.Message) }

// ConnConfig configures a Conn.
type ConnConfig struct {
	// ReadBufferBytes sizes the buffered reader. Default 4 KiB: responses
	// are small and values are read straight into the caller's memory.
	ReadBufferBytes int
	// Status maps a response's non-OK status and message to the error Recv
	// returns: package api passes its one table (api.FromCode), so node
	// errors arrive as the same sentinel errors on every path. Default: a
	// *StatusError.
	Status func(code uint8, msg string) error
	// TLS, when set, makes Dial run TLS over the connection first (the
	// node tells it from plaintext by its first byte). Its ServerName
	// defaults to the host Dial is given.
	TLS *tls.Config
	// Token, when set, is sent in the preamble: the bearer token that
	// identifies the caller to a node that requires credentials.
	Token string
	// SpinWait, when positive, is how long a read that finds no response
	// yet keeps polling the socket before its goroutine parks (see
	// NewPollingReader): a round trip to a node on the same host is often
	// over sooner than a park and wake-up take. Spinning readers share
	// the slots of Spinners, which is required with a SpinWait. Default 0:
	// plain reads.
	SpinWait time.Duration
	Spinners *Spinners
	// Congestion is the TCP congestion control Dial sets on the
	// connection (see SetCongestion): "" or CongestionHost leaves the
	// host's.
	Congestion string
}

// NewConn wraps nc, which is past any preamble.
func NewConn(nc net.Conn, cfg ConnConfig) *Conn {
	if cfg.ReadBufferBytes == 0 {
		cfg.ReadBufferBytes = 4 << 10
	}
	if cfg.Status == nil {
		cfg.Status = func(code uint8, msg string) error { return &StatusError{Code: code, Message: msg} }
	}
	var r io.Reader = nc
	if cfg.SpinWait > 0 && cfg.Spinners != nil {
		spin := cfg.SpinWait
		r = NewPollingReader(nc, func() time.Duration { return spin }, cfg.Spinners)
	}
	c := &Conn{nc: nc, br: bufio.NewReaderSize(r, cfg.ReadBufferBytes), out: make([]byte, 0, RequestBufferBytes+TrailerBytes), status: cfg.Status,
		spinWait: cfg.SpinWait, spinners: cfg.Spinners, outMailbox: true}
	c.unbindTop = func() { c.unbind(binding{}) }
	return c
}

// Dial opens a TCP data connection to addr (through TLS with cfg.TLS) and
// sends the Preamble, with cfg.Token.
func Dial(ctx context.Context, addr string, cfg ConnConfig) (*Conn, error) {
	nc, err := DialPreamble(ctx, addr, Preamble, cfg.TLS, cfg.Token, cfg.Congestion)
	if err != nil {
		return nil, err
	}
	return NewConn(nc, cfg), nil
}

// DialPreamble opens a TCP connection to addr with congestion control
// congestion (CongestionControl), runs TLS over it when tlsConfig is set, and
// sends preamble with token: how a data connection or a transfer
// connection (another preamble) starts.
func DialPreamble(ctx context.Context, addr string, preamble [8]byte, tlsConfig *tls.Config, token, congestion string) (net.Conn, error) {
	d := net.Dialer{Control: CongestionControl(congestion)}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	if tlsConfig != nil {
		cfg := tlsConfig
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("wire: TLS with %s: %w", addr, err)
		}
		nc = tc
	}
	if _, err := nc.Write(AppendPreamble(nil, preamble, token)); err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return nc, nil
}

// NetConn is the underlying connection.
func (c *Conn) NetConn() net.Conn { return c.nc }

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// Usable reports whether the stream is still in step: no I/O error, and
// the node did not announce that it closes the connection.
func (c *Conn) Usable() bool { return !c.failed && !c.closing }

// Break marks the stream out of step (a response the caller will not
// read to its end): the Conn is no longer Usable, so Pool.Put closes it.
func (c *Conn) Break() { c.failed = true }

// reset clears the closing flag and any unsent requests before the Conn
// is handed to its next caller (Pool.Get does it).
func (c *Conn) reset() { c.closing = false; c.resetOut(); c.answers = nil }

// Bind applies ctx's deadline to the connection, and its cancellation
// (reads and writes fail at once), until the returned func is called.
// Without a deadline the connection has none. Binds nest: the returned
// func restores the binding before.
//
// The socket learns of ctx only when an operation is about to use it
// (arm): a call that goes through the mailbox and back never does, and
// setting a deadline and a context.AfterFunc cost a write-behind put 2 %
// of its CPU (four writers of 2 MiB blocks, perf).
func (c *Conn) Bind(ctx context.Context) (unbind func()) {
	prev := c.bound
	c.bound = binding{ctx: ctx}
	if prev.ctx == nil {
		return c.unbindTop
	}
	return func() { c.unbind(prev) }
}

// unbind takes back the innermost binding and restores prev, the one
// before it: where both reached the socket, prev's deadline again.
func (c *Conn) unbind(prev binding) {
	b := c.bound
	c.bound = prev
	if b.armed == 0 {
		return
	}
	if b.stop != nil {
		b.stop()
	}
	c.deadlineMu.Lock()
	defer c.deadlineMu.Unlock()
	c.current = prev.armed
	if prev.armed != 0 {
		c.applyDeadline(prev.ctx)
	}
}

// arm applies the innermost binding to the socket, once: every operation
// that reads or writes the socket calls it first.
func (c *Conn) arm() {
	b := &c.bound
	if b.ctx == nil || b.armed != 0 {
		return
	}
	c.armed++
	b.armed = c.armed
	c.deadlineMu.Lock()
	c.current = b.armed
	c.applyDeadline(b.ctx)
	c.deadlineMu.Unlock()
	if b.ctx.Done() != nil {
		n := b.armed
		b.stop = context.AfterFunc(b.ctx, func() {
			c.deadlineMu.Lock()
			defer c.deadlineMu.Unlock()
			if c.current == n {
				c.nc.SetDeadline(time.Unix(1, 0))
			}
		})
	}
}

// applyDeadline sets ctx's deadline on the socket: none without one, one
// long past once ctx is done. REQUIRES: c.deadlineMu.
func (c *Conn) applyDeadline(ctx context.Context) {
	switch dl, ok := ctx.Deadline(); {
	case ctx.Err() != nil:
		c.nc.SetDeadline(time.Unix(1, 0))
	case ok:
		c.nc.SetDeadline(dl)
	default:
		c.nc.SetDeadline(time.Time{})
	}
}

// Queue appends r to the requests Flush writes next.
func (c *Conn) Queue(r *Request) {
	c.out = AppendRequest(c.out, r)
	c.outMailbox = c.outMailbox && MailboxOp(r.Op) && r.Replicas <= 1
	if r.Op.HasResponse() {
		c.outResponses++
	}
}

// QueueTrailer appends a Put trailer carrying crc.
func (c *Conn) QueueTrailer(crc uint32) { c.out, c.outMailbox = AppendTrailer(c.out, crc), false }

// Queued reports whether requests wait for Flush.
func (c *Conn) Queued() bool { return len(c.out) > 0 }

// Flush writes the queued requests, followed by value when it is not nil,
// in one write (writev): a Put's header and value leave together, the
// value straight from the caller's memory.
func (c *Conn) Flush(value []byte) error {
	if value == nil && c.mailboxable() {
		if c.ahead != 0 {
			c.resetOut()
			return errPostAhead
		}
		return c.flushMailbox()
	}
	c.arm()
	var err error
	if value == nil {
		_, err = c.nc.Write(c.out)
	} else {
		c.vec = append(c.vec[:0], c.out, value)
		_, err = c.vec.WriteTo(c.nc)
	}
	c.resetOut()
	if err != nil {
		c.failed = true
	}
	return err
}

// resetOut empties the queue.
func (c *Conn) resetOut() {
	c.out, c.outMailbox, c.outResponses = c.out[:0], true, 0
}

// Recv reads the next response. An I/O error (the stream is broken) comes
// back as it is; a non-OK status comes back through ConnConfig.Status,
// with the response still readable from Response. FlagClose is noted.
func (c *Conn) Recv() (*Response, error) {
	if len(c.answers) > 0 {
		return c.recvAnswer()
	}
	c.arm()
	for {
		if err := ReadResponse(c.br, &c.resp); err != nil {
			c.failed = true
			return nil, err
		}
		if !isWake(&c.resp) {
			return c.received()
		}
		// A wake the node sent as this client stopped waiting for a
		// mailbox answer it then found (see Mailbox): no answer.
	}
}

func isWake(r *Response) bool { return r.Flags&FlagWake != 0 && r.Status == 0 }

// received notes FlagClose and maps a non-OK status of c.resp.
func (c *Conn) received() (*Response, error) {
	c.closing = c.resp.Flags&FlagClose != 0
	if c.resp.Status != 0 {
		return &c.resp, c.status(c.resp.Status, c.resp.Message)
	}
	return &c.resp, nil
}

// recvAnswer decodes the next response of the mailbox's answer.
func (c *Conn) recvAnswer() (*Response, error) {
	ml, err := DecodeResponseHeader(c.answers, &c.resp)
	if err == nil && len(c.answers) < ResponseHeaderBytes+ml {
		err = fmt.Errorf("%w: a mailbox answer ends inside a response", ErrProtocol)
	}
	if err != nil {
		c.failed, c.answers = true, nil
		return nil, err
	}
	if ml > 0 {
		c.resp.Message = string(c.answers[ResponseHeaderBytes : ResponseHeaderBytes+ml])
	}
	c.answers = c.answers[ResponseHeaderBytes+ml:]
	return c.received()
}

// UseMailbox has Flush send the requests it can through mb from now on
// (see Mailbox, and mailboxable): their answers are then read from mb by
// Recv, as they would be from the socket. The Conn's SpinWait bounds how
// long a wait for an answer polls before it parks on the socket.
func (c *Conn) UseMailbox(mb *Mailbox) { c.mbox = mb }

// ServeLocally has each post to the mailbox served by s, the node's side
// of the session in this process, in the caller's goroutine: no poll, no
// park, no wake (see LocalServer). The node agreed to it when it took
// the mailbox (FlagServeLocally).
func (c *Conn) ServeLocally(s LocalServer) { c.local = s }

// mailboxable reports whether Flush sends the queued requests through the
// mailbox: there is one, they are all ops MailboxOp allows and no commit
// asks for copies elsewhere (it waits on the network: the caller had
// better sleep on the socket than poll), at least one has a response
// (releases alone go out on the socket without a wait), and they fit.
func (c *Conn) mailboxable() bool {
	return c.mbox != nil && c.outMailbox && c.outResponses > 0 && len(c.out) <= MailboxRequestBytes
}

// flushMailbox posts the queued requests to the mailbox and waits for the
// answer, polling and then parked on the socket; Recv reads it next. An
// answer the node wrote to the socket (too long for the mailbox) is read
// from there. The socket's deadline, when the caller bound one, bounds
// the parked wait.
func (c *Conn) flushMailbox() error {
	mb := c.mbox
	seq, nodeParked := mb.Post(c.out)
	c.resetOut()
	if c.local != nil {
		c.local.ServePost()
		// Unanswered, the session ended: the socket says why (a
		// refusal, or its end).
		nodeParked = false
	}
	if nodeParked {
		if err := c.wakeNode(); err != nil {
			return err
		}
	}
	return c.awaitAnswer(mb, seq, nodeParked)
}

// errPostAhead is what a post to the mailbox returns while the answer to
// the one PostAhead made is not settled: the mailbox holds one post at a
// time.
var errPostAhead = fmt.Errorf("%w: a post is in flight: Settle it first", ErrProtocol)

// PostAhead posts the queued requests to the mailbox, waking a parked
// node, and returns without waiting for the answer, so the caller can go
// on (a write-behind writer copies its next value meanwhile); with yield
// it first gives its core to any thread waiting for one, the node's. Settle
// MUST come before the Conn's next post: it waits for the answer, which
// Recv then reads as a round trip's. It posts nothing and reports false,
// leaving the requests queued, when they cannot go through the mailbox
// (see mailboxable), the client serves its own posts (there is nothing
// to overlap: the post is served in the caller's goroutine) or a post is
// in flight already.
func (c *Conn) PostAhead(yield bool) (posted bool, err error) {
	if c.local != nil || c.ahead != 0 || !c.mailboxable() {
		return false, nil
	}
	seq, nodeParked := c.mbox.Post(c.out)
	c.resetOut()
	if nodeParked {
		if err := c.wakeNode(); err != nil {
			return false, err
		}
	}
	c.ahead, c.aheadWoke = seq, nodeParked
	if yield {
		// Give the core to the node's thread, woken or sweeping, if it
		// waits for one: the writer goes on copying, and a copier holds
		// its core for the scheduler's whole slice, which left the
		// node's answer a post or two behind (four writers of 2 MiB
		// blocks on two vCPUs: a writer out of spares waited for the
		// answer after 29 % of its puts, 2 % with the yield).
		syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
	}
	return true, nil
}

// Ahead reports whether a post PostAhead made awaits Settle, and whether
// its answer is in.
func (c *Conn) Ahead() (inFlight, answered bool) {
	return c.ahead != 0, c.ahead != 0 && c.mbox.Answered(c.ahead)
}

// CanPostAhead reports whether PostAhead can post: the Conn has a
// mailbox, and the client does not serve its own posts.
func (c *Conn) CanPostAhead() bool { return c.mbox != nil && c.local == nil }

// Settle waits for the answer to the post PostAhead made, polling and
// then parked on the socket as a round trip does (under the deadline the
// caller bound), and has Recv read it next. Without a post in flight it
// does nothing.
func (c *Conn) Settle() error {
	seq := c.ahead
	if seq == 0 {
		return nil
	}
	c.ahead = 0
	return c.awaitAnswer(c.mbox, seq, c.aheadWoke)
}

// wakeNode sends OpWake on the socket: the node's goroutine for the
// session, parked there, wakes and serves the mailbox.
func (c *Conn) wakeNode() error {
	c.Queue(&Request{Op: OpWake})
	c.arm()
	_, err := c.nc.Write(c.out)
	c.resetOut()
	if err != nil {
		c.failed = true
	}
	return err
}

// WakeAhead wakes the node with OpWake when its side of the mailbox is
// parked, for a post the caller is about to make: a writer sends it a
// little before the end of the copy its commit follows, so the node's
// wake-up runs beside the copy instead of after the post, and the node
// is watching when the post comes (its reader spins a while after a
// wake). Nothing happens without a mailbox or for a client in the node's
// own process.
func (c *Conn) WakeAhead() error {
	if c.mbox == nil || c.local != nil || c.spinWait <= 0 || !c.mbox.NodeParked() {
		return nil
	}
	return c.wakeNode()
}

// awaitAnswer waits for the answer to post seq, polling (unless this
// goroutine served the post itself) and then parked on the socket, and
// has Recv read it next: copied out of mb, or, where the node wrote it to
// the socket (too long for the mailbox), from there. A post the node
// refused on the socket leaves Recv to read why. woken says the post
// woke the node already.
//
// A node that looked awake when the post was made, yet has not answered
// by the end of the poll, is woken before the client parks: its watcher
// (a sweeper of many sessions' mailboxes that yields its core between
// looks) may be waiting for a core that a long copy holds, and the
// session's own goroutine, woken, serves the post at once.
func (c *Conn) awaitAnswer(mb *Mailbox, seq uint64, woken bool) error {
	if answered := mb.Answered(seq) || c.local == nil && c.pollAnswer(mb, seq); !answered {
		if c.local == nil && !woken && c.spinWait > 0 && !mb.Answered(seq) {
			if err := c.wakeNode(); err != nil {
				return err
			}
		}
		if err := c.parkForAnswer(mb, seq); err != nil {
			return err
		}
		if !mb.Answered(seq) {
			return nil // the node refused the post on the socket: Recv reads why
		}
	}
	ans, onSocket, err := mb.Answer()
	if err != nil {
		c.failed = true
		return err
	}
	if !onSocket {
		c.answerBuf = append(c.answerBuf[:0], ans...)
		c.answers = c.answerBuf
	}
	return nil
}

// pollAnswer polls mb for the answer to post seq for up to the Conn's
// spin wait and reports whether it came.
func (c *Conn) pollAnswer(mb *Mailbox, seq uint64) bool {
	if mb.Answered(seq) {
		return true
	}
	if c.spinWait <= 0 || c.spinners == nil || !c.spinners.enter() {
		return false
	}
	defer c.spinners.exit()
	now := time.Now()
	until := now.Add(c.spinWait)
	// The node serves a pin or a commit in a microsecond or two: look
	// without a system call that long, then yield the core between
	// looks (the node's thread may be waiting for it).
	for hot, i := now.Add(min(c.spinWait, hotPollTime)), 1; ; i++ {
		if mb.Answered(seq) {
			return true
		}
		if i%64 == 0 && time.Now().After(hot) {
			break
		}
	}
	for i := 1; ; i++ {
		syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		if mb.Answered(seq) {
			return true
		}
		if i%8 == 0 && time.Now().After(until) {
			return false
		}
	}
}

// hotPollTime is how long a wait for a mailbox answer polls before it
// starts yielding its core between looks.
const hotPollTime = 4 * time.Microsecond

// parkForAnswer sleeps on the socket until the answer to post seq is in
// mb, or a response comes on the socket instead: the client's parked word
// goes up, the mailbox is looked at once more, and the node, answering,
// sends a wake (see Mailbox), which is dropped here.
func (c *Conn) parkForAnswer(mb *Mailbox, seq uint64) error {
	c.arm()
	for {
		mb.SetClientParked(true)
		if mb.Answered(seq) {
			mb.SetClientParked(false)
			return nil
		}
		h, err := c.br.Peek(ResponseHeaderBytes)
		mb.SetClientParked(false)
		if err != nil {
			c.failed = true
			if mb.Answered(seq) {
				return nil // answered, then closed (a refusal)
			}
			return noEOF(err)
		}
		var r Response
		if _, err := DecodeResponseHeader(h, &r); err != nil || !isWake(&r) {
			return nil // a response: Recv reads it
		}
		c.br.Discard(ResponseHeaderBytes)
		if mb.Answered(seq) {
			return nil
		}
	}
}

// Response is the last response Recv read.
func (c *Conn) Response() *Response { return &c.resp }

// RoundTrip sends r, with whatever was queued before it, and reads its
// response, within ctx.
func (c *Conn) RoundTrip(ctx context.Context, r *Request) (*Response, error) {
	c.Queue(r)
	if c.local != nil && c.mailboxable() {
		return c.roundTripLocally(ctx)
	}
	defer c.Bind(ctx)()
	if err := c.Flush(nil); err != nil {
		return nil, err
	}
	return c.Recv()
}

// roundTripLocally posts the queued requests to the mailbox and serves
// the post in this goroutine (ServeLocally), then reads the answer. The
// post is answered before ServePost returns, and an answer too long for
// the mailbox is in the socket by then: nothing waits on the socket, so
// ctx is not bound to it (an answer read from the socket is read whatever
// ctx says). Only a post left unanswered (the session ended) waits on the
// socket for why, under ctx. As before, a post is served even when ctx is
// done, so the session stays in step with the node.
func (c *Conn) roundTripLocally(ctx context.Context) (*Response, error) {
	mb := c.mbox
	seq, _ := mb.Post(c.out)
	c.resetOut()
	c.local.ServePost()
	if !mb.Answered(seq) {
		defer c.Bind(ctx)()
	}
	if err := c.awaitAnswer(mb, seq, false); err != nil {
		return nil, err
	}
	return c.Recv()
}

// Notify sends r, which has no response (release, abort), with whatever
// was queued before it; with r nil, just what was queued. The write may
// take up to timeout.
func (c *Conn) Notify(r *Request, timeout time.Duration) error {
	if r != nil {
		c.Queue(r)
	}
	c.nc.SetWriteDeadline(time.Now().Add(timeout))
	err := c.Flush(nil)
	c.nc.SetWriteDeadline(time.Time{})
	return err
}

// Read reads value bytes that follow a response (a Get's value), straight
// into p. It is the io.Reader of the stream.
func (c *Conn) Read(p []byte) (int, error) {
	c.arm()
	n, err := c.br.Read(p)
	if err != nil && err != io.EOF {
		c.failed = true
	}
	return n, err
}

// Discard reads and drops n value bytes, keeping the stream in step (a
// Get whose value does not fit the caller's buffer).
func (c *Conn) Discard(n uint64) error {
	c.arm()
	for n > 0 {
		k, err := c.br.Discard(int(min(n, 1<<30)))
		n -= uint64(k)
		if err != nil {
			c.failed = true
			return noEOF(err)
		}
	}
	return nil
}

// Pool keeps idle Conns to any number of addresses for reuse. It is safe
// for concurrent use.
type Pool struct {
	// Dial opens a new Conn to addr.
	Dial func(ctx context.Context, addr string) (*Conn, error)
	// MaxIdle is how many idle Conns Put keeps per address. Default 8.
	MaxIdle int

	mu     sync.Mutex
	idle   map[string][]*Conn
	closed bool
}

// ErrPoolClosed is what Get returns after Close.
var ErrPoolClosed = errors.New("wire: connection pool closed")

// Get returns an idle Conn to addr, reused, or dials a new one. The caller
// owns it until Put.
func (p *Pool) Get(ctx context.Context, addr string) (c *Conn, reused bool, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, ErrPoolClosed
	}
	if l := p.idle[addr]; len(l) > 0 {
		c = l[len(l)-1]
		p.idle[addr] = l[:len(l)-1]
		p.mu.Unlock()
		c.reset()
		return c, true, nil
	}
	p.mu.Unlock()
	c, err = p.Dial(ctx, addr)
	return c, false, err
}

// Put hands c back: kept for reuse when it is Usable and the address has
// room, closed otherwise.
func (p *Pool) Put(addr string, c *Conn) {
	if !c.Usable() || c.Queued() {
		c.Close()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	max := p.MaxIdle
	if max == 0 {
		max = 8
	}
	if p.closed || len(p.idle[addr]) >= max {
		c.Close()
		return
	}
	if p.idle == nil {
		p.idle = map[string][]*Conn{}
	}
	p.idle[addr] = append(p.idle[addr], c)
}

// Close closes every idle Conn; Conns handed out are closed when Put back.
// It is idempotent.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, l := range p.idle {
		for _, c := range l {
			c.Close()
		}
	}
	p.idle = nil
}
