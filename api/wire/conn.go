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
	return &Conn{nc: nc, br: bufio.NewReaderSize(r, cfg.ReadBufferBytes), out: make([]byte, 0, RequestBufferBytes+TrailerBytes), status: cfg.Status}
}

// Dial opens a TCP data connection to addr (through TLS with cfg.TLS) and
// sends the Preamble, with cfg.Token.
func Dial(ctx context.Context, addr string, cfg ConnConfig) (*Conn, error) {
	nc, err := DialPreamble(ctx, addr, Preamble, cfg.TLS, cfg.Token)
	if err != nil {
		return nil, err
	}
	return NewConn(nc, cfg), nil
}

// DialPreamble opens a TCP connection to addr, runs TLS over it when
// tlsConfig is set, and sends preamble with token: how a data connection
// or a transfer connection (another preamble) starts.
func DialPreamble(ctx context.Context, addr string, preamble [8]byte, tlsConfig *tls.Config, token string) (net.Conn, error) {
	var d net.Dialer
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
func (c *Conn) reset() { c.closing = false; c.out = c.out[:0] }

// Bind applies ctx's deadline to the connection, and its cancellation
// (reads and writes fail at once), until the returned func is called.
// Without a deadline the connection has none.
func (c *Conn) Bind(ctx context.Context) (unbind func()) {
	if dl, ok := ctx.Deadline(); ok {
		c.nc.SetDeadline(dl)
	} else {
		c.nc.SetDeadline(time.Time{})
	}
	if ctx.Done() == nil {
		return func() {}
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	return func() { stop() }
}

// Queue appends r to the requests Flush writes next.
func (c *Conn) Queue(r *Request) { c.out = AppendRequest(c.out, r) }

// QueueTrailer appends a Put trailer carrying crc.
func (c *Conn) QueueTrailer(crc uint32) { c.out = AppendTrailer(c.out, crc) }

// Queued reports whether requests wait for Flush.
func (c *Conn) Queued() bool { return len(c.out) > 0 }

// Flush writes the queued requests, followed by value when it is not nil,
// in one write (writev): a Put's header and value leave together, the
// value straight from the caller's memory.
func (c *Conn) Flush(value []byte) error {
	var err error
	if value == nil {
		_, err = c.nc.Write(c.out)
	} else {
		c.vec = append(c.vec[:0], c.out, value)
		_, err = c.vec.WriteTo(c.nc)
	}
	c.out = c.out[:0]
	if err != nil {
		c.failed = true
	}
	return err
}

// Recv reads the next response. An I/O error (the stream is broken) comes
// back as it is; a non-OK status comes back through ConnConfig.Status,
// with the response still readable from Response. FlagClose is noted.
func (c *Conn) Recv() (*Response, error) {
	if err := ReadResponse(c.br, &c.resp); err != nil {
		c.failed = true
		return nil, err
	}
	c.closing = c.resp.Flags&FlagClose != 0
	if c.resp.Status != 0 {
		return &c.resp, c.status(c.resp.Status, c.resp.Message)
	}
	return &c.resp, nil
}

// Response is the last response Recv read.
func (c *Conn) Response() *Response { return &c.resp }

// RoundTrip sends r, with whatever was queued before it, and reads its
// response, within ctx.
func (c *Conn) RoundTrip(ctx context.Context, r *Request) (*Response, error) {
	defer c.Bind(ctx)()
	c.Queue(r)
	if err := c.Flush(nil); err != nil {
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
	n, err := c.br.Read(p)
	if err != nil && err != io.EOF {
		c.failed = true
	}
	return n, err
}

// Discard reads and drops n value bytes, keeping the stream in step (a
// Get whose value does not fit the caller's buffer).
func (c *Conn) Discard(n uint64) error {
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
