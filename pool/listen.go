package pool

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/transfer"
)

// doors are the node's listeners and the connections they accepted. One
// TCP port carries gRPC, the data channel and the tcp transport: the
// first bytes of a connection decide which (acceptTCP). Same-host clients
// come through the shm socket, same-host peers through the shm transport's
// socket, Prometheus through the metrics listener.
type doors struct {
	tcp  net.Listener
	grpc *chanListener     // the TCP connections that turned out to be gRPC
	shm  *net.UnixListener // nil with DisableShm
	xfer *net.UnixListener // the shm transport's socket; nil with DisableShm
	http net.Listener      // nil without MetricsAddr

	// tls, when set, terminates TLS on the TCP port (SecurityConfig).
	tls *tls.Config
	// handshakeTimeout bounds how long a new connection may take to send
	// its first bytes (see ServerConfig.HandshakeTimeout).
	handshakeTimeout time.Duration
	// congestion is the TCP congestion control of the data and transfer
	// connections it accepts (ServerConfig.TCPCongestion).
	congestion string
	// transferSendBuffer is the send buffer of the transfer connections
	// it accepts (TransferConfig.ServeSendBufferBytes; ≤ 0: the kernel's).
	transferSendBuffer int64
	log                *slog.Logger
	// acceptFailed counts a failed accept of a door; nil counts nothing.
	acceptFailed func(door string)
	// sorted counts a TCP connection once its protocol is known; nil
	// counts nothing.
	sorted func(protocol string, tls bool)
	// limits caps the open connections per door and per remote address.
	limits connLimits
	// tasks runs every goroutine serving a connection (and the helpers of
	// calls), and conns tracks the open connections so shutdown can close
	// them.
	tasks tasks
	mu    sync.Mutex
	conns map[net.Conn]struct{} // nil once closing
}

func (d *doors) listen(cfg *ServerConfig) error {
	var err error
	d.conns = map[net.Conn]struct{}{}
	d.congestion = cfg.TCPCongestion
	// The port's connections inherit the listener's congestion control
	// from their first packet (see wire.CongestionControl).
	lc := net.ListenConfig{Control: wire.CongestionControl(cfg.TCPCongestion)}
	if d.tcp, err = lc.Listen(context.Background(), "tcp", cfg.ListenAddr); err != nil {
		return fmt.Errorf("pool: listen on %s: %w", cfg.ListenAddr, err)
	}
	d.grpc = newChanListener(d.tcp.Addr())
	if cfg.MetricsAddr != "" {
		if d.http, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			return fmt.Errorf("pool: listen for metrics on %s: %w", cfg.MetricsAddr, err)
		}
	}
	if !cfg.DisableShm {
		if d.shm, err = listenUnix(cfg.ShmSocket); err != nil {
			return err
		}
		if d.xfer, err = listenUnix(cfg.transferSocket()); err != nil {
			return err
		}
	}
	return nil
}

// listenUnix binds a unix socket, replacing a stale socket file that no
// live process listens on.
func listenUnix(path string) (*net.UnixListener, error) {
	addr := &net.UnixAddr{Name: path, Net: "unix"}
	l, err := net.ListenUnix("unix", addr)
	if err != nil && errors.Is(err, syscall.EADDRINUSE) {
		if c, derr := net.DialTimeout("unix", path, time.Second); derr == nil {
			c.Close()
			return nil, fmt.Errorf("pool: shm socket %s is in use by a running node", path)
		}
		if rerr := os.Remove(path); rerr != nil {
			return nil, fmt.Errorf("pool: remove stale shm socket %s: %w", path, rerr)
		}
		l, err = net.ListenUnix("unix", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("pool: listen on shm socket %s: %w", path, err)
	}
	l.SetUnlinkOnClose(true)
	return l, nil
}

// acceptTCP accepts connections on the shared port and sorts them by their
// first bytes: wire.Preamble goes to data, transfer.TCPPreamble to
// transfer (the tcp transport's server), everything else to gRPC.
//
// NB: the gRPC listener is closed by the gRPC server when it stops, not
// here, so that Serve returns nil rather than a listener error.
func (d *doors) acceptTCP(ctx context.Context, data func(c net.Conn, token string), xfer func(ctx context.Context, c net.Conn, token string) error) error {
	return d.accept(ctx, doorTCP, d.tcp.Accept, func(c net.Conn, release func()) {
		d.serve(c, release, func() bool { return d.sniff(ctx, c, release, data, xfer) })
	})
}

// The doors, as metrics and logs name them.
const (
	doorTCP         = "tcp"          // gRPC, the data channel and the tcp transport
	doorShm         = "shm"          // same-host clients
	doorShmTransfer = "shm-transfer" // same-host peers' shm transport
	doorMetrics     = "metrics"      // /metrics, /healthz, /readyz
)

// Why a connection was refused, as kvpool_pool_refused_connections_total
// names it.
const (
	refusedDoorFull   = "door_full"
	refusedRemoteFull = "remote_full"
)

// Backoff of an accept loop whose accepts fail.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// accept runs one door's accept loop until its listener closes. Every
// other error is survived: running out of descriptors (EMFILE, ENFILE) or
// memory, or a peer resetting before the accept, must shed load, never
// stop the node. While accepts keep failing the loop waits from 5 ms up to
// 1 s between tries (so the warning is logged at most about once a second)
// and counts each failure; connections it has not accepted wait in the
// kernel's backlog or are refused by it.
//
// A connection past the door's caps (connLimits) is closed at once: the
// peer sees end of file and the descriptor comes back. handle owns an
// admitted connection and must call release once it is closed.
func (d *doors) accept(ctx context.Context, door string, accept func() (net.Conn, error), handle func(c net.Conn, release func())) error {
	var delay time.Duration
	for {
		c, err := accept()
		if err == nil {
			delay = 0
			if release, ok := d.limits.admit(door, c); ok {
				handle(c, release)
			} else {
				c.Close()
			}
			continue
		}
		if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
			return nil
		}
		if d.acceptFailed != nil {
			d.acceptFailed(door)
		}
		delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
		d.log.Warn("accept failed; backing off", "door", door, "err", err, "retry_in", delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// serve runs f for the accepted connection c, tracked so shutdown closes
// c and waits for f, then closes c unless f handed it off (to gRPC). Once
// shutdown began, c is closed instead.
// release is called once c is closed here; a handed-off connection calls
// it when its new owner closes it.
func (d *doors) serve(c net.Conn, release func(), f func() (handedOff bool)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// NB: tracking and starting happen under one lock, which closeConns
	// takes before the tasks are waited for: no goroutine can be started
	// after the wait began.
	if d.conns == nil || !d.tasks.Go(func() {
		handedOff := f()
		d.untrack(c)
		if !handedOff {
			c.Close()
			release()
		}
	}) {
		c.Close()
		release()
		return
	}
	d.conns[c] = struct{}{}
}

// sniff reads the first bytes of c and serves it with the right server;
// it reports whether it handed c to gRPC, which then owns it.
//
// A TLS ClientHello (when the node has a certificate) starts a handshake,
// within the handshake timeout, and the connection inside is sorted the
// same way.
func (d *doors) sniff(ctx context.Context, c net.Conn, release func(), data func(c net.Conn, token string), xfer func(ctx context.Context, c net.Conn, token string) error) (handedOff bool) {
	var first [len(wire.Preamble)]byte
	// A connection that says nothing is closed fast: until it has sent
	// its first bytes it is only a descriptor held.
	c.SetReadDeadline(time.Now().Add(d.handshakeTimeout))
	k, err := io.ReadFull(c, first[:4])
	if err != nil {
		return false
	}
	if d.tls != nil && isTLSClientHello(first[:k]) && tlsConnOf(c) == nil {
		tc := tls.Server(&prefixConn{Conn: c, prefix: append([]byte(nil), first[:k]...)}, d.tls)
		hctx, cancel := context.WithTimeout(ctx, d.handshakeTimeout)
		defer cancel()
		c.SetDeadline(time.Now().Add(d.handshakeTimeout))
		if err := tc.HandshakeContext(hctx); err != nil {
			d.log.Warn("TLS handshake failed", "remote", remote(c), "err", err)
			return false
		}
		c.SetDeadline(time.Time{})
		return d.sniff(ctx, tc, release, data, xfer)
	}
	count := func(protocol string) {
		if d.sorted != nil {
			d.sorted(protocol, tlsConnOf(c) != nil)
		}
	}
	switch {
	case bytes.Equal(first[:4], wire.Preamble[:4]):
		count("data")
		token, err := readPreamble(c, &first, wire.Preamble)
		if err != nil {
			d.log.Warn("data connection with a bad preamble", "remote", remote(c), "err", err)
			return false
		}
		d.tuneTCP(c, 0)
		data(c, token)
	case bytes.Equal(first[:4], transfer.TCPPreamble[:4]):
		count("transfer")
		if token, err := readPreamble(c, &first, transfer.TCPPreamble); err == nil {
			c.SetReadDeadline(time.Time{})
			d.tuneTCP(c, d.transferSendBuffer)
			xfer(ctx, c, token)
		}
	default:
		// Not ours: gRPC owns it from here, replaying the bytes we read.
		count("grpc")
		c.SetReadDeadline(time.Time{})
		return d.grpc.deliver(&prefixConn{Conn: c, prefix: first[:k], release: release})
	}
	return false
}

// readPreamble reads the rest of a preamble whose first 4 bytes are in
// first, checks it against want (version included) and reads the token
// its flags announce.
func readPreamble(c net.Conn, first *[8]byte, want [8]byte) (token string, err error) {
	if _, err := io.ReadFull(c, first[4:]); err != nil {
		return "", err
	}
	if first[4] != want[4] {
		return "", fmt.Errorf("preamble version %d, want %d", first[4], want[4])
	}
	return wire.ReadPreambleToken(c, *first)
}

// tuneTCP readies an accepted data or transfer connection to carry
// blocks: no Nagle delay, and the node's congestion control (these
// connections send the bytes of Gets and of peers' reads). They have it
// from the listener already; setting it again costs nothing and keeps
// the contract local. A positive sendBuffer sets the socket's send
// buffer (SO_SNDBUF), which turns the kernel's autotuning of it off.
func (d *doors) tuneTCP(c net.Conn, sendBuffer int64) {
	if tc := tlsConnOf(c); tc != nil {
		c = tc.NetConn()
	}
	for {
		switch v := c.(type) {
		case *prefixConn:
			c = v.Conn
			continue
		case *net.TCPConn:
			v.SetNoDelay(true)
			if err := wire.SetCongestion(v, d.congestion); err != nil {
				// New checked the algorithm; the connection works on
				// with the host's.
				d.log.Debug("congestion control not set", "remote", remote(c), "err", err)
			}
			if sendBuffer > 0 {
				if err := v.SetWriteBuffer(int(sendBuffer)); err != nil {
					d.log.Debug("send buffer not set", "remote", remote(c), "err", err)
				}
			}
		}
		return
	}
}

// acceptShm accepts same-host clients on the shm socket.
func (d *doors) acceptShm(ctx context.Context, serve func(*net.UnixConn)) error {
	return d.accept(ctx, doorShm, func() (net.Conn, error) { return d.shm.AcceptUnix() }, func(c net.Conn, release func()) {
		uc := c.(*net.UnixConn)
		d.serve(c, release, func() bool { serve(uc); return false })
	})
}

// acceptShmTransfer accepts same-host peers on the shm transport's socket.
func (d *doors) acceptShmTransfer(ctx context.Context, serve func(context.Context, *net.UnixConn)) error {
	return d.accept(ctx, doorShmTransfer, func() (net.Conn, error) { return d.xfer.AcceptUnix() }, func(c net.Conn, release func()) {
		uc := c.(*net.UnixConn)
		d.serve(c, release, func() bool { serve(ctx, uc); return false })
	})
}

func (d *doors) untrack(c net.Conn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.conns, c)
}

// stopAccepting closes the listeners, which ends the accept loops.
func (d *doors) stopAccepting() {
	d.tcp.Close()
	if d.shm != nil {
		d.shm.Close()
	}
	if d.xfer != nil {
		d.xfer.Close()
	}
}

// closeConns closes every tracked connection, refuses new ones, and waits
// for the goroutines serving them.
func (d *doors) closeConns() {
	d.mu.Lock()
	for c := range d.conns {
		c.Close()
	}
	d.conns = nil
	d.mu.Unlock()
	d.tasks.closeAndWait()
}

// close closes every listener; some may be closed already.
func (d *doors) close() {
	if d.tcp != nil {
		d.tcp.Close()
	}
	if d.http != nil {
		d.http.Close()
	}
	if d.shm != nil {
		d.shm.Close()
	}
	if d.xfer != nil {
		d.xfer.Close()
	}
}

// tasks runs goroutines on behalf of connections and calls, so shutdown
// can wait for all of them. After closeAndWait, Go refuses.
type tasks struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// Go runs f and reports true, or reports false once closing.
func (t *tasks) Go(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Go(f) // under mu: never after closeAndWait began waiting
	return true
}

// closeAndWait refuses new goroutines and waits for the running ones.
func (t *tasks) closeAndWait() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}

// chanListener is a net.Listener fed by acceptTCP with the connections
// that turned out to be gRPC.
type chanListener struct {
	addr   net.Addr
	conns  chan net.Conn
	done   chan struct{}
	closed sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.closed.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// prefixConn replays bytes already read from a connection, and releases
// its place under the door's caps when its owner closes it.
type prefixConn struct {
	net.Conn
	prefix  []byte
	release func()
	closed  sync.Once
}

func (c *prefixConn) Close() error {
	err := c.Conn.Close()
	if c.release != nil {
		c.closed.Do(c.release)
	}
	return err
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		k := copy(p, c.prefix)
		c.prefix = c.prefix[k:]
		return k, nil
	}
	return c.Conn.Read(p)
}

// connLimits caps the connections a node holds open, so that no client
// can take every descriptor: at most perDoor on each door, and at most
// perRemote from one remote IP address across the TCP doors (a unix
// socket's peers have no address; its door cap bounds them). Safe for
// concurrent use.
type connLimits struct {
	perDoor, perRemote int // 0: no cap
	// refused counts a connection refused at a cap; nil counts nothing.
	refused func(door, reason string)

	mu      sync.Mutex
	open    map[string]int // by door
	remotes map[string]int // by remote IP
}

// admit takes a place for c on door, or reports false when a cap is
// reached (and counts the refusal). release gives the place back; it may
// be called more than once, only the first counts.
func (l *connLimits) admit(door string, c net.Conn) (release func(), ok bool) {
	ip := ""
	if a, isTCP := c.RemoteAddr().(*net.TCPAddr); isTCP {
		ip = a.IP.String()
	}
	l.mu.Lock()
	if l.open == nil {
		l.open, l.remotes = map[string]int{}, map[string]int{}
	}
	reason := ""
	switch {
	case l.perDoor > 0 && l.open[door] >= l.perDoor:
		reason = refusedDoorFull
	case ip != "" && l.perRemote > 0 && l.remotes[ip] >= l.perRemote:
		reason = refusedRemoteFull
	}
	if reason != "" {
		l.mu.Unlock()
		if l.refused != nil {
			l.refused(door, reason)
		}
		return nil, false
	}
	l.open[door]++
	if ip != "" {
		l.remotes[ip]++
	}
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.open[door]--
			if ip != "" {
				if l.remotes[ip]--; l.remotes[ip] == 0 {
					delete(l.remotes, ip)
				}
			}
		})
	}, true
}

// openOn returns how many connections door holds open.
func (l *connLimits) openOn(door string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[door]
}

// limitedListener applies connLimits to a listener served by someone
// else (the metrics door's HTTP server): connections past a cap are
// closed inside Accept, and each admitted one releases its place when
// closed.
type limitedListener struct {
	net.Listener
	door   string
	limits *connLimits
}

func (l limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if release, ok := l.limits.admit(l.door, c); ok {
			return &prefixConn{Conn: c, release: release}, nil
		}
		c.Close()
	}
}
