package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// tcpPutRoundTrips is the floor of a serial put over TCP: each client
// sends a call's values (a 16-byte header with their length, then the
// bytes, in one write) on its own raw TCP connection and waits for a
// 16-byte answer before it sends the next, as a put waits for the
// node's. The server reads the bytes into the streaming baseline's
// region, frame by frame as it does. No index, checksum or commit: what
// a put costing nothing of its own would take, turnarounds and all. The
// streaming baseline never waits for an answer, so a serial put can
// reach it only where a turnaround costs nothing next to a block's
// transfer.
type tcpPutRoundTrips struct {
	stream *tcpBaseline // lends its listener and region
	meter
}

func (b *tcpPutRoundTrips) name() string {
	if n := b.stream.cfg.Clients; n > 1 {
		return fmt.Sprintf("raw-tcp request/response, %d connections", n)
	}
	return "raw-tcp request/response, 1 connection"
}

func (b *tcpPutRoundTrips) close() {} // the stream's to close

func (b *tcpPutRoundTrips) run(ctx context.Context, d time.Duration, p *Progress) error {
	cfg := b.stream.cfg
	size, call := cfg.BlockBytes, cfg.BlockBytes*cfg.Batch
	frames := len(b.stream.src) / size
	return b.timed(p, "floor request/response", d, cfg.Clients, func(i int, deadline time.Time, total *atomic.Int64) error {
		cli, sc, err := b.stream.pair()
		if err != nil {
			return err
		}
		defer cli.Close()
		served := make(chan error, 1)
		go func() {
			defer sc.Close()
			var hdr [16]byte
			for f := 0; ; {
				if _, err := io.ReadFull(sc, hdr[:]); err != nil {
					served <- nil // the client hung up
					return
				}
				for n := int(binary.LittleEndian.Uint64(hdr[:])); n > 0; n -= size {
					off := clientFrame(i, f, cfg.Clients, frames) * size
					f++
					if err := readPieces(sc, b.stream.src[off:off+size], false); err != nil {
						served <- err
						return
					}
				}
				if _, err := sc.Write(hdr[:]); err != nil {
					served <- err
					return
				}
			}
		}()
		value := make([]byte, call)
		fillValue(value, uint64(i))
		var hdr [16]byte
		binary.LittleEndian.PutUint64(hdr[:], uint64(call))
		for time.Now().Before(deadline) {
			bufs := net.Buffers{hdr[:], value}
			if _, err := bufs.WriteTo(cli); err != nil {
				return err
			}
			if _, err := io.ReadFull(cli, hdr[:]); err != nil {
				return err
			}
			total.Add(int64(call))
		}
		cli.Close()
		return <-served
	})
}
