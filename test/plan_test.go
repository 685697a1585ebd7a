package test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/test/cluster"
	"github.com/kvpool/kvpool/transfer/cost"
)

// The emulated model: 1 MiB blocks of 256 tokens (4096 KV bytes/token),
// with a flat nominal prefill curve on an accelerator named "emu".
const (
	emuBlockTokens = 256
	emuBlockBytes  = 1 << 20
	emuChainBlocks = 32
	emuPrompt      = emuChainBlocks * emuBlockTokens
)

func emuProfiles(t *testing.T) *cost.Profiles {
	p := cost.NewProfiles()
	if err := p.AddModel(cost.Model{Name: "emu", KVBytes: emuBlockBytes / emuBlockTokens}); err != nil {
		t.Fatal(err)
	}
	c, err := cost.NewCurve("emu", "emu", []cost.Point{{Tokens: emuPrompt, TokensPerSecond: 100000}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AddCurve(c); err != nil {
		t.Fatal(err)
	}
	return p
}

// engine emulates a node's inference engine. There is no GPU here, so a
// prefill of T tokens takes T / tokensPerSecond on a real timer, after
// the queue; what the test measures for real is every fetch, which moves
// the chain's bytes between daemons over the tcp transport.
type engine struct {
	client          *api.Client
	queue           time.Duration
	tokensPerSecond float64
}

func (e *engine) compute(tokens int) {
	if tokens > 0 {
		<-time.After(time.Duration(float64(tokens) / e.tokensPerSecond * float64(time.Second)))
	}
}

// fetch pulls keys into the engine's node; every block must arrive.
func (e *engine) fetch(t *testing.T, keys [][]byte) {
	if len(keys) == 0 {
		return
	}
	res, err := e.client.Fetch(context.Background(), "acme", "emu", keys, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Source == "" {
			t.Fatalf("block %d: %+v", i, r)
		}
	}
}

func putEmu(t *testing.T, c *api.Client, keys [][]byte) {
	t.Helper()
	for i, k := range keys {
		if err := c.Put(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "emu", Key: k}, blockValue(i, emuBlockBytes)); err != nil {
			t.Fatal(err)
		}
	}
}

// run executes a plan kind on the engine's node and returns its wall time.
// h, p and k are the node's local prefix, the pool prefix and the split
// point, in blocks.
func (e *engine) run(t *testing.T, kind string, keys [][]byte, h, p, k int) time.Duration {
	start := time.Now()
	<-time.After(e.queue)
	switch kind {
	case "recompute":
		e.compute(emuPrompt - h*emuBlockTokens)
	case "fetch":
		e.fetch(t, keys[h:p])
		e.compute(emuPrompt - p*emuBlockTokens)
	case "split":
		var wg sync.WaitGroup
		wg.Go(func() { e.compute((k - h) * emuBlockTokens) })
		e.fetch(t, keys[k:p])
		wg.Wait()
		e.compute(emuPrompt - p*emuBlockTokens)
	default:
		t.Fatalf("unknown plan %q", kind)
	}
	took := time.Since(start)
	// Put the node back as it was: drop the replicas the run fetched.
	if kind != "recompute" && p > h {
		if _, err := e.client.RemoveMany(context.Background(), "acme", "emu", keys[h:p]); err != nil {
			t.Fatal(err)
		}
	}
	return took
}

// TestPlanMatchesExecution: on a live 3-node cluster, the daemons plan a
// request, then every candidate executes both its fetch-side plan (the
// planned fetch or split, else a fetch) and a recompute, for real. The
// node and plan the daemons chose must be what finished first. Two
// scenarios flip the decision: a slow engine (fetching wins) and a fast
// one (recomputing wins); prefill speeds are set from the link speed the
// cluster measured, so the margins hold on any machine.
func TestPlanMatchesExecution(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3, CapacityBytes: 256 << 20, Mutate: func(i int, pc *pool.Config) {
		pc.Profiles = emuProfiles(t)
		pc.Model, pc.Accelerator, pc.BlockTokens = "emu", "emu", emuBlockTokens
	}})
	engines := make([]*engine, 3)
	for i := range engines {
		engines[i] = &engine{client: c.Client(i, api.PathData)}
	}

	// Measure the links into node-1 and node-2 with real transfers, and
	// wait until every daemon has their published estimates.
	warm := chainKeys(t, 71, 16)
	putEmu(t, engines[0].client, warm)
	c.Converged(10 * time.Second)
	for _, i := range []int{1, 2} {
		for range 3 {
			engines[i].fetch(t, warm)
			if _, err := engines[i].client.RemoveMany(context.Background(), "acme", "emu", warm); err != nil {
				t.Fatal(err)
			}
		}
	}
	bw := math.Inf(1)
	for _, i := range []int{1, 2} {
		e := c.Nodes[i].Node.Links().Estimate("node-0", time.Now())
		if e.Samples == 0 {
			t.Fatalf("node-%d measured nothing from node-0", i)
		}
		bw = min(bw, e.BytesPerSecond)
	}
	fetchTime := float64(emuChainBlocks*emuBlockBytes) / bw
	t.Logf("measured links from node-0: %.2f GB/s at the slowest; the chain fetches in about %.1f ms", bw/1e9, fetchTime*1e3)

	for _, sc := range []struct {
		name string
		// recompute is the chain's prefill time, as a multiple of its
		// fetch time.
		recompute float64
		wantPlan  string
	}{
		{"slow engine fetches", 6, "fetch"},
		// The split would load the last block while computing the rest,
		// so recomputing wins only when the whole chain computes faster
		// than one block loads: 1/64 of the fetch time, against 1/32.
		{"fast engine recomputes", 1.0 / 64, "recompute"},
	} {
		t.Run(sc.name, func(t *testing.T) {
			keys := chainKeys(t, 72, emuChainBlocks)
			if sc.wantPlan == "recompute" {
				keys = chainKeys(t, 73, emuChainBlocks)
			}
			putEmu(t, engines[0].client, keys)
			c.Converged(10 * time.Second)
			// node-0 holds the chain but is busy; node-1 is idle; node-2
			// is idle after a shorter wait. Queues are in units of the
			// chain's fetch time, so every option is well apart.
			speed := float64(emuPrompt) / (sc.recompute * fetchTime)
			unit := time.Duration(fetchTime * float64(time.Second))
			queues := []time.Duration{8 * unit, 0, 2 * unit}
			for i, e := range engines {
				e.queue, e.tokensPerSecond = queues[i], speed
				if err := e.client.ReportLoad(context.Background(), api.Load{Queue: e.queue, PrefillTokensPerSecond: speed, PromptTokens: emuPrompt, Model: "emu"}); err != nil {
					t.Fatal(err)
				}
			}
			// Every daemon must see every engine's report and measured
			// links before it plans.
			req := api.PlanRequest{Tenant: "acme", Namespace: "emu", Keys: keys}
			var plans [3]api.Plan
			eventually.True(t, "every daemon plans with the reported load and measured links", 10*time.Second, func() bool {
				for i, e := range engines {
					resp, err := e.client.Plan(context.Background(), req)
					if err != nil {
						t.Fatal(err)
					}
					plans[i] = resp
					for _, np := range resp.Nodes {
						ni := int(np.Node[len("node-")] - '0')
						if math.Abs(np.Queue.Seconds()-queues[ni].Seconds()) > 1e-6 || math.Abs(np.PrefillTokensPerSecond-speed) > speed*1e-9 {
							return false
						}
						if np.Source != "" && !np.LinkMeasured {
							return false
						}
					}
				}
				return true
			})
			win := plans[0].Nodes[0]
			for i, p := range plans {
				if w := p.Nodes[0]; w.Node != win.Node || w.Plan != win.Plan {
					t.Fatalf("node-%d chose %s/%s, node-0 chose %s/%s", i, w.Node, w.Plan, win.Node, win.Plan)
				}
			}
			if win.Plan != sc.wantPlan && !(sc.wantPlan == "fetch" && win.Plan == "split") {
				t.Fatalf("winner %s plans %s; the scenario is built for %s", win.Node, win.Plan, sc.wantPlan)
			}

			// Execute both options on every candidate, one at a time.
			type outcome struct {
				node, plan      string
				predicted, took time.Duration
			}
			var best outcome
			for _, np := range plans[0].Nodes {
				ni := int(np.Node[len("node-")] - '0')
				h, p, k := np.LocalBlocks, np.PoolBlocks, np.SplitBlocks
				fetchSide := np.Plan
				if fetchSide == "recompute" {
					fetchSide = "fetch"
				}
				options := []struct {
					plan      string
					predicted time.Duration
				}{{"recompute", np.RecomputeTotal}}
				if p > h {
					pred := np.FetchTotal
					if fetchSide == "split" {
						pred = np.SplitTotal
					}
					options = append(options, struct {
						plan      string
						predicted time.Duration
					}{fetchSide, pred})
				}
				for _, o := range options {
					took := engines[ni].run(t, o.plan, keys, h, p, k)
					c.Converged(10 * time.Second)
					oc := outcome{np.Node, o.plan, o.predicted, took}
					t.Logf("%s %-9s predicted %8.2f ms, took %8.2f ms", oc.node, oc.plan, ms(oc.predicted), ms(oc.took))
					if best.node == "" || took < best.took {
						best = oc
					}
				}
			}
			if best.node != win.Node || best.plan != win.Plan {
				t.Fatalf("the plan chose %s/%s (%.2f ms); %s/%s finished first in %.2f ms",
					win.Node, win.Plan, ms(win.Total), best.node, best.plan, ms(best.took))
			}
		})
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// A standalone daemon plans for itself, and bad requests are
// InvalidArgument.
func TestPlanRPCValidation(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 1})
	cl := c.Client(0, api.PathData)
	keys := chainKeys(t, 74, 4)
	putBlocks(t, cl, keys[:2], 4096)
	est, err := cl.Estimate(context.Background(), api.PlanRequest{Tenant: "acme", Namespace: "llama3-8b", Keys: keys}, "")
	if err != nil {
		t.Fatal(err)
	}
	if n := est.Nodes[0]; n.Node != "node-0" || n.LocalBlocks != 2 || n.Plan != "recompute" {
		t.Fatalf("estimate: %+v", n)
	}
	if est.Model != "llama3-8b" || est.BlockTokens != 16 || est.PromptTokens != 64 || est.KVBytesPerToken != 131072 {
		t.Fatalf("summary: %+v", est)
	}
	for name, req := range map[string]api.PlanRequest{
		"unknown model":     {Tenant: "acme", Namespace: "n", Keys: keys, Model: "gpt-9"},
		"empty chain":       {Tenant: "acme", Namespace: "n"},
		"bad tenant":        {Tenant: "a b", Namespace: "n", Keys: keys},
		"short prompt":      {Tenant: "acme", Namespace: "n", Keys: keys, PromptTokens: 10},
		"negative link":     {Tenant: "acme", Namespace: "n", Keys: keys, LinkBytesPerSecond: -1},
		"unknown candidate": {Tenant: "acme", Namespace: "n", Keys: keys, Candidates: []string{"node-9"}},
	} {
		if _, err := cl.Plan(context.Background(), req); api.Code(err).String() != "InvalidArgument" {
			t.Errorf("%s: got %v, want InvalidArgument", name, err)
		}
	}
	if err := cl.ReportLoad(context.Background(), api.Load{Model: "gpt-9"}); api.Code(err).String() != "InvalidArgument" {
		t.Errorf("report for an unknown model: %v", err)
	}
}

// Plan considers exactly the candidates asked for, and Estimate answers
// for the node named (or the one asked), whichever node answers: the
// candidate set was once decided per node, so that every node listed
// after the first candidate became one too.
func TestPlanCandidatesAndEstimates(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3})
	keys := chainKeys(t, 75, 4)
	putBlocks(t, c.Client(1, api.PathData), keys[:3], 4096)
	c.Converged(10 * time.Second)
	ctx := context.Background()
	req := api.PlanRequest{Tenant: "acme", Namespace: "llama3-8b", Keys: keys}
	for i := range 3 {
		cl := c.Client(i, api.PathData)
		self := fmt.Sprintf("node-%d", i)
		est, err := cl.Estimate(ctx, req, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(est.Nodes) != 1 || est.Nodes[0].Node != self {
			t.Errorf("node %d's estimate for itself answered for %+v", i, est.Nodes)
		}
		for _, want := range [][]string{{"node-0"}, {"node-2"}, {"node-1", "node-2"}, {"node-0", "node-1", "node-2"}} {
			r := req
			r.Candidates = want
			p, err := cl.Plan(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range p.Nodes {
				got = append(got, n.Node)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("node %d planned candidates %v for %v", i, got, want)
			}
		}
	}
}

// A burst of requests planned by one daemon before any engine reports:
// without place every plan sees the same idle cluster and names the same
// node; with place each plan counts the ones before it, in the winner's
// queue and as its coming cache.
func TestPlacedPlansSpreadABurst(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3})
	c.Converged(10 * time.Second)
	cl := c.Client(0, api.PathData)
	ctx := context.Background()
	burst := func(place bool, seed uint32) map[string]int {
		winners := map[string]int{}
		prefix := chainKeys(t, seed, 32)
		for i := range 6 {
			keys := append(append([][]byte(nil), prefix...), chainKeys(t, seed*100+uint32(i), 8)...)
			p, err := cl.Plan(ctx, api.PlanRequest{Tenant: "acme", Namespace: "llama3-8b", Keys: keys, BlockTokens: 512, Place: place})
			if err != nil {
				t.Fatal(err)
			}
			winners[p.Nodes[0].Node]++
			if place && i > 0 && p.Nodes[0].GPUBlocks == 0 && len(winners) == 1 {
				t.Errorf("plan %d went back to %s without counting the prefix placed there", i, p.Nodes[0].Node)
			}
		}
		return winners
	}
	if w := burst(false, 81); len(w) != 1 {
		t.Errorf("unplaced plans of an idle cluster: %v, want one node for all", w)
	}
	if w := burst(true, 82); len(w) < 2 {
		t.Errorf("placed plans: %v, want the burst spread over the nodes", w)
	} else {
		t.Logf("placed burst: %v", w)
	}
}
