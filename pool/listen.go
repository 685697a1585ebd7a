package pool

import (
	"bytes"
	"context"
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

	ioTimeout time.Duration
	log       *slog.Logger
	// acceptFailed counts a failed accept of a door; nil counts nothing.
	acceptFailed func(door string)
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
	if d.tcp, err = net.Listen("tcp", cfg.ListenAddr); err != nil {
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
func (d *doors) acceptTCP(ctx context.Context, data func(net.Conn), xfer func(context.Context, net.Conn) error) error {
	return d.accept(ctx, "tcp", d.tcp.Accept, func(c net.Conn) {
		d.serve(c, func() bool { return d.sniff(ctx, c, data, xfer) })
	})
}

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
func (d *doors) accept(ctx context.Context, door string, accept func() (net.Conn, error), handle func(net.Conn)) error {
	var delay time.Duration
	for {
		c, err := accept()
		if err == nil {
			delay = 0
			handle(c)
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
func (d *doors) serve(c net.Conn, f func() (handedOff bool)) {
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
		}
	}) {
		c.Close()
		return
	}
	d.conns[c] = struct{}{}
}

// sniff reads the first bytes of c and serves it with the right server;
// it reports whether it handed c to gRPC, which then owns it.
func (d *doors) sniff(ctx context.Context, c net.Conn, data func(net.Conn), xfer func(context.Context, net.Conn) error) (handedOff bool) {
	var first [len(wire.Preamble)]byte
	c.SetReadDeadline(time.Now().Add(d.ioTimeout))
	k, err := io.ReadFull(c, first[:4])
	if err != nil {
		return false
	}
	switch {
	case bytes.Equal(first[:4], wire.Preamble[:4]):
		if _, err := io.ReadFull(c, first[4:]); err != nil || first != wire.Preamble {
			d.log.Warn("data connection with a bad preamble", "remote", remote(c))
			return false
		}
		setNoDelay(c)
		data(c)
	case bytes.Equal(first[:4], transfer.TCPPreamble[:4]):
		if _, err := io.ReadFull(c, first[4:]); err == nil && first == transfer.TCPPreamble {
			c.SetReadDeadline(time.Time{})
			setNoDelay(c)
			xfer(ctx, c)
		}
	default:
		// Not ours: gRPC owns it from here, replaying the bytes we read.
		c.SetReadDeadline(time.Time{})
		return d.grpc.deliver(&prefixConn{Conn: c, prefix: first[:k]})
	}
	return false
}

func setNoDelay(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
}

// acceptShm accepts same-host clients on the shm socket.
func (d *doors) acceptShm(ctx context.Context, serve func(*net.UnixConn)) error {
	return d.accept(ctx, "shm", func() (net.Conn, error) { return d.shm.AcceptUnix() }, func(c net.Conn) {
		uc := c.(*net.UnixConn)
		d.serve(c, func() bool { serve(uc); return false })
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

// prefixConn replays bytes already read from a connection.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		k := copy(p, c.prefix)
		c.prefix = c.prefix[k:]
		return k, nil
	}
	return c.Conn.Read(p)
}
