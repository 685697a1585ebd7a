package transfer

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCloseRacesSubmit closes a transport while goroutines submit small
// reads to a live peer through it. Close must wait for every goroutine a
// Submit started, and a Submit that loses the race must fail its batch at
// once: when both Close and a Submit have returned, that Submit's batch is
// complete. A goroutine registered with the transport's WaitGroup after
// Close began waiting shows up here as a batch still running, or as a
// WaitGroup misuse under -race.
func TestCloseRacesSubmit(t *testing.T) {
	const rounds, submitters, perSubmitter = 30, 8, 64
	// More Ps than cores: the OS then preempts submitters at arbitrary
	// points, between a Submit's check of closed and its goroutines'
	// start among them.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(32, runtime.GOMAXPROCS(0))))
	ctx := context.Background()
	mem := pattern(1<<20, 13)
	for _, tc := range []struct {
		name      string
		newPair   factory
		newClient func() Transport
	}{
		{"tcp", tcpFactory(TCPConfig{}), func() Transport { return NewTCP(TCPConfig{}) }},
		{"grpc", grpcFactory(GRPCConfig{}), func() Transport { return NewGRPC(GRPCConfig{StreamsPerOp: 2}) }},
		{"shm", shmFactory(SHMConfig{}), func() Transport { return NewSHM(SHMConfig{}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.newPair(t, mem)
			for round := range rounds {
				client := tc.newClient()
				var submitted atomic.Int64
				var closeDone atomic.Bool
				batches := make([][]*Batch, submitters)
				var wg sync.WaitGroup
				for g := range submitters {
					wg.Go(func() {
						for i := range perSubmitter {
							if closeDone.Load() && i > 0 {
								break
							}
							off := uint64((g*perSubmitter + i) * 4096 % (len(mem) - 4096))
							b := client.Submit(ctx, []Op{
								{Kind: Read, Peer: p.peer, Region: 7, Offset: off, Local: make([]byte, 512)},
								{Kind: Read, Peer: p.peer, Region: 7, Offset: off + 1024, Local: make([]byte, 64)},
							})
							batches[g] = append(batches[g], b)
							submitted.Add(1)
						}
					})
				}
				// Close after a varying number of submissions, so that
				// some rounds close while connections are being made and
				// others while batches are in flight.
				closed := make(chan struct{})
				go func() {
					defer close(closed)
					for submitted.Load() < int64(round%10*8) {
						runtime.Gosched()
					}
					client.Close()
					closeDone.Store(true)
				}()
				select {
				case <-closed:
				case <-time.After(10 * time.Second):
					t.Fatalf("round %d: Close did not return: it waits for goroutines started after it began", round)
				}
				wg.Wait()
				for g := range batches {
					for i, b := range batches[g] {
						if done, _ := b.Poll(); !done {
							t.Fatalf("round %d: submitter %d batch %d still running after Close returned: a goroutine outlived Close", round, g, i)
						}
					}
				}
				if err := client.Close(); err != nil {
					t.Fatalf("round %d: second Close: %v", round, err)
				}
			}
		})
	}
}
