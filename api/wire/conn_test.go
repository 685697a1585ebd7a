package wire

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
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
