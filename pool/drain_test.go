package pool

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/eventually"
)

// TestDrainHandsOffWhatOnlyItHolds drains one node of three: every block
// only it held ends up on a peer, leased ones and one put a moment before
// among them, blocks a peer already held are not copied again, and the
// node stops and leaves the map.
func TestDrainHandsOffWhatOnlyItHolds(t *testing.T) {
	cli := etcdClient(t)
	var nodes []*Node
	for _, id := range []string{"drain-a", "drain-b", "drain-c"} {
		nodes = append(nodes, startNode(t, func(c *Config) {
			c.NodeID, c.Etcd, c.LeaseTTL = id, cli, 2*time.Second
			c.DrainChainBlocks = 4 // several requests per peer
		}))
	}
	a, b, c := nodes[0], nodes[1], nodes[2]
	ctx := context.Background()
	ca, cb := dial(t, a, api.PathData), dial(t, b, api.PathData)
	type block struct{ tenant, ns, key string }
	var blocks []block
	for i := range 10 {
		blocks = append(blocks, block{"t", "n", fmt.Sprintf("k%d", i)})
	}
	for i := range 6 {
		blocks = append(blocks, block{"u", "m", fmt.Sprintf("j%d", i)})
	}
	const size = 64 << 10
	for i, bl := range blocks {
		if err := ca.Put(ctx, api.BlockKey{Tenant: bl.tenant, Namespace: bl.ns, Key: []byte(bl.key)}, value(uint64(i), size)); err != nil {
			t.Fatal(err)
		}
	}
	holders := func(n *Node, bl block) []string {
		var ids []string
		for _, h := range n.cluster.Holders(bl.tenant, bl.ns, []byte(bl.key)) {
			ids = append(ids, h.ID)
		}
		return ids
	}
	eventually.True(t, "every mirror to know what a holds, and a to know both peers", 20*time.Second, func() bool {
		if len(a.drainPeers()) != 2 {
			return false
		}
		for _, n := range nodes {
			for _, bl := range blocks {
				if len(holders(n, bl)) == 0 {
					return false
				}
			}
		}
		return true
	})
	// b holds k0 and k1 too; a leases k5.
	replicated := [][]byte{[]byte("k0"), []byte("k1")}
	if res, err := cb.Fetch(ctx, "t", "n", replicated, 0); err != nil || res[0].Err != nil || res[1].Err != nil {
		t.Fatalf("b fetching k0, k1: %v %v", err, res)
	}
	eventually.True(t, "a's mirror to see b hold k0 and k1", 20*time.Second, func() bool {
		return len(holders(a, blocks[0])) == 2 && len(holders(a, blocks[1])) == 2
	})
	if _, _, err := ca.LocateLease(ctx, "t", "n", [][]byte{[]byte("k5")}, time.Minute); err != nil {
		t.Fatal(err)
	}

	// A block put just before the drain, which the peers' maps have not
	// heard of yet, is handed off too.
	late := block{"t", "n", "late"}
	if err := ca.Put(ctx, api.BlockKey{Tenant: late.tenant, Namespace: late.ns, Key: []byte(late.key)}, value(99, size)); err != nil {
		t.Fatal(err)
	}
	blocks = append(blocks, late)

	rep, err := a.Drain(ctx, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Blocks != 17 || rep.Bytes != 17*size || rep.Replicated != 2 || rep.HandedOff != 15 || rep.HandedOffBytes != 15*size ||
		rep.Kept != 0 || rep.LeasedKept != 0 || rep.PeerBlocks["drain-b"]+rep.PeerBlocks["drain-c"] != 15 || len(rep.Errors) != 0 {
		t.Fatalf("report %+v", rep)
	}
	for _, bl := range blocks {
		key := [][]byte{[]byte(bl.key)}
		inB, err := b.Store().Exists([]byte(bl.tenant), []byte(bl.ns), key)
		if err != nil {
			t.Fatal(err)
		}
		inC, err := c.Store().Exists([]byte(bl.tenant), []byte(bl.ns), key)
		if err != nil {
			t.Fatal(err)
		}
		if !inB[0] && !inC[0] {
			t.Errorf("%v is on neither peer", bl)
		}
	}
	// A second caller gets the same report; the node stops on its own and
	// leaves the map.
	if again, err := a.Drain(ctx, time.Second); err != nil || again.HandedOff != rep.HandedOff {
		t.Fatalf("second Drain: %+v, %v", again, err)
	}
	eventually.True(t, "a to stop", 20*time.Second, func() bool { return a.serving.Err() != nil })
	eventually.True(t, "b's mirror to list only b and c as holders", 20*time.Second, func() bool {
		for _, bl := range blocks {
			hs := holders(b, bl)
			if len(hs) == 0 || strings.Contains(strings.Join(hs, ","), "drain-a") {
				return false
			}
		}
		return true
	})
}

// TestDrainRefusesPutsAndWaitsForLeases drains a node with no peer: puts
// and leases are refused with Unavailable at once, reads go on, readiness
// fails, and the drain waits for the read lease on a block only it holds
// (or gives up on it when the budget is shorter).
func TestDrainRefusesPutsAndWaitsForLeases(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lease      time.Duration
		budget     time.Duration
		leasedKept int
	}{
		{"lease ends within the budget", 500 * time.Millisecond, 20 * time.Second, 0},
		{"lease outlasts the budget", time.Minute, 500 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdClient(t)
			n := startNode(t, func(c *Config) {
				c.NodeID, c.Etcd, c.LeaseTTL = "lone", cli, 2*time.Second
				c.MetricsAddr = "127.0.0.1:0"
			})
			ctx := context.Background()
			cl := dial(t, n, api.PathData)
			k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("k")}
			if err := cl.Put(ctx, k, value(1, 4096)); err != nil {
				t.Fatal(err)
			}
			if _, _, err := cl.LocateLease(ctx, "t", "n", [][]byte{k.Key}, tc.lease); err != nil {
				t.Fatal(err)
			}
			type result struct {
				rep DrainReport
				err error
			}
			done := make(chan result, 1)
			go func() { rep, err := n.Drain(ctx, tc.budget); done <- result{rep, err} }()
			eventually.True(t, "the drain to begin", 10*time.Second, n.Draining)
			if len(done) == 0 { // still draining: the doors are open
				err := cl.Put(ctx, api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("new")}, value(2, 4096))
				if !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "draining") {
					t.Errorf("put while draining: %v, want Unavailable saying the node drains", err)
				}
				if _, _, err := cl.LocateLease(ctx, "t", "n", [][]byte{k.Key}, time.Second); !errors.Is(err, api.ErrUnavailable) {
					t.Errorf("lease while draining: %v, want Unavailable", err)
				}
				if v, err := cl.Get(ctx, k, make([]byte, 4096)); err != nil || v != 4096 {
					t.Errorf("get while draining: %d bytes, %v", v, err)
				}
				if resp, err := http.Get("http://" + n.MetricsAddr().String() + "/readyz"); err == nil {
					resp.Body.Close()
					if resp.StatusCode != http.StatusServiceUnavailable {
						t.Errorf("/readyz while draining: %s", resp.Status)
					}
				}
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.rep.Blocks != 1 || r.rep.Kept != 1 || r.rep.HandedOff != 0 || r.rep.LeasedKept != tc.leasedKept ||
				len(r.rep.Errors) != 1 || !strings.Contains(r.rep.Errors[0], "no live peer") {
				t.Fatalf("report %+v", r.rep)
			}
			eventually.True(t, "the node to stop", 20*time.Second, func() bool { return n.serving.Err() != nil })
		})
	}
}

// TestDrainOnStop: with DrainOnStop, the end of Run's context hands the
// node's blocks to its peer before Run returns.
func TestDrainOnStop(t *testing.T) {
	cli := etcdClient(t)
	b := startNode(t, func(c *Config) { c.NodeID, c.Etcd, c.LeaseTTL = "stop-b", cli, 2*time.Second })
	cfg := TestConfig("stop-a", 64<<20)
	cfg.ShmSocket = filepath.Join(t.TempDir(), "shm.sock")
	cfg.Etcd, cfg.LeaseTTL, cfg.DrainOnStop = cli, 2*time.Second, true
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	<-a.Ready()
	ca := dial(t, a, api.PathData)
	keys := [][]byte{[]byte("x0"), []byte("x1"), []byte("x2")}
	for i, k := range keys {
		if err := ca.Put(context.Background(), api.BlockKey{Tenant: "t", Namespace: "n", Key: k}, value(uint64(i), 8192)); err != nil {
			t.Fatal(err)
		}
	}
	eventually.True(t, "b's mirror to know a's blocks, and a's to know b", 20*time.Second, func() bool {
		return b.Mirror().Locate("t", "n", keys).PoolPrefix == len(keys) && len(a.drainPeers()) == 1
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	have, err := b.Store().Exists([]byte("t"), []byte("n"), keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range have {
		if !ok {
			t.Errorf("%s was not handed to b", keys[i])
		}
	}
}
