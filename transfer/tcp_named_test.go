package transfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
)

// blockSource is a working in-process BlockSource: named blocks in a map,
// tenants a caller may not read, and every pin counted so a test can see
// that each was let go.
type blockSource struct {
	mu      sync.Mutex
	blocks  map[string][]byte
	crcs    map[string]uint32
	refused map[string]bool // by tenant
	pinned  int             // pins not yet let go
	pins    int             // pins ever taken
	// onPin, when set, runs under mu after each pin (the count so far):
	// a test replaces a block between two slices' pins with it.
	onPin func(pins int)
}

func newBlockSource() *blockSource {
	return &blockSource{blocks: map[string][]byte{}, crcs: map[string]uint32{}, refused: map[string]bool{}}
}

func nameKey(n BlockName) string {
	return fmt.Sprintf("%s/%s/%x", n.Tenant, n.Namespace, n.Key)
}

func (s *blockSource) put(n BlockName, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blocks[nameKey(n)] = b
	s.crcs[nameKey(n)] = api.Checksum(b)
}

func (s *blockSource) PinBlock(n BlockName) (PinnedBlock, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused[string(n.Tenant)] {
		return PinnedBlock{}, fmt.Errorf("%w: tenant %s", api.ErrPermissionDenied, n.Tenant)
	}
	b, ok := s.blocks[nameKey(n)]
	if !ok {
		return PinnedBlock{}, fmt.Errorf("%w: %s", api.ErrNotFound, nameKey(n))
	}
	s.pinned++
	s.pins++
	p := PinnedBlock{Mem: b, CRC: s.crcs[nameKey(n)], Handle: uint64(s.pins)}
	if s.onPin != nil {
		s.onPin(s.pins)
	}
	return p, nil
}

func (s *blockSource) UnpinBlock(PinnedBlock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pinned--
}

func (s *blockSource) taken() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pins
}

func (s *blockSource) held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pinned
}

func TestTCPNamedReads(t *testing.T) {
	const size = 96<<10 + 5 // 13 slices of 8 KiB
	block := make([]byte, size)
	for i := range block {
		block[i] = byte(i*31 + i>>9)
	}
	name := func(key string) BlockName {
		return BlockName{Tenant: []byte("acme"), Namespace: []byte("llama"), Key: []byte(key)}
	}
	cases := []struct {
		name  string
		op    BlockName
		local int
		// replace swaps the block's bytes after the first pin, so the
		// slices pinned later see another block.
		replace bool
		want    error // nil: the read succeeds
	}{
		{name: "whole block over both connections", op: name("k1"), local: size},
		{name: "a block of another size", op: name("k1"), local: size - 1, want: ErrBlockSize},
		{name: "a larger buffer than the block", op: name("k1"), local: size + 8<<10, want: ErrBlockSize},
		{name: "a missing block", op: name("nope"), local: size, want: api.ErrNotFound},
		{name: "a tenant the caller may not read", op: BlockName{Tenant: []byte("secret"), Namespace: []byte("llama"), Key: []byte("k1")}, local: size, want: api.ErrPermissionDenied},
		{name: "the block replaced between two slices", op: name("k1"), local: size, replace: true, want: ErrPeer},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := newBlockSource()
			src.put(name("k1"), block)
			src.put(BlockName{Tenant: []byte("secret"), Namespace: []byte("llama"), Key: []byte("k1")}, block)
			src.refused["secret"] = true
			if tc.replace {
				other := bytes.Clone(block)
				other[0] ^= 1
				src.onPin = func(pins int) {
					if pins == 1 {
						// Under src.mu, as PinBlock holds it.
						src.blocks[nameKey(name("k1"))] = other
						src.crcs[nameKey(name("k1"))] = api.Checksum(other)
					}
				}
			}
			server := NewTCP(TCPConfig{})
			defer server.Close()
			addr := serveTCPWith(t, server, func(int) Serving { return Serving{Blocks: src} })
			client := NewTCP(TCPConfig{SliceBytes: 8 << 10, MaxSliceBytes: 8 << 10, WindowBytes: 16 << 10})
			defer client.Close()
			local := make([]byte, tc.local)
			b := client.Submit(context.Background(), []Op{{Kind: Read, Peer: addr, Name: tc.op, Local: local, Checksum: true}})
			err := b.Wait(context.Background())
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(local, block) {
					t.Fatal("the bytes read differ from the block")
				}
				if got, want := b.OpPeerCRC(0), api.Checksum(block); got != want {
					t.Fatalf("peer's checksum %#x, want the block's %#x", got, want)
				}
				if got, want := b.OpCRC(0), api.Checksum(block); got != want {
					t.Fatalf("checksum of what arrived %#x, want %#x", got, want)
				}
				if pins := src.taken(); pins != 13 {
					t.Fatalf("%d pins, want one per slice (13)", pins)
				}
			} else if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if errors.Is(tc.want, ErrBlockSize) && !bytes.Equal(local, make([]byte, tc.local)) {
				t.Fatal("a read of the wrong size wrote into the buffer")
			}
			// Every pin is let go once its bytes are sent (or refused).
			if err := waitFor(func() bool { return src.held() == 0 }); err != nil {
				t.Fatalf("%d pins still held: %v", src.held(), err)
			}
		})
	}
}

// waitFor polls cond until it holds, for up to 10 s.
func waitFor(cond func() bool) error {
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// A connection served without a BlockSource answers named reads as
// missing blocks, and ops that are not reads, or carry a broken name,
// fail before anything is sent. The grpc transport refuses named reads.
func TestTCPNamedReadsRefused(t *testing.T) {
	server := NewTCP(TCPConfig{})
	defer server.Close()
	server.Register(7, make([]byte, 64))
	addr := serveTCP(t, server)
	client := NewTCP(TCPConfig{})
	defer client.Close()
	n := BlockName{Tenant: []byte("acme"), Namespace: []byte("llama"), Key: []byte("k")}
	long := BlockName{Tenant: bytes.Repeat([]byte("t"), 256), Namespace: []byte("llama"), Key: []byte("k")}
	for _, tc := range []struct {
		name string
		op   Op
		want error
	}{
		{"no block source", Op{Kind: Read, Peer: addr, Name: n, Local: make([]byte, 8)}, api.ErrNotFound},
		{"a named write", Op{Kind: Write, Peer: addr, Name: n, Local: make([]byte, 8)}, api.ErrInvalidArgument},
		{"a name without a key", Op{Kind: Read, Peer: addr, Name: BlockName{Tenant: []byte("acme")}, Local: make([]byte, 8)}, api.ErrInvalidArgument},
		{"a part over 255 bytes", Op{Kind: Read, Peer: addr, Name: long, Local: make([]byte, 8)}, api.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := client.Submit(context.Background(), []Op{tc.op}).Wait(context.Background()); !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
		})
	}
	// The connection still serves region reads after a refused name.
	if err := client.Submit(context.Background(), []Op{{Kind: Read, Peer: addr, Region: 7, Local: make([]byte, 64)}}).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	var _ NamedReader = client
	var g Transport = NewGRPC(GRPCConfig{})
	defer g.Close()
	if _, ok := g.(NamedReader); ok {
		t.Fatal("the grpc transport claims to serve named reads")
	}
	if err := g.Submit(context.Background(), []Op{{Kind: Read, Peer: addr, Name: n, Local: make([]byte, 8)}}).Wait(context.Background()); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("grpc named read: %v, want InvalidArgument", err)
	}
}

// memConn is a net.Conn whose reads come from in and whose writes go to
// out: the server side of a connection, for the fuzz test.
type memConn struct {
	in  io.Reader
	out bytes.Buffer
}

func (c *memConn) Read(p []byte) (int, error)       { return c.in.Read(p) }
func (c *memConn) Write(p []byte) (int, error)      { return c.out.Write(p) }
func (c *memConn) Close() error                     { return nil }
func (c *memConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *memConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzTCPServe feeds arbitrary request streams to the server side: it
// must not panic, must answer every request it accepts with a
// well-formed response, and must never send bytes beyond a region or a
// block.
func FuzzTCPServe(f *testing.F) {
	name := BlockName{Tenant: []byte("acme"), Namespace: []byte("llama"), Key: []byte("k1")}
	named := func(off, n, size uint64, nm BlockName) []byte {
		var h [tcpNamedBytes]byte
		h[0] = tcpNamedRead
		binary.LittleEndian.PutUint16(h[2:], uint16(3+len(nm.Tenant)+len(nm.Namespace)+len(nm.Key)))
		binary.LittleEndian.PutUint64(h[8:], off)
		binary.LittleEndian.PutUint64(h[16:], n)
		binary.LittleEndian.PutUint64(h[24:], size)
		return appendName(h[:], nm)
	}
	region := func(kind Kind, off, n uint64) []byte {
		var h [tcpReqBytes]byte
		h[0] = byte(kind)
		binary.LittleEndian.PutUint32(h[4:], 7)
		binary.LittleEndian.PutUint64(h[8:], off)
		binary.LittleEndian.PutUint64(h[16:], n)
		return h[:]
	}
	f.Add(named(0, 100, 100, name))
	f.Add(named(50, 60, 100, name))
	f.Add(named(0, 100, 99, name))
	f.Add(append(region(Read, 0, 64), named(0, 100, 100, BlockName{Tenant: []byte("acme"), Namespace: []byte("x"), Key: []byte("k9")})...))
	f.Add(append(region(Write, 8, 4), 1, 2, 3, 4))
	f.Add(region(Read, 60, 8))
	f.Add([]byte{tcpNamedRead, 0, 255, 255})
	f.Fuzz(func(t *testing.T, in []byte) {
		block := bytes.Repeat([]byte{0xab}, 100)
		src := newBlockSource()
		src.put(name, block)
		server := NewTCP(TCPConfig{})
		defer server.Close()
		server.Register(7, make([]byte, 64))
		c := &memConn{in: bytes.NewReader(in)}
		server.ServeConnWith(context.Background(), c, Serving{Blocks: src})
		if src.held() != 0 {
			t.Fatalf("%d pins held after the connection ended", src.held())
		}
		out := c.out.Bytes()
		for len(out) > 0 {
			if len(out) < tcpRespBytes {
				t.Fatalf("a torn response header: %x", out)
			}
			h := out[:tcpRespBytes]
			out = out[tcpRespBytes:]
			status, n := h[0], binary.LittleEndian.Uint64(h[8:])
			if status > tcpWrongSize || h[1]|h[2]|h[3] != 0 {
				t.Fatalf("a malformed response header: %x", h)
			}
			if status == tcpOK {
				// A read's bytes (a write's response has n = 0).
				if n > 100 || uint64(len(out)) < n {
					t.Fatalf("a response of %d bytes, more than any region or block here, or than was sent (%d)", n, len(out))
				}
				out = out[n:]
			}
		}
	})
}

// The tcp transport reports the kernel's round trip of a connection once
// one is up, and nothing for a peer it never reached.
func TestTCPReportsTheKernelsRoundTrip(t *testing.T) {
	server := NewTCP(TCPConfig{})
	defer server.Close()
	server.Register(7, make([]byte, 1<<20))
	addr := serveTCP(t, server)
	client := NewTCP(TCPConfig{})
	defer client.Close()
	if _, ok := client.RTT(addr); ok {
		t.Fatal("a round trip to a peer never dialed")
	}
	if err := client.Submit(context.Background(), []Op{{Kind: Read, Peer: addr, Region: 7, Local: make([]byte, 1<<20)}}).Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	d, ok := client.RTT(addr)
	if !ok || d <= 0 || d > time.Second {
		t.Fatalf("round trip %v (%v) after a read over loopback", d, ok)
	}
	var f RTTReporter = &Faulty{Transport: client}
	if _, ok := f.RTT(addr); !ok {
		t.Fatal("Faulty hides its transport's round trip")
	}
}
