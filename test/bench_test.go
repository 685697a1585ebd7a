package test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/test/cluster"
)

// BenchmarkClusterLocateRPC measures the AdminService ClusterLocate RPC on
// loopback for a 128-key chain, against a daemon whose mirror holds 1M
// location records (published into etcd by a bulk member), and reports
// its latency p50 and p99 over 20k calls.
//
//	go test -run x -bench ClusterLocateRPC -benchtime 1x ./test
func BenchmarkClusterLocateRPC(b *testing.B) {
	const records = 1_000_000
	c := cluster.New(b, cluster.Config{Nodes: 1})
	bulk, err := metadata.NewMember(metadata.MemberConfig{
		Client: c.EtcdClient(), Record: metadata.NodeRecord{ID: "bulk"},
		Snapshot: func(func(string, string, []byte) bool) {},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); bulk.Run(ctx) }()
	defer func() { cancel(); <-done }()
	keys := make([][]byte, records)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%032x", i)
	}
	c.Eventually("the bulk member to register", 10*time.Second, func() bool { return bulk.Epoch() != 0 })
	for _, k := range keys {
		bulk.Added([]byte("acme"), []byte("llama3-8b"), k)
	}
	c.Eventually("node-0's mirror to hold 1M records", 60*time.Second, func() bool {
		return c.Nodes[0].Node.Mirror().Stats().Blocks == records
	})
	admin := kvpoolv1.NewAdminServiceClient(c.Client(0, api.PathData).Conn())
	req := &kvpoolv1.ClusterLocateRequest{Tenant: "acme", Namespace: "llama3-8b", Keys: keys[500_000 : 500_000+128]}
	for b.Loop() {
		lat := make([]time.Duration, 20000)
		for i := range lat {
			t0 := time.Now()
			r, err := admin.ClusterLocate(ctx, req)
			lat[i] = time.Since(t0)
			if err != nil || r.GetDeepestBlocks() != 128 {
				b.Fatalf("locate: %v %v", r, err)
			}
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}

// BenchmarkDaemonPlan measures Plan on a live 8-node cluster for a
// 128-key chain that node i holds the first 16·i blocks of: in process
// (Node.Plan: mirror locate, gossiped load, link matrix, the planner),
// then the Plan RPC on loopback, p50 and p99 over 5k calls.
//
//	go test -run x -bench DaemonPlan -benchtime 1x ./test
func BenchmarkDaemonPlan(b *testing.B) {
	c := cluster.New(b, cluster.Config{Nodes: 8, CapacityBytes: 16 << 20})
	keys := make([][]byte, 128)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "plan-bench-%03d", i)
	}
	for i := range 8 {
		cl := c.Client(i, api.PathData)
		for _, k := range keys[:16*i] {
			if err := cl.Put(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k}, []byte("kv")); err != nil {
				b.Fatal(err)
			}
		}
	}
	c.Converged(30 * time.Second)
	q := pool.PlanQuery{Tenant: "acme", Namespace: "llama3-8b", Keys: keys, BlockTokens: 256}
	n := c.Nodes[0].Node
	ans, err := n.Plan(q)
	if err != nil || len(ans.Result.Nodes) != 8 {
		b.Fatalf("plan: %d nodes, %v", len(ans.Result.Nodes), err)
	}
	rpc := c.Client(0, api.PathData)
	req := api.PlanRequest{Tenant: "acme", Namespace: "llama3-8b", Keys: keys, BlockTokens: 256}
	for b.Loop() {
		const calls = 5000
		t0 := time.Now()
		for range calls {
			if _, err := n.Plan(q); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(time.Since(t0).Microseconds())/calls, "in-process-µs/plan")
		lat := make([]time.Duration, calls)
		for i := range lat {
			t0 := time.Now()
			_, err := rpc.Plan(context.Background(), req)
			lat[i] = time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "rpc-p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "rpc-p99-µs")
	}
}
