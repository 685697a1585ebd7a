package test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/pool/replay"
	"github.com/kvpool/kvpool/test/cluster"
	"github.com/kvpool/kvpool/transfer/cost"
	"github.com/kvpool/kvpool/transfer/sim"
)

// chatTrace is a synthetic multi-turn chat workload in the Mooncake
// format's terms (512-token blocks, hash ids that chain): conversations
// whose every turn extends the previous prompt, under a few shared system
// prompts, arriving at about rate requests per second.
func chatTrace(seed uint64, n int, rate float64) []sim.Request {
	rng := rand.New(rand.NewPCG(seed, 2))
	next := uint64(100)
	convs := make([][]uint64, 24)
	var reqs []sim.Request
	at := 0.0
	for i := range n {
		c := rng.IntN(len(convs))
		if len(convs[c]) == 0 || len(convs[c]) > 40 {
			sys := uint64(rng.IntN(3)) * 10
			convs[c] = []uint64{sys, sys + 1, sys + 2, sys + 3}
		}
		for range 2 + rng.IntN(7) {
			convs[c] = append(convs[c], next)
			next++
		}
		blocks := append([]uint64(nil), convs[c]...)
		partial := 1 + rng.IntN(511)
		blocks = append(blocks, next)
		next++
		at += rng.ExpFloat64() / rate
		reqs = append(reqs, sim.Request{ID: i, ArrivalS: at, InputTokens: 512*len(convs[c]) + partial,
			OutputTokens: 1 + rng.IntN(200), Blocks: blocks})
	}
	return reqs
}

// kvpool replay drives three live daemons with a chat trace (every Plan,
// Locate, Fetch and Put real, engines emulated at Llama-3-8B's H200
// speeds); the simulator, configured like that cluster, gives about the
// same TTFT. The closing figure (a 600-request slice of the conversation
// trace, within 15 %) comes from `kvpool replay`; here the bound is loose
// because CI machines are loaded and the replay runs in real time.
func TestReplayAgreesWithTheSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("runs in real time")
	}
	const blockBytes, hostBlocks = 4096, 800
	c := cluster.New(t, cluster.Config{Nodes: 3, CapacityBytes: hostBlocks * blockBytes})
	var clients []*api.Client
	for i := range 3 {
		clients = append(clients, c.Client(i, api.PathData))
	}
	c.Converged(10 * time.Second)
	reqs := chatTrace(11, 120, 7)

	profiles := cost.NewProfiles()
	model, _ := profiles.Model("llama3-8b")
	curve, err := profiles.Curve("llama3-8b", "h200")
	if err != nil {
		t.Fatal(err)
	}
	hw, err := sim.DefaultHardware("llama3-8b", "h200")
	if err != nil {
		t.Fatal(err)
	}
	cfg := sim.Config{Nodes: 3, Policy: sim.PoolSplit, HostBlocks: hostBlocks, NetworkBytesPerSecond: 100e9 / 8, FetchFixedS: 1e-3}
	if err := hw.Apply(&cfg, curve, model.KVBytesPerToken()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := replay.Run(ctx, replay.Config{
		Clients: clients, Trace: reqs, Engine: cfg, Model: "llama3-8b",
		LinkBytesPerSecond: cfg.NetworkBytesPerSecond, FetchFixed: time.Millisecond,
		BlockBytes: blockBytes, Tenant: "replay", Namespace: "chat",
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range res.Outcomes {
		q := &reqs[i]
		if o.ID != i || o.TTFTS <= 0 || o.Computed+o.Reused+o.FromHost+o.Fetched != q.InputTokens {
			t.Fatalf("request %d of %d tokens: %+v", i, q.InputTokens, o)
		}
	}
	if res.PlanCalls != 3*len(reqs) || res.PutCalls == 0 || res.HostTokens == 0 {
		t.Fatalf("%d plan calls for %d requests, %d puts, %d tokens found on their node", res.PlanCalls, len(reqs), res.PutCalls, res.HostTokens)
	}

	scfg := cfg
	scfg.NoGPUCache, scfg.HostBlocks, scfg.HostToGPUBytesPerSecond = true, hostBlocks*9/10, 1e15
	sres, err := sim.Run(scfg, reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	p50, p90 := sres.TTFT.P50/res.TTFT.P50, sres.TTFT.P90/res.TTFT.P90
	t.Logf("replay TTFT p50 %.3f p90 %.3f s (plans %v, %d fetches, %d incomplete; Plan p99 %.1f ms, Fetch p99 %.1f ms); sim p50 %.3f p90 %.3f s: sim/replay %.2f, %.2f",
		res.TTFT.P50, res.TTFT.P90, res.Plans, res.FetchCalls, res.FetchErrors, 1e3*res.Plan.P99, 1e3*res.Fetch.P99, sres.TTFT.P50, sres.TTFT.P90, p50, p90)
	for name, r := range map[string]float64{"p50": p50, "p90": p90} {
		if r < 0.6 || r > 1.4 {
			t.Errorf("TTFT %s: the simulator is %.2f× the replay's", name, r)
		}
	}
}
