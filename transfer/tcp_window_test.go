package transfer

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
)

// TestTCPConnectionsPullFromTheQueue stalls one of a peer's two
// connections and checks that the other carries every slice the stalled
// one has not been given: a connection takes the next slice as it drains,
// never more than its window ahead, so a slow connection holds back only
// what fits in its window.
func TestTCPConnectionsPullFromTheQueue(t *testing.T) {
	const (
		slice  = 4 << 10
		window = 2 * slice
		slices = 16
	)
	mem := pattern(1<<20, 11)
	server := NewTCP(TCPConfig{})
	if err := server.Register(7, mem); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var (
		served   [2]atomic.Int32 // requests served, by the order connections were accepted
		progress = make(chan struct{}, slices)
	)
	addr := serveTCPWith(t, server, func(k int) Serving {
		if k > 1 {
			t.Errorf("connection %d accepted; the transport keeps 2", k+1)
			return Serving{Access: func(context.Context, Kind, RegionID, uint64, uint64) error { return api.ErrPermissionDenied }}
		}
		return Serving{Access: func(context.Context, Kind, RegionID, uint64, uint64) error {
			if k == 0 {
				<-release // the first connection stalls on its first request
			}
			served[k].Add(1)
			progress <- struct{}{}
			return nil
		}}
	})
	var releaseOnce sync.Once
	unstall := func() { releaseOnce.Do(func() { close(release) }) }
	// (Cleanups run last first: a failed test unstalls the server before
	// serveTCPWith waits for it.)
	t.Cleanup(func() { unstall(); server.Close() })

	ctx := context.Background()
	client := NewTCP(TCPConfig{ConnsPerPeer: 2, SliceBytes: slice, MaxSliceBytes: slice, WindowBytes: window})
	defer client.Close()
	local := make([]byte, slices*slice)
	b := client.Submit(ctx, []Op{{Kind: Read, Peer: addr, Region: 7, Offset: 512, Local: local, Checksum: true}})
	// The stalled connection was given one window: the other serves the
	// rest of the op alone.
	stalledShare := int32(window / slice)
	for served[1].Load() < slices-stalledShare {
		select {
		case <-progress:
		case <-b.Done():
			t.Fatalf("the batch ended with the first connection stalled: %v", b.Err())
		case <-time.After(10 * time.Second):
			t.Fatalf("the free connection served %d of %d slices, and no more", served[1].Load(), slices-stalledShare)
		}
	}
	if n := served[0].Load(); n != 0 {
		t.Fatalf("the stalled connection served %d requests", n)
	}
	unstall()
	if err := b.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if got := [2]int32{served[0].Load(), served[1].Load()}; got != [2]int32{stalledShare, slices - stalledShare} {
		t.Fatalf("requests served per connection %v, want %v", got, [2]int32{stalledShare, slices - stalledShare})
	}
	if !bytes.Equal(local, mem[512:512+len(local)]) {
		t.Fatal("wrong bytes")
	}
	if got, want := b.OpCRC(0), api.Checksum(mem[512:512+len(local)]); got != want {
		t.Fatalf("op CRC %08x, want %08x", got, want)
	}
}

// TestTCPSlicesFollowTheBatch checks how finely ops are cut: a batch
// asks each of its peer's connections for four slices or more, of
// SliceBytes at least and MaxSliceBytes at most, so a long batch moves in
// few large requests and a short one is still spread over every
// connection.
func TestTCPSlicesFollowTheBatch(t *testing.T) {
	const (
		minSlice = 4 << 10
		maxSlice = 64 << 10
	)
	mem := pattern(4<<20, 12)
	server := NewTCP(TCPConfig{})
	if err := server.Register(7, mem); err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int32
	addr := serveTCPWith(t, server, func(int) Serving {
		return Serving{Access: func(context.Context, Kind, RegionID, uint64, uint64) error {
			requests.Add(1)
			return nil
		}}
	})
	t.Cleanup(func() { server.Close() })
	client := NewTCP(TCPConfig{ConnsPerPeer: 2, SliceBytes: minSlice, MaxSliceBytes: maxSlice, WindowBytes: 2 * minSlice})
	defer client.Close()
	for _, tc := range []struct {
		name     string
		ops, op  int // how many ops of how many bytes
		requests int32
	}{
		{"an op below the smallest slice goes whole", 1, 3 << 10, 1},
		{"an op of eight smallest slices goes in eight", 1, 8 * minSlice, 8},
		{"a larger op in eight slices of its eighth", 1, 256 << 10, 8},
		{"a long batch in slices of the largest size", 16, 128 << 10, 32},
		{"a batch of small ops, each whole", 64, 2 << 10, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requests.Store(0)
			ops := make([]Op, tc.ops)
			for i := range ops {
				ops[i] = Op{Kind: Read, Peer: addr, Region: 7, Offset: uint64(i * tc.op), Local: make([]byte, tc.op), Checksum: true}
			}
			b := client.Submit(context.Background(), ops)
			if err := b.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			for i, op := range ops {
				if want := mem[op.Offset : op.Offset+uint64(tc.op)]; !bytes.Equal(op.Local, want) || b.OpCRC(i) != api.Checksum(want) {
					t.Fatalf("op %d: wrong bytes or checksum", i)
				}
			}
			if got := requests.Load(); got != tc.requests {
				t.Fatalf("%d requests, want %d", got, tc.requests)
			}
		})
	}
}

// TestTCPSliceDefaults checks the largest slice's default: 1 MiB, or the
// smallest slice where the connections run BBR, whose pacing coarse
// slices slowed.
func TestTCPSliceDefaults(t *testing.T) {
	for _, tc := range []struct {
		cfg  TCPConfig
		want int
	}{
		{TCPConfig{Congestion: "cubic"}, 1 << 20},
		{TCPConfig{Congestion: "bbr"}, 512 << 10},
		{TCPConfig{Congestion: "bbr", SliceBytes: 256 << 10}, 256 << 10},
		{TCPConfig{Congestion: "bbr", MaxSliceBytes: 2 << 20}, 2 << 20},
		{TCPConfig{Congestion: "cubic", SliceBytes: 2 << 20}, 2 << 20},
	} {
		if got := NewTCP(tc.cfg).cfg.MaxSliceBytes; got != tc.want {
			t.Errorf("%+v: largest slice %d, want %d", tc.cfg, got, tc.want)
		}
	}
}
