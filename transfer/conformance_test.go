package transfer

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
)

// pair is a client transport and the address of a peer serving region 7.
type pair struct {
	client Transport
	peer   string
	mem    []byte // region 7 on the peer: mem's bytes, perhaps copied
}

// factory starts a peer serving region 7 holding mem's bytes and a client.
type factory func(t *testing.T, mem []byte) pair

// serveTCP runs a tcp transport's server side on a loopback listener.
func serveTCP(t *testing.T, server *TCP) string { return serveTCPWith(t, server, nil) }

// serveTCPWith is serveTCP with the k-th connection accepted (from 0)
// served with what servingFor(k) gives it, when servingFor is set.
func serveTCPWith(t *testing.T, server *TCP, servingFor func(k int) Serving) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveTCPOn(t, ln, server, servingFor)
}

// serveTCPOn is serveTCPWith on ln.
func serveTCPOn(t *testing.T, ln net.Listener, server *TCP, servingFor func(k int) Serving) string {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for k := 0; ; k++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			var serving Serving
			if servingFor != nil {
				serving = servingFor(k)
			}
			wg.Go(func() {
				defer c.Close()
				var pre [8]byte
				if _, err := io.ReadFull(c, pre[:]); err != nil || pre != TCPPreamble {
					return
				}
				server.ServeConnWith(ctx, c, serving)
			})
		}
	})
	t.Cleanup(func() { cancel(); ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

func tcpFactory(cfg TCPConfig) factory {
	return func(t *testing.T, mem []byte) pair {
		server := NewTCP(TCPConfig{})
		if err := server.Register(7, mem); err != nil {
			t.Fatal(err)
		}
		addr := serveTCP(t, server)
		client := NewTCP(cfg)
		t.Cleanup(func() { client.Close(); server.Close() })
		return pair{client: client, peer: addr, mem: mem}
	}
}

func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i+8 <= n; i += 8 {
		x := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(x >> (8 * j))
		}
	}
	return b
}

// runConformance is the suite every transport passes, its batches
// submitted and then waited for, and again run by Run (which tcp drives
// on the calling goroutine).
func runConformance(t *testing.T, newPair factory) {
	t.Run("Submit", func(t *testing.T) {
		runConformanceWith(t, newPair, func(ctx context.Context, tr Transport, ops []Op) (*Batch, error) {
			b := tr.Submit(ctx, ops)
			return b, b.Wait(ctx)
		})
	})
	t.Run("Run", func(t *testing.T) { runConformanceWith(t, newPair, Run) })
}

// errOf is the error of a batch run.
func errOf(_ *Batch, err error) error { return err }

func runConformanceWith(t *testing.T, newPair factory, run func(context.Context, Transport, []Op) (*Batch, error)) {
	ctx := context.Background()
	t.Run("tiny and huge reads", func(t *testing.T) {
		mem := pattern(96<<20, 1)
		p := newPair(t, mem)
		mem = p.mem // the region as the peer holds it
		for _, r := range []struct{ off, n int }{{5, 1}, {0, 0}, {4095, 2}, {1 << 20, 64 << 20}, {len(mem) - 3, 3}} {
			local := make([]byte, r.n)
			b, err := run(ctx, p.client, []Op{{Kind: Read, Peer: p.peer, Region: 7, Offset: uint64(r.off), Local: local}})
			if err != nil {
				t.Fatalf("read [%d,+%d): %v", r.off, r.n, err)
			}
			if !bytes.Equal(local, mem[r.off:r.off+r.n]) {
				t.Fatalf("read [%d,+%d): wrong bytes", r.off, r.n)
			}
			if b.Bytes() != uint64(r.n) {
				t.Fatalf("batch moved %d bytes, want %d", b.Bytes(), r.n)
			}
		}
	})
	t.Run("many ops keep their order and data", func(t *testing.T) {
		mem := pattern(8<<20, 2)
		p := newPair(t, mem)
		mem = p.mem // the region as the peer holds it
		var ops []Op
		for i := range 200 {
			off := (i * 40009) % (len(mem) - 5000)
			ops = append(ops, Op{Kind: Read, Peer: p.peer, Region: 7, Offset: uint64(off), Local: make([]byte, 1+i*23)})
		}
		b := p.client.Submit(ctx, ops)
		if done, _ := b.Poll(); done {
			t.Log("batch completed before the first poll")
		}
		if err := b.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		for i, op := range ops {
			if !bytes.Equal(op.Local, mem[op.Offset:op.Offset+uint64(len(op.Local))]) {
				t.Fatalf("op %d: wrong bytes", i)
			}
		}
	})
	t.Run("checksummed reads report the CRC of what arrived", func(t *testing.T) {
		mem := pattern(12<<20, 12)
		p := newPair(t, mem)
		mem = p.mem // the region as the peer holds it
		var ops []Op
		for i, n := range []int{1, 64 << 10, 1<<20 + 7, 5 << 20, 0} {
			ops = append(ops, Op{Kind: Read, Peer: p.peer, Region: 7, Offset: uint64(i * 333), Local: make([]byte, n), Checksum: true})
		}
		b, err := run(ctx, p.client, ops)
		if err != nil {
			t.Fatal(err)
		}
		for i, op := range ops {
			if got, want := b.OpCRC(i), api.Checksum(mem[op.Offset:op.Offset+uint64(len(op.Local))]); got != want {
				t.Fatalf("op %d (%d bytes): crc %08x, want %08x", i, len(op.Local), got, want)
			}
		}
	})
	t.Run("writes land and read back", func(t *testing.T) {
		mem := make([]byte, 4<<20)
		p := newPair(t, mem)
		data := pattern(3<<20+17, 3)
		if err := errOf(run(ctx, p.client, []Op{{Kind: Write, Peer: p.peer, Region: 7, Offset: 100, Local: data}})); err != nil {
			t.Fatal(err)
		}
		back := make([]byte, len(data))
		if err := errOf(run(ctx, p.client, []Op{{Kind: Read, Peer: p.peer, Region: 7, Offset: 100, Local: back}})); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back, data) {
			t.Fatal("written bytes read back wrong")
		}
	})
	t.Run("partial failure fails only the bad ops", func(t *testing.T) {
		mem := pattern(1<<20, 4)
		p := newPair(t, mem)
		mem = p.mem // the region as the peer holds it
		ops := []Op{
			{Kind: Read, Peer: p.peer, Region: 7, Offset: 0, Local: make([]byte, 1000)},
			{Kind: Read, Peer: p.peer, Region: 99, Offset: 0, Local: make([]byte, 10)},
			{Kind: Read, Peer: p.peer, Region: 7, Offset: uint64(len(mem) - 5), Local: make([]byte, 10)},
			{Kind: Write, Peer: p.peer, Region: 99, Offset: 0, Local: make([]byte, 3000)},
			{Kind: Read, Peer: p.peer, Region: 7, Offset: 500, Local: make([]byte, 2<<20-600)[:400000]},
		}
		b, err := run(ctx, p.client, ops)
		if err == nil {
			t.Fatal("a batch with bad ops reported no error")
		}
		for i, want := range []error{nil, ErrNoRegion, ErrNoRegion, ErrNoRegion, nil} {
			if got := b.OpErr(i); (want == nil) != (got == nil) || (want != nil && !errors.Is(got, want)) {
				t.Errorf("op %d: %v, want %v", i, got, want)
			}
			if got := b.OpErr(i); want != nil && !errors.Is(got, api.ErrNotFound) {
				t.Errorf("op %d: %v is not an api.ErrNotFound", i, got)
			}
		}
		if !bytes.Equal(ops[0].Local, mem[:1000]) || !bytes.Equal(ops[4].Local, mem[500:500+400000]) {
			t.Fatal("good ops next to bad ones got wrong bytes")
		}
	})
	t.Run("cancellation ends a batch promptly", func(t *testing.T) {
		mem := pattern(64<<20, 5)
		p := newPair(t, mem)
		mem = p.mem // the region as the peer holds it
		cctx, cancel := context.WithCancel(ctx)
		var ops []Op
		for range 16 {
			ops = append(ops, Op{Kind: Read, Peer: p.peer, Region: 7, Offset: 0, Local: make([]byte, 64<<20)})
		}
		ran := make(chan *Batch, 1)
		go func() {
			b, _ := run(cctx, p.client, ops)
			ran <- b
		}()
		cancel()
		select {
		case b := <-ran:
			<-b.Done()
		case <-time.After(5 * time.Second):
			t.Fatal("a cancelled batch did not complete")
		}
		// The transport recovers for the next batch.
		local := make([]byte, 1<<20)
		if err := errOf(run(ctx, p.client, []Op{{Kind: Read, Peer: p.peer, Region: 7, Local: local}})); err != nil {
			t.Fatalf("after a cancellation: %v", err)
		}
		if !bytes.Equal(local, mem[:1<<20]) {
			t.Fatal("after a cancellation: wrong bytes")
		}
	})
	t.Run("concurrent batches", func(t *testing.T) {
		mem := pattern(16<<20, 6)
		p := newPair(t, mem)
		mem = p.mem // the region as the peer holds it
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 20 {
					off := uint64((g*1_000_003 + i*77_777) % (len(mem) - 300_000))
					local := make([]byte, 1+(g*i*9973)%300_000)
					ops := []Op{{Kind: Read, Peer: p.peer, Region: 7, Offset: off, Local: local}}
					var err error
					if g%2 == 0 {
						err = errOf(run(ctx, p.client, ops))
					} else {
						// Batches nobody drives share the connections
						// with those Run drives.
						err = p.client.Submit(ctx, ops).Wait(ctx)
					}
					if err != nil {
						t.Errorf("goroutine %d: %v", g, err)
						return
					}
					if !bytes.Equal(local, mem[off:off+uint64(len(local))]) {
						t.Errorf("goroutine %d batch %d: wrong bytes", g, i)
						return
					}
				}
			})
		}
		wg.Wait()
	})
	t.Run("unreachable peer", func(t *testing.T) {
		p := newPair(t, make([]byte, 10))
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		dead := ln.Addr().String()
		ln.Close()
		err := errOf(run(ctx, p.client, []Op{{Kind: Read, Peer: dead, Region: 7, Local: make([]byte, 5)}}))
		if !errors.Is(err, ErrPeer) || !errors.Is(err, api.ErrUnavailable) {
			t.Fatalf("read from a dead address: %v, want ErrPeer (api.ErrUnavailable)", err)
		}
	})
	t.Run("after Close ops fail with ErrClosed", func(t *testing.T) {
		p := newPair(t, make([]byte, 10))
		if err := p.client.Close(); err != nil {
			t.Fatal(err)
		}
		err := errOf(run(ctx, p.client, []Op{{Kind: Read, Peer: p.peer, Region: 7, Local: make([]byte, 5)}}))
		if !errors.Is(err, ErrClosed) || !errors.Is(err, api.ErrUnavailable) {
			t.Fatalf("read after Close: %v, want ErrClosed (api.ErrUnavailable)", err)
		}
		if err := p.client.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	})
}

func TestTCPConformance(t *testing.T) {
	runConformance(t, tcpFactory(TCPConfig{}))
}

// TestTCPConformanceTLS runs the suite through TLS, whose connections
// their readers read even for a batch that Run drives.
func TestTCPConformanceTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := auth.LoadOrMakeCA(dir, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Issue(dir, "node", auth.Identity{Role: auth.RoleNode, Name: "holder"}, auth.DefaultTrustDomain, []string{"127.0.0.1"}, true, time.Hour); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	runConformance(t, func(t *testing.T, mem []byte) pair {
		server := NewTCP(TCPConfig{})
		if err := server.Register(7, mem); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := serveTCPOn(t, tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}}), server, nil)
		client := NewTCP(TCPConfig{TLS: &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}})
		t.Cleanup(func() { client.Close(); server.Close() })
		return pair{client: client, peer: addr, mem: mem}
	})
}

func TestTCPConformanceOneConnTinySlices(t *testing.T) {
	runConformance(t, tcpFactory(TCPConfig{ConnsPerPeer: 1, SliceBytes: 4096}))
}

func grpcFactory(cfg GRPCConfig) factory {
	return func(t *testing.T, mem []byte) pair {
		server := NewGRPC(GRPCConfig{})
		if err := server.Register(7, mem); err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer(ServerOptions()...)
		server.RegisterServer(s)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan struct{})
		go func() { defer close(served); s.Serve(ln) }()
		client := NewGRPC(cfg)
		t.Cleanup(func() { client.Close(); s.Stop(); <-served; server.Close() })
		return pair{client: client, peer: ln.Addr().String(), mem: mem}
	}
}

func TestGRPCConformance(t *testing.T) {
	runConformance(t, grpcFactory(GRPCConfig{}))
}

func TestGRPCConformanceTwoStreamsPerOp(t *testing.T) {
	runConformance(t, grpcFactory(GRPCConfig{StreamsPerOp: 2}))
}
