package transfer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
)

// TestTCPRunEndsWhenTheContextDoesWhileWaiting runs a batch the caller
// drives against a peer that takes the requests and never answers: the
// driver waits on the socket, and the context's end must break the
// connection under it, fail the batch and give the buffer back.
func TestTCPRunEndsWhenTheContextDoesWhileWaiting(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	requested := make(chan struct{}, 4)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				var buf [64]byte
				for {
					if _, err := c.Read(buf[:]); err != nil {
						return
					}
					select {
					case requested <- struct{}{}:
					default:
					}
				}
			})
		}
	})
	client := NewTCP(TCPConfig{})
	defer client.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-requested
		cancel()
	}()
	start := time.Now()
	b, err := Run(ctx, client, []Op{{Kind: Read, Peer: ln.Addr().String(), Region: 7, Local: make([]byte, 1<<20)}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run against a silent peer: %v, want context.Canceled", err)
	}
	select {
	case <-b.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the batch did not complete after its context ended")
	}
	if !errors.Is(b.Err(), ErrPeer) && !errors.Is(b.Err(), context.Canceled) {
		t.Fatalf("batch error %v, want the cancellation", b.Err())
	}
	t.Logf("ended %v after the run began", time.Since(start))
}

// TestTCPRunAndSubmitShareAConnection interleaves, on one connection,
// batches a caller drives with batches its reader reads: each response
// reaches its own slice whoever reads it, and a driver that finishes
// hands the rest back to the reader.
func TestTCPRunAndSubmitShareAConnection(t *testing.T) {
	mem := pattern(8<<20, 21)
	server := NewTCP(TCPConfig{})
	if err := server.Register(7, mem); err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	addr := serveTCP(t, server)
	// Both batches fit the window: every request is on the connection
	// before the driver reads.
	client := NewTCP(TCPConfig{ConnsPerPeer: 1, SliceBytes: 64 << 10, WindowBytes: 1 << 20})
	defer client.Close()
	ctx := context.Background()
	for round := range 50 {
		// A large batch nobody drives goes first; a small driven one
		// queues its requests behind it on the same connection, so its
		// driver reads the large batch's responses first.
		big := make([]byte, 512<<10)
		bigOff := uint64(round*4099) % uint64(len(mem)-len(big))
		large := client.Submit(ctx, []Op{{Kind: Read, Peer: addr, Region: 7, Offset: bigOff, Local: big, Checksum: true}})
		small := make([]byte, 100<<10)
		smallOff := uint64(round*7919) % uint64(len(mem)-len(small))
		b, err := Run(ctx, client, []Op{{Kind: Read, Peer: addr, Region: 7, Offset: smallOff, Local: small}})
		if err != nil {
			t.Fatalf("round %d: driven batch: %v", round, err)
		}
		if b.Bytes() != uint64(len(small)) || !bytes.Equal(small, mem[smallOff:smallOff+uint64(len(small))]) {
			t.Fatalf("round %d: driven batch read wrong bytes", round)
		}
		if err := large.Wait(ctx); err != nil {
			t.Fatalf("round %d: large batch: %v", round, err)
		}
		if !bytes.Equal(big, mem[bigOff:bigOff+uint64(len(big))]) {
			t.Fatalf("round %d: large batch read wrong bytes", round)
		}
		if got, want := large.OpCRC(0), api.Checksum(mem[bigOff:bigOff+uint64(len(big))]); got != want {
			t.Fatalf("round %d: large batch crc %08x, want %08x", round, got, want)
		}
	}
}
