package pool

import (
	"context"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/api/wire"
)

func us(n int) time.Duration { return time.Duration(n) * time.Microsecond }

func TestCallOverheads(t *testing.T) {
	var c callOverheads
	if got := c.beyond(us(7), 1); got != us(7) {
		t.Fatalf("no reports: beyond(7µs) = %v, want the node's own 7µs", got)
	}
	for _, bad := range []time.Duration{0, -us(5), maxCallOverhead + 1} {
		if c.report(bad, 1) {
			t.Errorf("report(%v) taken", bad)
		}
	}
	c.report(us(80), 0)
	c.report(us(60), 0)
	if _, ok := c.median(); ok {
		t.Fatal("a median from two reports")
	}
	if got := c.beyond(us(7), 0); got != us(7) {
		t.Fatalf("two reports: beyond = %v, want 7µs", got)
	}
	c.report(us(9000), 0) // one stalled call
	if got, ok := c.median(); !ok || got != us(80) {
		t.Fatalf("median of 80, 60, 9000 µs = %v, %v; want 80µs", got, ok)
	}
	if got := c.beyond(us(7), 0); got != us(80) {
		t.Fatalf("beyond = %v, want the reports' 80µs", got)
	}
	// The ring keeps the latest callOverheadReports: after that many
	// reports of 100 µs the earlier three are gone.
	for range callOverheadReports {
		c.report(us(100), 0)
	}
	if got, _ := c.median(); got != us(100) {
		t.Fatalf("median after the ring turned = %v, want 100µs", got)
	}
	// Half the ring and one more at 50 µs move the median there.
	for range callOverheadReports/2 + 1 {
		c.report(us(50), 0)
	}
	if got, _ := c.median(); got != us(50) {
		t.Fatalf("median = %v, want 50µs", got)
	}
}

// Reports of calls that said their length count for that length's class
// (1, 2–3, 4–7, … blocks) once it has three; a class without enough
// falls back to the median of every length.
func TestCallOverheadsByChainLength(t *testing.T) {
	var c callOverheads
	for range 3 {
		c.report(us(200), 1)
		c.report(us(330), 64)
	}
	c.report(us(250), 5)
	c.report(us(240), 4)
	for _, tc := range []struct {
		blocks int
		want   time.Duration
	}{
		{1, us(200)},
		{64, us(330)},
		{127, us(330)}, // the class of 64
		{128, us(250)}, // none of its own: the median of all eight
		{4, us(250)},   // two of its own
		{0, us(250)},   // the caller did not say
	} {
		if got := c.beyond(us(7), tc.blocks); got != tc.want {
			t.Errorf("beyond for %d blocks = %v, want %v", tc.blocks, got, tc.want)
		}
	}
	c.report(us(245), 7)
	if got := c.beyond(us(7), 6); got != us(245) {
		t.Errorf("beyond for 6 blocks after three reports of 4-7 = %v, want 245µs", got)
	}
	// A class keeps its latest callOverheadClassReports: that many at 400
	// µs leave none of the earlier 200.
	for range callOverheadClassReports {
		c.report(us(400), 1)
	}
	if got := c.beyond(us(7), 1); got != us(400) {
		t.Errorf("beyond for 1 block after the class's ring turned = %v, want 400µs", got)
	}
	// Chains past the last class share it.
	for range 3 {
		c.report(us(900), 1<<20)
	}
	if got := c.beyond(us(7), 2048); got != us(900) {
		t.Errorf("beyond for 2048 blocks = %v, want the last class's 900µs", got)
	}
}

// Both doors hand the node a report's length with its cost: a Fetch frame
// on the data channel (the header word's high half) and gRPC's
// previous_call_blocks. A standalone node answers each fetch of a block it
// lacks with NotFound, and takes the report all the same.
func TestCallOverheadReportsCarryTheirLength(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	raw := rawConn(t, n)
	chain := wire.AppendChain(nil, [][]byte{[]byte("absent")})
	for range minCallOverheadReports {
		raw.Write(append(wire.AppendRequest(nil, &wire.Request{Op: wire.OpFetch, Tenant: []byte("t"), Namespace: []byte("n"),
			ValueLen: uint64(len(chain)), CallOverheadUs: 330, PreviousCallBlocks: 64}), chain...))
		var resp wire.Response
		if err := wire.ReadResponse(raw, &resp); err != nil || resp.Status != uint8(codes.OK) {
			t.Fatalf("fetch frame: %v, status %d %s", err, resp.Status, resp.Message)
		}
		if _, err := io.CopyN(io.Discard, raw, int64(resp.ValueLen)); err != nil {
			t.Fatal(err)
		}
	}
	rpc := kvpoolv1.NewKVPoolServiceClient(dial(t, n, api.PathGRPC).Conn())
	for range minCallOverheadReports {
		if _, err := rpc.Fetch(ctx, &kvpoolv1.FetchRequest{Tenant: "t", Namespace: "n", Keys: [][]byte{[]byte("absent")},
			PreviousCallOverheadUs: 200, PreviousCallBlocks: 1}); err != nil {
			t.Fatal(err)
		}
	}
	o := &n.fetcher.overheads
	if got := o.beyond(0, 64); got != us(330) {
		t.Errorf("beyond for 64 blocks = %v, want the data channel's 330µs", got)
	}
	if got := o.beyond(0, 1); got != us(200) {
		t.Errorf("beyond for 1 block = %v, want gRPC's 200µs", got)
	}
	if got := o.beyond(0, 16); got != us(330) {
		t.Errorf("beyond for 16 blocks (no reports) = %v, want the median of all six, 330µs", got)
	}
}
