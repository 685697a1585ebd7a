package sim

import (
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"testing"

	"github.com/kvpool/kvpool/transfer/cost"
)

// testConfig is a small cluster with round numbers: 100-token blocks of
// 1000 B per token (100 kB per block) prefilled at 1000 tokens/s (0.1 s
// per block), a 100 MB/s network (1 ms per block) and a 1 GB/s
// host-to-GPU link (0.1 ms per block).
func testConfig(t testing.TB, nodes int, pol Policy) Config {
	c, err := cost.NewCurve("test", "cpu", []cost.Point{{Tokens: 1000, TokensPerSecond: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Nodes: nodes, Policy: pol, KVBytesPerToken: 1000, Prefill: &c, BlockTokens: 100,
		Decode:   Roofline{HBMBytesPerSecond: 1e12, WeightsBytes: 1e9},
		MaxBatch: 8, GPUBlocks: 200, HostBlocks: 400, HostToGPUBytesPerSecond: 1e9, NetworkBytesPerSecond: 1e8,
	}
}

// req is a request of len(blocks) full 100-token blocks arriving at at.
func req(id int, at float64, out int, blocks ...uint64) Request {
	return Request{ID: id, ArrivalS: at, InputTokens: 100 * len(blocks), OutputTokens: out, Blocks: blocks}
}

func run(t testing.TB, cfg Config, reqs []Request) Result {
	t.Helper()
	r, err := Run(cfg, reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkConservation(t, reqs, r)
	return r
}

// checkConservation: every request finished once, and its prompt's
// tokens were computed, reused, loaded or fetched, with no token counted
// twice or lost.
func checkConservation(t testing.TB, reqs []Request, r Result) {
	t.Helper()
	if len(r.Outcomes) != len(reqs) || r.Requests != len(reqs) {
		t.Fatalf("%d outcomes for %d requests", len(r.Outcomes), len(reqs))
	}
	for i, o := range r.Outcomes {
		q := &reqs[i]
		if o.ID != q.ID {
			t.Fatalf("outcome %d is request %d's", i, o.ID)
		}
		if sum := o.Computed + o.Reused + o.FromHost + o.Fetched; sum != q.InputTokens || o.Computed < 0 || o.Reused < 0 || o.FromHost < 0 || o.Fetched < 0 {
			t.Fatalf("%s: request %d of %d tokens: computed %d + reused %d + host %d + fetched %d = %d", r.Policy, q.ID, q.InputTokens, o.Computed, o.Reused, o.FromHost, o.Fetched, sum)
		}
		if o.TTFTS <= 0 || o.QueueS < 0 || o.QueueS > o.TTFTS || o.DoneS < q.ArrivalS+o.TTFTS-1e-9 {
			t.Fatalf("%s: request %d: ttft %v, queue %v, done at %v after arriving at %v", r.Policy, q.ID, o.TTFTS, o.QueueS, o.DoneS, q.ArrivalS)
		}
		if o.FetchFailed && (o.Fetched != 0 || o.FromHost != 0) {
			t.Fatalf("%s: request %d's fetch failed, yet it fetched %d and loaded %d tokens", r.Policy, q.ID, o.Fetched, o.FromHost)
		}
	}
	sum := r.ComputedTokens + r.ReusedTokens + r.HostTokens + r.FetchedTokens
	if sum != r.InputTokens {
		t.Fatalf("%s: token totals %d ≠ %d input tokens", r.Policy, sum, r.InputTokens)
	}
}

func approx(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }

// Requests far apart that all share a 4-block prefix: after the first,
// each reuses it and prefills only its own fifth block.
func TestEveryRequestSharesOnePrefix(t *testing.T) {
	var reqs []Request
	for i := range 6 {
		reqs = append(reqs, req(i, float64(10*i), 1, 0, 1, 2, 3, uint64(100+i)))
	}
	for _, pol := range Policies() {
		t.Run(pol.String(), func(t *testing.T) {
			r := run(t, testConfig(t, 2, pol), reqs)
			warm := map[int]bool{}
			for i, o := range r.Outcomes {
				want, reused := 0.1, 400
				switch {
				case i == 0:
					want, reused = 0.5, 0
				case (pol == RoundRobin || pol == LeastLoaded) && !warm[o.Node]:
					// Blind to the caches, it sent this one to a node whose
					// tiers are empty.
					want, reused = 0.5, 0
				}
				warm[o.Node] = true
				if !approx(o.TTFTS, want) || o.Reused != reused || o.Computed != 500-reused {
					t.Errorf("request %d on node %d: ttft %.6f s, reused %d, computed %d; want %.1f s, %d reused", i, o.Node, o.TTFTS, o.Reused, o.Computed, want, reused)
				}
			}
		})
	}
}

// Nothing shared: every request computes its whole prompt, whatever the
// policy, and alone on its node takes exactly its prefill.
func TestNothingShared(t *testing.T) {
	var reqs []Request
	for i := range 8 {
		n := 1 + i%4
		blocks := make([]uint64, n)
		for k := range blocks {
			blocks[k] = uint64(10*i + k)
		}
		reqs = append(reqs, req(i, float64(10*i), 3, blocks...))
	}
	for _, pol := range Policies() {
		t.Run(pol.String(), func(t *testing.T) {
			r := run(t, testConfig(t, 3, pol), reqs)
			for i, o := range r.Outcomes {
				if want := 0.1 * float64(1+i%4); !approx(o.TTFTS, want) || o.Computed != reqs[i].InputTokens {
					t.Errorf("request %d: ttft %.6f s, computed %d; want %.1f s, all %d", i, o.TTFTS, o.Computed, want, reqs[i].InputTokens)
				}
			}
			if r.NetworkBytes != 0 || r.FetchedTokens != 0 {
				t.Errorf("moved %v bytes with nothing to share", r.NetworkBytes)
			}
		})
	}
}

// One hot prefix under overload: a request warms an 8-block prefix on
// one node, then 40 arrive at once that extend it by one block. Affinity
// piles them all onto the warm node; the cost router spreads them once
// the queue outgrows recomputing; the pool spreads them and lets the
// other nodes fetch the prefix instead of recomputing it.
func TestOneHotPrefixUnderOverload(t *testing.T) {
	prefix := []uint64{0, 1, 2, 3, 4, 5, 6, 7}
	reqs := []Request{req(0, 0, 1, prefix...)}
	for i := 1; i <= 40; i++ {
		reqs = append(reqs, req(i, 10, 1, append(prefix[:8:8], uint64(100+i))...))
	}
	p90 := map[Policy]float64{}
	for _, pol := range []Policy{Affinity, Cost, Pool, PoolSplit, Oracle} {
		r := run(t, testConfig(t, 4, pol), reqs)
		p90[pol] = r.TTFT.P90
		nodes := map[int]int{}
		for _, o := range r.Outcomes[1:] {
			nodes[o.Node]++
		}
		t.Logf("%-10s ttft p50 %.3f p90 %.3f, burst per node %v, fetched %d tokens", pol, r.TTFT.P50, r.TTFT.P90, nodes, r.FetchedTokens)
		switch pol {
		case Affinity:
			if len(nodes) != 1 || nodes[r.Outcomes[0].Node] != 40 {
				t.Errorf("affinity spread the burst: %v", nodes)
			}
			// One block each, one after another: the last waits for 39.
			if last := r.Outcomes[40]; !approx(last.TTFTS, 4.0) {
				t.Errorf("affinity: the last request's ttft %.6f, want 4.0", last.TTFTS)
			}
		case Pool, PoolSplit:
			if r.FetchedTokens == 0 || len(nodes) != 4 {
				t.Errorf("%v: fetched %d tokens over nodes %v", pol, r.FetchedTokens, nodes)
			}
		}
	}
	if !(p90[Oracle] <= p90[PoolSplit] && p90[PoolSplit] <= p90[Pool]+1e-9 && p90[Pool] < p90[Cost] && p90[Cost] < p90[Affinity]) {
		t.Errorf("p90 order: want oracle ≤ pool-split ≤ pool < cost < affinity, got %v", p90)
	}
}

// A planned fetch fails when the source evicts the prefix before the
// engine starts; the engine then recomputes, and the run still conserves
// every token.
func TestFetchFailsWhenTheSourceEvicts(t *testing.T) {
	cfg := testConfig(t, 2, Pool)
	cfg.HostBlocks = 4
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	reqs := []Request{req(0, 0, 1, 0, 1, 2, 3, 4)}
	c, err := newCluster(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	c.q = Queue{} // drive it by hand
	j := &c.jobs[0]
	// Node 0 holds the first four blocks in its host tier but is busy for
	// a minute: the router plans to fetch them onto node 1.
	c.engines[0].host.Insert(j.chain[:4], 0, 0)
	c.engines[0].queuedS = 60
	c.route(j)
	if j.node != 1 || j.source != 0 || j.pool != 4 {
		t.Fatalf("planned node %d from source %d with %d blocks, want node 1 fetching 4 from node 0", j.node, j.source, j.pool)
	}
	// Before node 1 starts, node 0's host tier evicts them.
	c.engines[0].host.Insert([]uint64{900, 901, 902, 903}, 0, 0)
	c.engines[0].queuedS = 0
	e := &c.engines[1]
	e.waiting = append(e.waiting, j)
	e.queuedS += j.estS
	c.kick(1)
	c.loop(nil)
	c.summarize()
	o := c.res.Outcomes[0]
	if !o.FetchFailed || o.Fetched != 0 || o.Computed != 500 || !approx(o.TTFTS, 0.5) || c.res.FetchesFailed != 1 {
		t.Fatalf("outcome %+v, %d failed fetches; want a failed fetch and 500 tokens recomputed in 0.5 s", o, c.res.FetchesFailed)
	}
	checkConservation(t, reqs, c.res)
}

// randomTrace is a trace of n multi-turn conversations' requests: each
// conversation's turns extend its previous prompt, and a few system
// prompts are shared by all.
func randomTrace(seed uint64, n int) []Request {
	rng := rand.New(rand.NewPCG(seed, 1))
	var reqs []Request
	next := uint64(1000)
	convs := make([][]uint64, 40)
	at := 0.0
	for i := range n {
		c := rng.IntN(len(convs))
		if len(convs[c]) == 0 || len(convs[c]) > 30 {
			convs[c] = []uint64{uint64(rng.IntN(3))} // a system prompt
		}
		for range 1 + rng.IntN(6) {
			convs[c] = append(convs[c], next)
			next++
		}
		blocks := append([]uint64(nil), convs[c]...)
		partial := rng.IntN(100)
		if partial > 0 {
			blocks = append(blocks, next)
			next++
		}
		at += rng.ExpFloat64() * 0.6
		reqs = append(reqs, Request{ID: i, ArrivalS: at, InputTokens: 100*len(convs[c]) + partial, OutputTokens: rng.IntN(40), Blocks: blocks})
	}
	return reqs
}

// Every policy conserves tokens and finishes every request on a loaded
// synthetic trace, and a seed gives the same run every time.
func TestConservationAndDeterminism(t *testing.T) {
	reqs := randomTrace(7, 600)
	for _, pol := range Policies() {
		t.Run(pol.String(), func(t *testing.T) {
			cfg := testConfig(t, 4, pol)
			cfg.GPUBlocks, cfg.HostBlocks = 120, 160 // evictions happen
			a := run(t, cfg, reqs)
			b := run(t, cfg, reqs)
			if !reflect.DeepEqual(a, b) {
				t.Fatal("the same seed gave two different runs")
			}
			if pol != Oracle && (a.GPUStored < a.GPUEvicted || a.GPUEvicted == 0 || a.GPUStored-a.GPUEvicted > 4*cfg.GPUBlocks) {
				t.Errorf("GPU caches stored %d blocks and evicted %d, with room for %d each", a.GPUStored, a.GPUEvicted, cfg.GPUBlocks)
			}
			t.Logf("ttft p50 %.3f p90 %.3f p99 %.3f; gpu %.2f host %.2f pool %.2f; fetches %d, %d failed", a.TTFT.P50, a.TTFT.P90, a.TTFT.P99, a.GPUHitRatio, a.HostHitRatio, a.PoolHitRatio, a.Fetches, a.FetchesFailed)
		})
	}
}

// The oracle bounds reuse: no policy reuses more of the prompts.
func TestOracleBoundsReuse(t *testing.T) {
	reqs := randomTrace(3, 400)
	oracle := run(t, testConfig(t, 4, Oracle), reqs)
	for _, pol := range Policies() {
		r := run(t, testConfig(t, 4, pol), reqs)
		if r.ComputedTokens < oracle.ComputedTokens {
			t.Errorf("%v computed %d tokens, fewer than the oracle's %d", pol, r.ComputedTokens, oracle.ComputedTokens)
		}
	}
}

func TestConfigReportsEveryProblem(t *testing.T) {
	cfg := Config{Nodes: 0, Policy: Pool, MaxBatch: -1, HostBlocks: 0}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("accepted an empty config")
	}
	for _, want := range []string{"nodes 0", "kv bytes", "no prefill curve", "decode roofline", "max batch", "GPU blocks", "network bandwidth", "needs host blocks"} {
		if !contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	if _, err := ParsePolicy("fastest"); err == nil {
		t.Error("parsed an unknown policy")
	}
	for _, p := range Policies() {
		if q, err := ParsePolicy(p.String()); err != nil || q != p {
			t.Errorf("%v does not round-trip: %v %v", p, q, err)
		}
	}
	// A request larger than an engine's memory is refused up front.
	cfg = testConfig(t, 1, Cost)
	cfg.GPUBlocks = 3
	if _, err := Run(cfg, []Request{req(0, 0, 1, 1, 2, 3, 4)}, nil); err == nil {
		t.Error("ran a request that cannot fit")
	}
}

func contains(s, sub string) bool {
	return len(s) >= len(sub) && (s == sub || len(sub) == 0 || indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// The whole conversation trace runs on the model the acceptance asks
// about (8 nodes of Llama-3-8B on H200), every policy conserving tokens.
func TestTheConversationTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	f, err := os.Open("../../../shared/traces/conversation_trace.jsonl")
	if err != nil {
		t.Skipf("the shared trace is not here: %v", err)
	}
	defer f.Close()
	reqs, err := ParseTrace(f, TraceConfig{TimeScale: 4})
	if err != nil {
		t.Fatal(err)
	}
	p := cost.NewProfiles()
	if err := p.Add(Profiles()); err != nil {
		t.Fatal(err)
	}
	m, _ := p.Model("llama3-8b")
	curve, _ := p.Curve("llama3-8b", "h200")
	hw, _ := DefaultHardware("llama3-8b", "h200")
	for _, pol := range []Policy{Cost, PoolSplit, Oracle} {
		cfg := Config{Nodes: 8, Policy: pol, HostBlocks: 2980, NetworkBytesPerSecond: 100e9 / 8, RTTS: 20e-6, FetchFixedS: 0.53e-3}
		if err := hw.Apply(&cfg, curve, m.KVBytesPerToken()); err != nil {
			t.Fatal(err)
		}
		r := run(t, cfg, reqs)
		t.Log(fmt.Sprintf("%-10s ttft p50 %.3f p90 %.3f p99 %.3f s", pol, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99))
	}
}

// Without GPU prefix caches (how replay's engines run) every reuse comes
// from the node's host tier, loaded at its host-to-GPU rate.
func TestNoGPUCacheReusesFromTheHostTier(t *testing.T) {
	var reqs []Request
	for i := range 4 {
		reqs = append(reqs, req(i, float64(10*i), 1, 0, 1, 2, 3, uint64(100+i)))
	}
	cfg := testConfig(t, 1, Cost)
	cfg.NoGPUCache = true
	r := run(t, cfg, reqs)
	for i, o := range r.Outcomes[1:] {
		// 0.1 s for the fifth block, 400 kB at 1 GB/s for the other four.
		if o.Reused != 0 || o.FromHost != 400 || !approx(o.TTFTS, 0.1+400e3/1e9) {
			t.Errorf("request %d: %+v; want 400 tokens from the host tier in 0.1004 s", i+1, o)
		}
	}
	if r.HostToGPUBytes != 3*400e3 {
		t.Errorf("%v bytes loaded from the host tier, want 1.2e6", r.HostToGPUBytes)
	}
}

// With no host tier, reuse lives in the engines' GPU caches alone: a
// router that sees them sends every repeat of a prefix to the engine that
// holds it; one that sees only the host tiers (kvpool without KV events)
// finds every node equally cold, and its seed scatters the repeats.
func TestRouterThatSeesOnlyTheHostTier(t *testing.T) {
	var reqs []Request
	for i := range 6 {
		reqs = append(reqs, req(i, float64(10*i), 1, 0, 1, 2, 3, uint64(100+i)))
	}
	reused := map[bool]int{}
	for seed := range uint64(10) {
		for _, hostOnly := range []bool{false, true} {
			cfg := testConfig(t, 4, Cost)
			cfg.HostBlocks, cfg.Seed, cfg.RouterSeesHostOnly = 0, seed, hostOnly
			r := run(t, cfg, reqs)
			reused[hostOnly] += r.ReusedTokens
			if !hostOnly && r.ReusedTokens != 5*400 {
				t.Errorf("seed %d: a router that sees the GPU caches reused %d tokens; want every repeat's 400", seed, r.ReusedTokens)
			}
		}
	}
	if reused[true] >= reused[false] {
		t.Errorf("over 10 seeds a host-only router reused %d tokens, one that sees the GPU caches %d; want fewer", reused[true], reused[false])
	}
	t.Logf("reused over 10 seeds: %d tokens seeing the GPU caches, %d seeing the host tier only", reused[false], reused[true])
}
