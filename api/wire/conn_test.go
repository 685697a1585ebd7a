package wire

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"
)

// fakeNode answers data-channel requests on a loopback listener: a Get of
// key "k" with value "value", a Remove with NotFound (status 5), and a Put
// with FlagClose (the stream is out of step).
func fakeNode(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var pre [8]byte
				if _, err := io.ReadFull(br, pre[:]); err != nil || pre != Preamble {
					return
				}
				buf := make([]byte, RequestBufferBytes)
				var r Request
				for ReadRequest(br, buf, &r) == nil {
					var out []byte
					switch r.Op {
					case OpGet:
						out = append(AppendResponse(nil, &Response{ValueLen: 5, CRC: 7}), "value"...)
					case OpRemove:
						out = AppendResponse(nil, &Response{Status: 5, Message: "no block " + string(r.Key)})
					case OpRelease:
						continue
					default:
						out = AppendResponse(nil, &Response{Status: 3, Flags: FlagClose, Message: "refused"})
					}
					c.Write(out)
				}
			}()
		}
	}()
	return l.Addr().String()
}

func TestConnPipelinesAndReportsStatus(t *testing.T) {
	addr := fakeNode(t)
	ctx := context.Background()
	c, err := Dial(ctx, addr, ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Three requests, and a release with no response, in one write.
	for _, k := range []string{"a", "b", "c"} {
		c.Queue(&Request{Op: OpRemove, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte(k)})
	}
	c.Queue(&Request{Op: OpRelease, Handle: 1})
	if err := c.Flush(nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c"} {
		resp, err := c.Recv()
		var se *StatusError
		if !errors.As(err, &se) || se.Code != 5 || se.Message != "no block "+k || resp == nil {
			t.Fatalf("remove %s: %v %v", k, resp, err)
		}
	}
	if !c.Usable() {
		t.Fatal("a refused request made the connection unusable")
	}
	resp, err := c.RoundTrip(ctx, &Request{Op: OpGet, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")})
	if err != nil || resp.ValueLen != 5 || resp.CRC != 7 {
		t.Fatalf("get: %+v %v", resp, err)
	}
	v := make([]byte, 5)
	if _, err := io.ReadFull(c, v); err != nil || string(v) != "value" {
		t.Fatalf("value: %q %v", v, err)
	}
	// FlagClose: the node says the stream is out of step.
	if _, err := c.RoundTrip(ctx, &Request{Op: OpSink}); err == nil || c.Usable() {
		t.Fatalf("a response with FlagClose: %v, usable %v", err, c.Usable())
	}
}

func TestConnStatusMapping(t *testing.T) {
	addr := fakeNode(t)
	mapped := errors.New("mapped")
	c, err := Dial(context.Background(), addr, ConnConfig{Status: func(code uint8, msg string) error { return mapped }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.RoundTrip(context.Background(), &Request{Op: OpRemove, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")}); err != mapped {
		t.Fatalf("status through the mapping: %v", err)
	}
}

func TestConnDeadline(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			defer c.Close()
			io.Copy(io.Discard, c) // never answers
		}
	}()
	c, err := Dial(context.Background(), l.Addr().String(), ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.RoundTrip(ctx, &Request{Op: OpGet, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")}); !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Fatalf("no answer within the deadline: %v", err)
	}
	if c.Usable() {
		t.Fatal("a timed-out connection is still usable")
	}
}

// deadlineRecorder is a net.Conn that records the deadlines set on it,
// from any goroutine.
type deadlineRecorder struct {
	net.Conn
	mu   sync.Mutex
	set  int
	last time.Time
}

func (d *deadlineRecorder) SetDeadline(t time.Time) error {
	d.mu.Lock()
	d.set, d.last = d.set+1, t
	d.mu.Unlock()
	return d.Conn.SetDeadline(t)
}

func (d *deadlineRecorder) state() (set int, last time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.set, d.last
}

// TestConnBindArmsOnUse checks that a Bind reaches the socket only when an
// operation uses it, that an inner Bind gives the socket back to the
// outer one, and that a Bind whose context is done fails the first
// operation at once.
func TestConnBindArmsOnUse(t *testing.T) {
	addr := fakeNode(t)
	nc, err := DialPreamble(context.Background(), addr, Preamble, nil, "", "")
	if err != nil {
		t.Fatal(err)
	}
	dr := &deadlineRecorder{Conn: nc}
	c := NewConn(dr, ConnConfig{})
	defer c.Close()
	get := func() error {
		c.Queue(&Request{Op: OpGet, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")})
		if err := c.Flush(nil); err != nil {
			return err
		}
		if _, err := c.Recv(); err != nil {
			return err
		}
		return c.Discard(5)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	c.Bind(ctx)()
	if set, _ := dr.state(); set != 0 {
		t.Fatalf("a Bind nothing used set %d deadlines", set)
	}

	unbindOuter := c.Bind(context.Background())
	if err := get(); err != nil {
		t.Fatal(err)
	}
	if set, last := dr.state(); set != 1 || !last.IsZero() {
		t.Fatalf("after a call under a Bind without deadline: %d deadlines set, the last %v", set, last)
	}
	dl := time.Now().Add(time.Hour)
	inner, cancelInner := context.WithDeadline(context.Background(), dl)
	unbindInner := c.Bind(inner)
	if err := get(); err != nil {
		t.Fatal(err)
	}
	if _, last := dr.state(); !last.Equal(dl) {
		t.Fatalf("the inner Bind's deadline: %v, want %v", last, dl)
	}
	unbindInner()
	cancelInner()
	if _, last := dr.state(); !last.IsZero() {
		t.Fatalf("after the inner Bind, the socket's deadline is %v, not the outer's (none)", last)
	}
	if err := get(); err != nil {
		t.Fatalf("a call under the outer Bind after the inner one: %v", err)
	}

	// An inner Bind cancelled while it holds the socket expires it; its
	// unbind gives the outer one its deadline back.
	inner, cancelInner = context.WithCancel(context.Background())
	unbindInner = c.Bind(inner)
	if err := get(); err != nil {
		t.Fatal(err)
	}
	cancelInner()
	for {
		if _, last := dr.state(); last.Equal(time.Unix(1, 0)) {
			break
		}
		runtime.Gosched() // the cancellation's own goroutine sets it
	}
	unbindInner()
	if _, last := dr.state(); !last.IsZero() {
		t.Fatalf("after a cancelled inner Bind, the socket's deadline is %v, not the outer's (none)", last)
	}
	if err := get(); err != nil {
		t.Fatalf("a call under the outer Bind after a cancelled inner one: %v", err)
	}
	unbindOuter()

	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	defer c.Bind(done)()
	if err := get(); !isTimeout(err) {
		t.Fatalf("a call under a Bind whose context is done: %v", err)
	}
	if c.Usable() {
		t.Fatal("the connection is usable after a call failed on its socket")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestPoolReusesAndBounds(t *testing.T) {
	addr := fakeNode(t)
	dials := 0
	p := &Pool{MaxIdle: 1, Dial: func(ctx context.Context, a string) (*Conn, error) { dials++; return Dial(ctx, a, ConnConfig{}) }}
	ctx := context.Background()
	a, reused, err := p.Get(ctx, addr)
	if err != nil || reused {
		t.Fatal(err, reused)
	}
	b, _, _ := p.Get(ctx, addr)
	p.Put(addr, a)
	p.Put(addr, b) // over MaxIdle: closed
	c, reused, err := p.Get(ctx, addr)
	if err != nil || !reused || c != a || dials != 2 {
		t.Fatalf("reuse: %v %v same=%v dials=%d", err, reused, c == a, dials)
	}
	c.Queue(&Request{Op: OpRelease, Handle: 1}) // unsent requests: not reusable
	p.Put(addr, c)
	if _, reused, _ := p.Get(ctx, addr); reused {
		t.Fatal("a connection with queued requests was reused")
	}
	p.Close()
	if _, _, err := p.Get(ctx, addr); !errors.Is(err, ErrPoolClosed) {
		t.Fatalf("get after close: %v", err)
	}
}
