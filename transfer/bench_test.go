package transfer

import (
	"context"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// measure runs f repeatedly for d and returns GB/s over the bytes f says
// it moved.
func measure(d time.Duration, f func() int) float64 {
	start := time.Now()
	var n int64
	for time.Since(start) < d {
		n += int64(f())
	}
	return float64(n) / time.Since(start).Seconds() / 1e9
}

// BenchmarkStriping pulls a 64-block chain of 2 MiB blocks (128 MiB) from
// a peer over tcp with one connection and with two, alternating, and
// reports both rates and their ratio.
//
//	go test -run x -bench Striping -benchtime 1x ./transfer
func BenchmarkStriping(b *testing.B) {
	const blocks, size = 64, 2 << 20
	mem := pattern(blocks*size, 9)
	server := NewTCP(TCPConfig{})
	server.Register(7, mem)
	addr := serveTCPBench(b, server)
	one, two := NewTCP(TCPConfig{ConnsPerPeer: 1}), NewTCP(TCPConfig{ConnsPerPeer: 2})
	defer one.Close()
	defer two.Close()
	locals := make([][]byte, blocks)
	for i := range locals {
		locals[i] = make([]byte, size)
	}
	pull := func(tr *TCP) func() int {
		return func() int {
			ops := make([]Op, blocks)
			for i := range ops {
				ops[i] = Op{Kind: Read, Peer: addr, Region: 7, Offset: uint64(i * size), Local: locals[i]}
			}
			if err := tr.Submit(context.Background(), ops).Wait(context.Background()); err != nil {
				b.Fatal(err)
			}
			return blocks * size
		}
	}
	for b.Loop() {
		// Alternate one-second rounds so drift hits both; report the
		// totals and the median of the per-round ratios.
		var r1, r2 float64
		var ratios []float64
		const rounds = 6
		for range rounds {
			a := measure(time.Second, pull(one))
			c := measure(time.Second, pull(two))
			r1, r2 = r1+a, r2+c
			ratios = append(ratios, c/a)
		}
		slices.Sort(ratios)
		// The same machine's raw TCP, streaming 2 MiB frames over one
		// connection and over two, for reference.
		raw1, raw2 := rawTCP(1, 2*time.Second), rawTCP(2, 2*time.Second)
		b.ReportMetric(raw2/raw1, "raw-tcp-2/1")
		b.ReportMetric(r1/rounds, "GB/s-1conn")
		b.ReportMetric(r2/rounds, "GB/s-2conns")
		b.ReportMetric(r2/r1, "ratio")
		b.ReportMetric((ratios[rounds/2-1]+ratios[rounds/2])/2, "median-round-ratio")
	}
}

func serveTCPBench(b *testing.B, server *TCP) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var pre [8]byte
				if _, err := io.ReadFull(c, pre[:]); err == nil && pre == TCPPreamble {
					server.ServeConn(ctx, c)
				}
			}()
		}
	}()
	b.Cleanup(func() { cancel(); ln.Close() })
	return ln.Addr().String()
}

// protoBlocks is a stock gRPC service streaming blocks as protobuf
// BytesValue messages: the baseline the grpc transport must beat.
type protoBlocks struct{ mem []byte }

func (p *protoBlocks) read(_ any, stream grpc.ServerStream) error {
	var req wrapperspb.UInt64Value
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	const size = 2 << 20
	off := int(req.GetValue()) * size
	return stream.SendMsg(&wrapperspb.BytesValue{Value: p.mem[off : off+size]})
}

// BenchmarkGRPCTransport reads 2 MiB blocks with the grpc transport (raw
// codec) and with stock protobuf gRPC (BytesValue messages, default
// options), one stream at a time each, alternating, and reports both rates
// and their ratio.
//
//	go test -run x -bench GRPCTransport -benchtime 1x ./transfer
func BenchmarkGRPCTransport(b *testing.B) {
	const blocks, size = 64, 2 << 20
	mem := pattern(blocks*size, 10)
	server := NewGRPC(GRPCConfig{})
	server.Register(7, mem)
	s := grpc.NewServer(ServerOptions()...)
	server.RegisterServer(s)
	pb := &protoBlocks{mem: mem}
	s.RegisterService(&grpc.ServiceDesc{ServiceName: "bench.Proto", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Read", ServerStreams: true, Handler: pb.read}}}, pb)
	ps := grpc.NewServer()
	ps.RegisterService(&grpc.ServiceDesc{ServiceName: "bench.Proto", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Read", ServerStreams: true, Handler: pb.read}}}, pb)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	pln, _ := net.Listen("tcp", "127.0.0.1:0")
	go s.Serve(ln)
	go ps.Serve(pln)
	defer s.Stop()
	defer ps.Stop()
	raw := NewGRPC(GRPCConfig{})
	defer raw.Close()
	pc, err := grpc.NewClient(pln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(8<<20)))
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	local := make([]byte, size)
	i := 0
	rawRead := func() int {
		op := Op{Kind: Read, Peer: ln.Addr().String(), Region: 7, Offset: uint64(i%blocks) * size, Local: local}
		i++
		if err := raw.Submit(context.Background(), []Op{op}).Wait(context.Background()); err != nil {
			b.Fatal(err)
		}
		return size
	}
	protoRead := func() int {
		stream, err := pc.NewStream(context.Background(), &grpc.StreamDesc{StreamName: "Read", ServerStreams: true}, "/bench.Proto/Read")
		if err != nil {
			b.Fatal(err)
		}
		stream.SendMsg(wrapperspb.UInt64(uint64(i % blocks)))
		i++
		stream.CloseSend()
		var v wrapperspb.BytesValue
		if err := stream.RecvMsg(&v); err != nil {
			b.Fatal(err)
		}
		copy(local, v.GetValue())
		stream.RecvMsg(&v) // EOF
		return size
	}
	for b.Loop() {
		var r, p float64
		for range 3 {
			r += measure(time.Second, rawRead)
			p += measure(time.Second, protoRead)
		}
		b.ReportMetric(r/3, "GB/s-raw")
		b.ReportMetric(p/3, "GB/s-proto")
		b.ReportMetric(r/p, "ratio")
	}
}

// rawTCP streams 2 MiB frames over conns loopback connections for d and
// returns GB/s.
func rawTCP(conns int, d time.Duration) float64 {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	src := pattern(2<<20, 11)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for {
					if _, err := c.Write(src); err != nil {
						return
					}
				}
			}()
		}
	}()
	var total atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				return
			}
			defer c.Close()
			buf := make([]byte, 2<<20)
			for time.Since(start) < d {
				if _, err := readPieces(c, buf); err != nil {
					return
				}
				total.Add(int64(len(buf)))
			}
		})
	}
	wg.Wait()
	return float64(total.Load()) / time.Since(start).Seconds() / 1e9
}
