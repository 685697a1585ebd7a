package test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/test/cluster"
)

// chain returns n keys of a prompt chain.
func chainKeys(t *testing.T, seed uint32, n int) [][]byte {
	tokens := make([]uint32, 16*n)
	for i := range tokens {
		tokens[i] = seed*100000 + uint32(i)
	}
	keys, err := api.ChainKeys(api.ChainConfig{Scheme: api.ChainSHA256CBOR, BlockTokens: 16, Seed: "0"}, tokens)
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
		admin := kvpoolv1.NewAdminServiceClient(c.Client(i, api.PathData).Conn())
		r, err := admin.ClusterLocate(context.Background(), &kvpoolv1.ClusterLocateRequest{Tenant: "acme", Namespace: "llama3-8b", Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]uint32{}
		for _, np := range r.GetNodes() {
			got[np.GetNodeId()] = np.GetPrefixBlocks()
		}
		want := map[string]uint32{"node-0": 12, "node-1": 6, "node-2": 0}
		if fmt.Sprint(got) != fmt.Sprint(want) || r.GetDeepestBlocks() != 12 || !slices.Equal(r.GetDeepestNodes(), []string{"node-0"}) || r.GetPoolPrefixBlocks() != 12 {
			t.Fatalf("answered by node-%d: %v", i, r)
		}
	}
}

// An engine reports its load to its daemon; gossip carries it to every
// daemon, where admin nodes shows it.
func TestReportLoadReachesEveryDaemon(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3})
	eng := c.Client(1, api.PathData)
	if _, err := eng.RPC().ReportLoad(context.Background(), &kvpoolv1.ReportLoadRequest{QueueSeconds: 0.25, PrefillTokensPerSecond: 35739}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.RPC().ReportLoad(context.Background(), &kvpoolv1.ReportLoadRequest{QueueSeconds: -1}); api.Code(err).String() != "InvalidArgument" {
		t.Fatalf("negative queue time: %v", err)
	}
	admin := kvpoolv1.NewAdminServiceClient(c.Client(2, api.PathData).Conn())
	c.Eventually("node-2 to see node-1's engine load", 10*time.Second, func() bool {
		r, err := admin.ListNodes(context.Background(), &kvpoolv1.ListNodesRequest{})
		if err != nil {
			return false
		}
		for _, n := range r.GetNodes() {
			if n.GetNodeId() == "node-1" && n.GetQueueSeconds() == 0.25 && n.GetPrefillTokensPerSecond() == 35739 && n.GetGossipState() == "alive" {
				return true
			}
		}
		return false
	})
}
