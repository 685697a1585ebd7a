package wire

import (
	"errors"
	"io"
	"net"
	"os"
	"slices"
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
		r := NewPollingReader(b, func() time.Duration { return spin }, NewSpinners())
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
	r := NewPollingReader(b, func() time.Duration { return time.Microsecond }, NewSpinners())
	b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := r.Read(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want ErrDeadlineExceeded", err)
	}
	if n, err := r.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d, %v", n, err)
	}
	if _, ok := NewPollingReader(b, nil, NewSpinners()).(net.Conn); !ok {
		t.Fatal("without a spin the connection itself must be the reader")
	}
}

// A read allocates nothing, spinning or not: a node's session reads one
// for every request, a commit's among them, and garbage there costs the
// node collections and fresh heap pages while it serves.
func TestPollingReaderReadsWithoutAllocating(t *testing.T) {
	for _, spin := range []time.Duration{time.Microsecond, time.Millisecond} {
		a, b := tcpPair(t)
		r := NewPollingReader(b, func() time.Duration { return spin }, NewSpinners())
		msg, buf := []byte("request"), make([]byte, 16)
		read := func() {
			if _, err := a.Write(msg); err != nil {
				t.Fatal(err)
			}
			if n, err := io.ReadFull(r, buf[:len(msg)]); err != nil || n != len(msg) {
				t.Fatalf("read %d, %v", n, err)
			}
		}
		read() // the first read may set the reader up
		if allocs := testing.AllocsPerRun(100, read); allocs != 0 {
			t.Errorf("spin %v: %.1f allocations a read, want 0", spin, allocs)
		}
	}
}

func TestSpinnersBoundConcurrentSpins(t *testing.T) {
	s := &Spinners{max: 2}
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
	if NewSpinners().max < 1 {
		t.Fatal("a node must allow one spinner at least")
	}
}

// A connection whose requests keep arriving after the spin stops
// spinning for 1, 3, 7, … reads after each spin in a row that timed out,
// and spins again once a spin finds its bytes.
func TestPollingReaderBacksOffSpinsThatMiss(t *testing.T) {
	a, b := tcpPair(t)
	r := NewPollingReader(b, func() time.Duration { return 200 * time.Microsecond }, NewSpinners()).(*pollingReader)
	buf := make([]byte, 1)
	late := func() { // the byte comes well after the spin
		t.Helper()
		go func() {
			// A client busy elsewhere, by construction: 100 times the
			// spin, so a reader descheduled mid-spin on a loaded machine
			// (the suite runs packages in parallel) still misses it.
			time.Sleep(20 * time.Millisecond)
			a.Write([]byte("x"))
		}()
		if _, err := r.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	var skips []int
	for range 4 {
		late()
		skips = append(skips, r.skip)
		for r.skip > 0 { // the skipped reads park at once
			late()
		}
	}
	if want := []int{1, 3, 7, 15}; !slices.Equal(skips, want) {
		t.Fatalf("reads skipped after each missed spin: %v, want %v", skips, want)
	}
	// A spin that finds its bytes resets the count: write while the read
	// spins (the bytes are there before its second try at the latest).
	a.Write([]byte("y"))
	if _, err := r.Read(buf); err != nil || r.misses != 4 {
		t.Fatalf("a read with bytes waiting: %v, misses %d (unchanged: it never spun)", err, r.misses)
	}
	go a.Write([]byte("z"))
	for r.misses != 0 {
		if _, err := r.Read(buf); err != nil {
			t.Fatal(err)
		}
		if r.misses != 0 {
			go a.Write([]byte("z"))
		}
	}
}
