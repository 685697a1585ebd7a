package test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/admin"
	"github.com/kvpool/kvpool/api/chain"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/test/cluster"
)

// chain returns n keys of a prompt chain.
func chainKeys(t *testing.T, seed uint32, n int) [][]byte {
	tokens := make([]uint32, 16*n)
	for i := range tokens {
		tokens[i] = seed*100000 + uint32(i)
	}
	keys, err := chain.Keys(chain.Config{Scheme: chain.SHA256CBOR, BlockTokens: 16, Seed: "0"}, tokens)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func putChain(t *testing.T, c *api.Client, keys [][]byte) {
	t.Helper()
	for i, k := range keys {
		if err := c.Put(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k}, []byte(fmt.Sprintf("block %d", i))); err != nil {
			t.Fatal(err)
		}
	}
}

func TestClusterLocality(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3})
	keys := chainKeys(t, 1, 12)
	putChain(t, c.Client(0, api.PathData), keys[:12])
	putChain(t, c.Client(1, api.PathData), keys[:6])
	putChain(t, c.Client(2, api.PathData), keys[6:9]) // not a prefix: holds 0 leading blocks
	c.Converged(10 * time.Second)
	for i := range c.Nodes {
		r, err := admin.New(c.Client(i, api.PathData)).Locate(context.Background(), "acme", "llama3-8b", keys)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, np := range r.Nodes {
			got[np.Node] = np.Blocks
		}
		want := map[string]int{"node-0": 12, "node-1": 6, "node-2": 0}
		if fmt.Sprint(got) != fmt.Sprint(want) || r.DeepestBlocks != 12 || !slices.Equal(r.DeepestNodes, []string{"node-0"}) || r.PoolPrefixBlocks != 12 {
			t.Fatalf("answered by node-%d: %v", i, r)
		}
	}
}

// An engine reports its load to its daemon; gossip carries it to every
// daemon, where admin nodes shows it.
func TestReportLoadReachesEveryDaemon(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3})
	eng := c.Client(1, api.PathData)
	if err := eng.ReportLoad(context.Background(), api.Load{Queue: 250 * time.Millisecond, PrefillTokensPerSecond: 35739}); err != nil {
		t.Fatal(err)
	}
	if err := eng.ReportLoad(context.Background(), api.Load{Queue: -time.Second}); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("negative queue time: %v", err)
	}
	adm := admin.New(c.Client(2, api.PathData))
	eventually.True(t, "node-2 to see node-1's engine load", 10*time.Second, func() bool {
		nodes, err := adm.Nodes(context.Background())
		if err != nil {
			return false
		}
		for _, n := range nodes.Nodes {
			if n.ID == "node-1" && n.QueueSeconds == 0.25 && n.PrefillTokensPerSecond == 35739 && n.GossipState == "alive" {
				return true
			}
		}
		return false
	})
}
