package pool

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if a, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if b, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// A polling reader returns what arrives, whether it came before the read
// or during its spin or after it parked, then EOF; deadlines still end a
// parked read.
func TestPollingReader(t *testing.T) {
	for _, spin := range []time.Duration{time.Microsecond, 50 * time.Millisecond} {
		a, b := tcpPair(t)
		r := newPollingReader(b, func() time.Duration { return spin }, newSpinners())
		if _, ok := r.(*pollingReader); !ok {
			t.Fatalf("a TCP connection got %T, want a *pollingReader", r)
		}
		go func() {
			a.Write([]byte("hello"))
			a.Write([]byte(" world"))
			a.Close()
		}()
		got, err := io.ReadAll(r)
		if err != nil || string(got) != "hello world" {
			t.Fatalf("spin %v: read %q, %v", spin, got, err)
		}
	}
	_, b := tcpPair(t)
	r := newPollingReader(b, func() time.Duration { return time.Microsecond }, newSpinners())
	b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := r.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want ErrDeadlineExceeded", err)
	}
	if n, err := r.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d, %v", n, err)
	}
	if _, ok := newPollingReader(b, nil, newSpinners()).(net.Conn); !ok {
		t.Fatal("without a spin the connection itself must be the reader")
	}
}

func TestSpinnersBoundConcurrentSpins(t *testing.T) {
	s := &spinners{max: 2}
	if !s.enter() || !s.enter() {
		t.Fatal("two slots must be free")
	}
	if s.enter() {
		t.Fatal("a third spinner got a slot")
	}
	s.exit()
	if !s.enter() {
		t.Fatal("a slot freed by exit must be taken again")
	}
	if newSpinners().max < 1 {
		t.Fatal("a node must allow one spinner at least")
	}
}
