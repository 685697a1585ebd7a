package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/test/cluster"
	"github.com/kvpool/kvpool/transfer"
)

func blockValue(i, size int) []byte {
	v := make([]byte, size)
	for j := range v {
		v[j] = byte(i*131 + j*7)
	}
	return v
}

func putBlocks(t *testing.T, c *api.Client, keys [][]byte, size int) {
	t.Helper()
	for i, k := range keys {
		if err := c.Put(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k}, blockValue(i, size)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFetchPullsFromTheHolderAndPublishesAReplica(t *testing.T) {
	for _, tr := range []transfer.Protocol{transfer.ProtocolTCP, transfer.ProtocolGRPC, transfer.ProtocolSHM} {
		t.Run(tr.String(), func(t *testing.T) {
			// Count the ops each transport carries on node-2, the puller:
			// with shm the nodes share this host, so no byte may go over
			// tcp.
			var mu sync.Mutex
			ops := map[string]int{}
			c := cluster.New(t, cluster.Config{Nodes: 3, Mutate: func(i int, pc *pool.Config) {
				pc.Transport = tr
				if i == 2 {
					pc.WrapTransport = func(inner transfer.Transport) transfer.Transport {
						return &transfer.Faulty{Transport: inner, BeforeSubmit: func(o []transfer.Op) {
							mu.Lock()
							ops[inner.Name()] += len(o)
							mu.Unlock()
						}}
					}
				}
			}})
			keys := chainKeys(t, 21, 8)
			putBlocks(t, c.Client(0, api.PathData), keys, 1<<20+3)
			c.Converged(10 * time.Second)
			eng := c.Client(2, api.PathShm)
			res, err := eng.Fetch(context.Background(), "acme", "llama3-8b", keys, 0)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.Err != nil || r.Source != "node-0" || r.Size != 1<<20+3 {
					t.Fatalf("block %d: %+v", i, r)
				}
			}
			for i, k := range keys {
				got, err := eng.GetValue(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k})
				if err != nil || !bytes.Equal(got, blockValue(i, 1<<20+3)) {
					t.Fatalf("block %d after fetch: %v", i, err)
				}
			}
			// A second fetch finds everything local.
			res, _ = eng.Fetch(context.Background(), "acme", "llama3-8b", keys, 0)
			for _, r := range res {
				if r.Source != "" || r.Err != nil {
					t.Fatalf("second fetch pulled again: %+v", r)
				}
			}
			c.Eventually("the replica to be located", 10*time.Second, func() bool { return locateNodes(c, 1, keys)["node-2"] == 8 })
			est := c.Nodes[2].Node.Links().Estimate("node-0", time.Now())
			if est.Samples == 0 || est.Bytes < 8<<20 {
				t.Fatalf("the link estimate saw nothing: %+v", est)
			}
			mu.Lock()
			defer mu.Unlock()
			if ops[tr.String()] != 8 || len(ops) != 1 {
				t.Fatalf("ops by transport %v, want all 8 over %s", ops, tr)
			}
		})
	}
}

// Corrupted bytes are caught by the checksum (DataLoss) and the block is
// fetched again from another replica.
func TestFetchCorruptionRetriesAnotherReplica(t *testing.T) {
	var faulty *transfer.Faulty
	reg := prometheus.NewRegistry()
	c := cluster.New(t, cluster.Config{Nodes: 3, Mutate: func(i int, pc *pool.Config) {
		if i == 2 {
			pc.Registerer, pc.Gatherer = reg, reg
			pc.WrapTransport = func(tr transfer.Transport) transfer.Transport {
				faulty = &transfer.Faulty{Transport: tr}
				return faulty
			}
			// node-0 looks fastest, so it is tried first.
			pc.Links.Seeds = map[string]transfer.Seed{"node-0": {BytesPerSecond: 10e9}}
		}
	}})
	keys := chainKeys(t, 22, 4)
	putBlocks(t, c.Client(0, api.PathData), keys, 300_000)
	putBlocks(t, c.Client(1, api.PathData), keys, 300_000)
	c.Converged(10 * time.Second)
	holderOf := func(op transfer.Op) string {
		for _, d := range c.Nodes {
			if d.Node.Addr().String() == op.Peer {
				return d.ID
			}
		}
		return ""
	}
	faulty.Corrupt.Store(func(op transfer.Op) bool { return holderOf(op) == "node-0" })
	res, err := c.Client(2, api.PathData).Fetch(context.Background(), "acme", "llama3-8b", keys, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Source != "node-1" {
			t.Fatalf("block %d: %+v, want it from node-1 after node-0's bytes failed", i, r)
		}
	}
	// With every replica corrupt, the caller sees DataLoss and nothing is
	// committed.
	faulty.Corrupt.Store(func(transfer.Op) bool { return true })
	more := chainKeys(t, 23, 2)
	putBlocks(t, c.Client(0, api.PathData), more, 5000)
	c.Converged(10 * time.Second)
	res, err = c.Client(2, api.PathData).Fetch(context.Background(), "acme", "llama3-8b", more, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if !errors.Is(r.Err, api.ErrDataLoss) {
			t.Fatalf("block %d with every copy corrupt: %v, want DataLoss", i, r.Err)
		}
	}
	if ex, _ := c.Client(2, api.PathData).Exists(context.Background(), "acme", "llama3-8b", more); ex[0] || ex[1] {
		t.Fatal("a corrupt block was committed")
	}
	// Each corrupt block counts once: four from node-0 the first time,
	// two the second; nothing else failed.
	failures := counters(t, reg, "kvpool_transfer_fetch_failures_total", func(l map[string]string) string { return l["reason"] })
	if want := map[string]float64{"checksum": 6, "unreachable": 0, "pin": 0, "space": 0, "read": 0}; !maps.Equal(failures, want) {
		t.Fatalf("fetch failures %v, want %v", failures, want)
	}
}

// A holder killed as the transfer starts gives Unavailable within the
// deadline, and no partial block is committed; a stalled link never
// outlives the deadline either.
func TestFetchFromADeadOrStalledHolder(t *testing.T) {
	for _, tr := range []string{"tcp", "shm"} {
		t.Run(tr, func(t *testing.T) {
			var faulty *transfer.Faulty
			var kill atomic.Bool
			var c *cluster.Cluster
			c = cluster.New(t, cluster.Config{Nodes: 2, Mutate: func(i int, pc *pool.Config) {
				if i == 1 {
					pc.FetchTimeout = time.Second
					pc.WrapTransport = func(tr transfer.Transport) transfer.Transport {
						faulty = &transfer.Faulty{Transport: tr, BeforeSubmit: func([]transfer.Op) {
							if kill.Swap(false) {
								c.Kill(0)
							}
						}}
						return faulty
					}
				}
			}})
			keys := chainKeys(t, 24, 6)
			putBlocks(t, c.Client(0, api.PathData), keys, 2<<20)
			c.Converged(10 * time.Second)
			eng := c.Client(1, api.PathData)

			faulty.Stall.Store(true)
			start := time.Now()
			res, err := eng.Fetch(context.Background(), "acme", "llama3-8b", keys[:3], 0)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if !errors.Is(r.Err, api.ErrUnavailable) {
					t.Fatalf("stalled link, block %d: %v, want Unavailable", i, r.Err)
				}
			}
			if took > 1500*time.Millisecond {
				t.Fatalf("a stalled fetch took %v; the deadline is 1 s", took)
			}
			faulty.Stall.Store(false)

			kill.Store(true)
			start = time.Now()
			res, err = eng.Fetch(context.Background(), "acme", "llama3-8b", keys, 0)
			took = time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if !errors.Is(r.Err, api.ErrUnavailable) {
					t.Fatalf("dead holder, block %d: %v, want Unavailable", i, r.Err)
				}
			}
			if took > 1500*time.Millisecond {
				t.Fatalf("a fetch from a dead holder took %v; the deadline is 1 s", took)
			}
			ex, _ := eng.Exists(context.Background(), "acme", "llama3-8b", keys)
			for i, e := range ex {
				if e {
					t.Fatalf("block %d was committed from a failed transfer", i)
				}
			}
			if st := c.Nodes[1].Node.Store().Stats(); st.Reservations != 0 || st.Blocks != 0 {
				t.Fatalf("node-1 keeps %d reservations and %d blocks after failed fetches", st.Reservations, st.Blocks)
			}
			t.Logf("dead holder reported after %v", took)
			_ = fmt.Sprint
		})
	}
}

func TestPutWithReplicas(t *testing.T) {
	zones := []string{"rack-a", "rack-a", "rack-b", "rack-b"}
	c := cluster.New(t, cluster.Config{Nodes: 4, Mutate: func(i int, pc *pool.Config) { pc.Zone = zones[i] }})
	c.Eventually("gossip to see every node", 10*time.Second, func() bool { return len(c.Nodes[0].Node.Gossip().Peers()) == 4 })
	ctx := context.Background()
	for _, path := range []api.Path{api.PathData, api.PathGRPC, api.PathShm} {
		keys := chainKeys(t, uint32(30+path), 1)
		k := api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: keys[0]}
		v := blockValue(1, 700_000)
		if err := c.Client(0, path).PutReplicas(ctx, k, v, 2); err != nil {
			t.Fatalf("%v: put with 2 copies: %v", path, err)
		}
		c.Eventually("two holders located", 10*time.Second, func() bool {
			got := locateNodes(c, 3, keys)
			n := 0
			for _, v := range got {
				n += v
			}
			return n == 2 && got["node-0"] == 1
		})
		got := locateNodes(c, 3, keys)
		if got["node-2"]+got["node-3"] != 1 {
			t.Fatalf("%v: the second copy should go to the other zone: %v", path, got)
		}
		for id, held := range got {
			if held == 1 {
				var idx int
				fmt.Sscanf(id, "node-%d", &idx)
				b, err := c.Client(idx, api.PathData).GetValue(ctx, k)
				if err != nil || !bytes.Equal(b, v) {
					t.Fatalf("%v: the copy on %s: %v", path, id, err)
				}
			}
		}
	}
	// More copies than nodes: the caller learns how many were placed.
	k := api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: []byte("too-many")}
	err := c.Client(1, api.PathData).PutReplicas(ctx, k, []byte("v"), 5)
	if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "4 of 5 copies") {
		t.Fatalf("5 copies on 4 nodes: %v", err)
	}
}

// Direct mode: the engine's client reads blocks from their holders itself;
// its own node routes and stores nothing. A holder that dies is replaced
// by the next one holding the block.
func TestGetDirectReadsFromTheHolders(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3})
	keys := chainKeys(t, 31, 6)
	const size = 1<<20 + 5
	putBlocks(t, c.Client(0, api.PathData), keys, size)
	putBlocks(t, c.Client(1, api.PathData), keys[:4], size)
	if err := c.Client(2, api.PathData).Put(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: keys[5]}, blockValue(5, size)); err != nil {
		t.Fatal(err)
	}
	c.Converged(10 * time.Second)
	// Over the data channel: with shared memory a dead same-host holder's
	// mapped blocks would still read (correctly: they are immutable).
	eng := c.Client(2, api.PathData)
	ctx := context.Background()

	routes, err := eng.Route(ctx, "acme", "llama3-8b", keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, hs := range routes {
		want := map[int]int{0: 2, 1: 2, 2: 2, 3: 2, 4: 1, 5: 2}[i]
		if len(hs) != want {
			t.Fatalf("block %d routes to %+v, want %d holders", i, hs, want)
		}
	}
	if routes[5][0].NodeID != "node-2" || routes[5][0].BytesPerSecond != 0 {
		t.Fatalf("a block the node holds must route to it first: %+v", routes[5])
	}
	if routes[0][0].Addr == "" || routes[0][0].BytesPerSecond <= 0 {
		t.Fatalf("a remote holder needs an address and a link estimate: %+v", routes[0][0])
	}
	check := func(res []api.DirectResult, allowed ...string) {
		t.Helper()
		for i, r := range res {
			if r.Err != nil || !bytes.Equal(r.Value, blockValue(i, size)) {
				t.Fatalf("block %d from %s: %v", i, r.Source, r.Err)
			}
			if i < 5 && !slices.Contains(allowed, r.Source) {
				t.Fatalf("block %d came from %s, want one of %v", i, r.Source, allowed)
			}
		}
		if res[5].Source != "node-2" {
			t.Fatalf("the local block came from %s", res[5].Source)
		}
	}
	res, err := eng.GetDirect(ctx, "acme", "llama3-8b", keys)
	if err != nil {
		t.Fatal(err)
	}
	check(res, "node-0", "node-1")
	if st := c.Nodes[2].Node.Store().Stats(); st.Blocks != 1 {
		t.Fatalf("direct reads stored %d blocks on the engine's node, want its own 1", st.Blocks)
	}
	// node-0 dies; its records outlive it until the lease ends, so the
	// route still names it first for some blocks: they fail over.
	c.Kill(0)
	res, err = eng.GetDirect(ctx, "acme", "llama3-8b", keys[:4])
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Source != "node-1" || !bytes.Equal(r.Value, blockValue(i, size)) {
			t.Fatalf("after node-0 died, block %d: from %q, %v", i, r.Source, r.Err)
		}
	}
	// Block 4 lived only on node-0.
	res, _ = eng.GetDirect(ctx, "acme", "llama3-8b", keys[4:5])
	if !errors.Is(res[0].Err, api.ErrUnavailable) && !errors.Is(res[0].Err, api.ErrNotFound) {
		t.Fatalf("a block whose only holder died: %v, want Unavailable or NotFound", res[0].Err)
	}
}

// A Fetch over the data channel (one frame, every path but gRPC) says what
// the gRPC Fetch says: where each block came from, its size, how long the
// fetch took, and why a block could not be had; and it is served as a
// data-channel frame, not as a gRPC call.
func TestFetchFramesAgreeWithTheGRPCFetch(t *testing.T) {
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	c := cluster.New(t, cluster.Config{Nodes: 2, Mutate: func(i int, pc *pool.Config) {
		pc.Registerer, pc.Gatherer = regs[i], regs[i]
	}})
	keys := chainKeys(t, 31, 4)
	putBlocks(t, c.Client(0, api.PathData), keys, 64<<10+5)
	c.Converged(10 * time.Second)
	ctx := context.Background()
	absent := []byte("no-such-block")
	viaGRPC, err := c.Client(1, api.PathGRPC).Fetch(ctx, "acme", "llama3-8b", keys[:2], 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []api.Path{api.PathData, api.PathShm} {
		t.Run(path.String(), func(t *testing.T) {
			before := fetchesServed(t, regs[1])
			res, err := c.Client(1, path).Fetch(ctx, "acme", "llama3-8b", append(slices.Clone(keys), absent), 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 5 {
				t.Fatalf("%d results for 5 keys", len(res))
			}
			for i, r := range res[:4] {
				// The first two were made local by the gRPC Fetch; the
				// others are pulled now (by the first path that asks).
				if r.Err != nil || r.Size != 0 && r.Size != 64<<10+5 {
					t.Fatalf("block %d: %+v", i, r)
				}
				pulled := i >= 2 && path == api.PathData
				if !pulled && (r.Source != "" || r.Took != 0) {
					t.Fatalf("block %d was local, the result says %+v", i, r)
				}
				if pulled && (r.Source != "node-0" || r.Took <= 0) {
					t.Fatalf("block %d was pulled, the result says %+v", i, r)
				}
			}
			if !errors.Is(res[4].Err, api.ErrNotFound) || !strings.Contains(res[4].Err.Error(), "no live node holds") {
				t.Fatalf("an absent block: %+v", res[4])
			}
			after := fetchesServed(t, regs[1])
			if after["data"] != before["data"]+1 || after["grpc"] != before["grpc"] {
				t.Fatalf("fetches served before %v, after %v: want one more data frame and no gRPC call", before, after)
			}
		})
	}
	for i, r := range viaGRPC {
		if r.Err != nil || r.Source != "node-0" || r.Size != 64<<10+5 || r.Took <= 0 {
			t.Fatalf("gRPC fetch of block %d: %+v", i, r)
		}
	}
	// Both doors refuse an invalid chain alike, before anything moves.
	bad := [][]byte{keys[0], bytes.Repeat([]byte{1}, api.MaxKeyBytes+1)}
	for _, path := range []api.Path{api.PathGRPC, api.PathData} {
		if _, err := c.Client(1, path).Fetch(ctx, "acme", "llama3-8b", bad, 0); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("%v: a chain with an oversized key: %v, want InvalidArgument", path, err)
		}
	}
}

// fetchesServed counts the Fetches a node served, by door (grpc, data).
func fetchesServed(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	return counters(t, reg, "kvpool_pool_requests_total", func(labels map[string]string) string {
		if strings.EqualFold(labels["op"], "fetch") {
			return labels["path"]
		}
		return ""
	})
}

// counters sums the counters named name in reg under the key by gives
// each from its labels; a counter by keys "" is left out.
func counters(t *testing.T, reg prometheus.Gatherer, name string, by func(labels map[string]string) string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if k := by(labels); k != "" {
				out[k] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// Over the tcp transport, once a namespace's block size is known (its
// first pull pins on the holder), the next blocks are read by name: no
// pin on the holder's data channel first, and the holder lets go of each
// block once it is sent. A block of another size in the namespace is
// still fetched, pinned after the named read finds its size differs.
func TestFetchReadsByNameOnceTheBlockSizeIsKnown(t *testing.T) {
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	c := cluster.New(t, cluster.Config{Nodes: 2, Mutate: func(i int, pc *pool.Config) {
		pc.Registerer, pc.Gatherer = regs[i], regs[i]
		pc.Transport = transfer.ProtocolTCP
	}})
	const size = 256<<10 + 3
	keys := chainKeys(t, 41, 7)
	putBlocks(t, c.Client(0, api.PathData), keys[:6], size)
	odd := blockValue(6, size/2)
	if err := c.Client(0, api.PathData).Put(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: keys[6]}, odd); err != nil {
		t.Fatal(err)
	}
	c.Converged(10 * time.Second)
	addressed := func() map[string]float64 {
		return counters(t, regs[1], "kvpool_transfer_fetched_blocks_total", func(l map[string]string) string { return l["addressed"] })
	}
	views := func() float64 {
		return counters(t, regs[0], "kvpool_pool_requests_total", func(l map[string]string) string {
			if l["path"] == "data" && strings.EqualFold(l["op"], "view") {
				return "view"
			}
			return ""
		})["view"]
	}
	eng := c.Client(1, api.PathData)
	fetch := func(keys [][]byte, want map[string]float64) {
		t.Helper()
		before, viewsBefore := addressed(), views()
		res, err := eng.Fetch(context.Background(), "acme", "llama3-8b", keys, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Err != nil || r.Source != "node-0" {
				t.Fatalf("block %d: %+v", i, r)
			}
		}
		after := addressed()
		for _, a := range []string{"name", "pin"} {
			if got := after[a] - before[a]; got != want[a] {
				t.Fatalf("blocks addressed by %s: %v, want %v", a, got, want[a])
			}
		}
		// Each pinned block is one View on the holder's data channel; a
		// named one is none.
		if got := views() - viewsBefore; got != want["pin"] {
			t.Fatalf("%v views on the holder, want %v", got, want["pin"])
		}
	}
	fetch(keys[:1], map[string]float64{"pin": 1})
	// The link's observations come with a fetch's bookkeeping, after its
	// answer.
	link := func() transfer.Estimate { return c.Nodes[1].Node.Links().Estimate("node-0", time.Now()) }
	c.Eventually("the pin's round trip to be recorded", 10*time.Second, func() bool { return link().RTTSamples >= 1 })
	rtts := link().RTTSamples
	fetch(keys[1:4], map[string]float64{"name": 3})
	// No pin measured the round trip: the transport's connection did.
	c.Eventually("the named reads to measure the round trip", 10*time.Second, func() bool {
		est := link()
		return est.RTTSamples > rtts && est.RTT > 0
	})
	fetch(keys[4:7], map[string]float64{"name": 2, "pin": 1})
	for i, k := range keys {
		want := blockValue(i, size)
		if i == 6 {
			want = odd
		}
		got, err := eng.GetValue(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k})
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("block %d after the fetch: %v", i, err)
		}
	}
	// The holder holds no pin once the pulls are over (named reads let go
	// as they finish; pinned ones once the fetch answered).
	c.Eventually("the holder's pins to be let go", 10*time.Second, func() bool {
		return c.Nodes[0].Node.Store().Stats().Pins == 0
	})
}

// A block too large for the fetcher teaches it a size at which the next
// block of the namespace does not fit: that block is pinned and fetched at
// its own size instead of failing for want of space.
func TestFetchFallsBackToAPinWhenTheLearnedSizeDoesNotFit(t *testing.T) {
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	c := cluster.New(t, cluster.Config{Nodes: 2, Mutate: func(i int, pc *pool.Config) {
		pc.Registerer, pc.Gatherer = regs[i], regs[i]
		pc.Transport = transfer.ProtocolTCP
		if i == 1 {
			pc.CapacityBytes, pc.MaxBlockBytes = 4<<20, 4<<20
		}
	}})
	keys := chainKeys(t, 45, 2)
	big, small := blockValue(0, 6<<20), blockValue(1, 1<<20)
	put := c.Client(0, api.PathData)
	for i, v := range [][]byte{big, small} {
		if err := put.Put(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: keys[i]}, v); err != nil {
			t.Fatal(err)
		}
	}
	c.Converged(10 * time.Second)
	eng := c.Client(1, api.PathData)
	res, err := eng.Fetch(context.Background(), "acme", "llama3-8b", keys[:1], 0)
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Err == nil {
		t.Fatalf("a 6 MiB block fetched into a 4 MiB arena: %+v", res[0])
	}
	// The pull moved nothing: its only round-trip sample is the pin's,
	// recorded with the fetch's bookkeeping, after the answer.
	rttSamples := func() int64 { return c.Nodes[1].Node.Links().Estimate("node-0", time.Now()).RTTSamples }
	c.Eventually("the pin's round trip to be recorded", 10*time.Second, func() bool { return rttSamples() >= 1 })
	if n := rttSamples(); n != 1 {
		t.Fatalf("%d round-trip samples after a fetch that only pinned, want the pin's 1", n)
	}
	res, err = eng.Fetch(context.Background(), "acme", "llama3-8b", keys[1:], 0)
	if err != nil || res[0].Err != nil || res[0].Source != "node-0" {
		t.Fatalf("the 1 MiB block after it: %v %+v", err, res)
	}
	got, err := eng.GetValue(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: keys[1]})
	if err != nil || !bytes.Equal(got, small) {
		t.Fatalf("the 1 MiB block after the fetch: %v", err)
	}
	by := counters(t, regs[1], "kvpool_transfer_fetched_blocks_total", func(l map[string]string) string { return l["addressed"] })
	if by["pin"] != 1 || by["name"] != 0 {
		t.Fatalf("blocks fetched by how they were addressed: %v, want the 1 MiB block pinned", by)
	}
}

// A caller tells the node, with each Fetch, what its previous one cost
// beyond the node's own fetch (its request's way in, the answer's way
// out, its wake-up), through either door; the node shows the median of
// what its callers report once three have, and its links' fits count it.
func TestFetchCallersReportWhatTheirCallsCost(t *testing.T) {
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	c := cluster.New(t, cluster.Config{Nodes: 2, Mutate: func(i int, pc *pool.Config) {
		pc.Registerer, pc.Gatherer = regs[i], regs[i]
	}})
	held := [][][]byte{chainKeys(t, 53, 8), chainKeys(t, 59, 8)} // by the node holding them
	putBlocks(t, c.Client(0, api.PathData), held[0], 64<<10)
	putBlocks(t, c.Client(1, api.PathData), held[1], 64<<10)
	c.Converged(10 * time.Second)
	ctx := context.Background()
	// Node 0 fetches over gRPC, node 1 over the data channel, one block
	// per call: call i brings the report of call i-1, so the median shows
	// from the fourth call on (later if the node drops a report as
	// implausible: a call slower than 10 ms on a loaded machine).
	for fetcher, path := range []api.Path{api.PathGRPC, api.PathData} {
		reg, cli := regs[fetcher], c.Client(fetcher, path)
		var median float64
		for i, k := range held[1-fetcher] {
			res, err := cli.Fetch(ctx, "acme", "llama3-8b", [][]byte{k}, 0)
			if err != nil || res[0].Err != nil || res[0].Took <= 0 {
				t.Fatalf("%v: fetch %d: %v %+v", path, i, err, res)
			}
			median = gaugeValue(t, reg, "kvpool_transfer_fetch_call_overhead_seconds")
			if i < 3 && median != 0 {
				t.Fatalf("%v: a median of %v s after %d reports", path, median, i)
			}
			if median != 0 {
				break
			}
		}
		if median <= 0 || median > 0.01 {
			t.Fatalf("%v: the callers' median overhead is %v s after %d calls", path, median, len(held[1-fetcher]))
		}
	}
}

// gaugeValue returns the value of the unlabelled gauge name in reg.
func gaugeValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}
