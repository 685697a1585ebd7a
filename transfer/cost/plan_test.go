package cost

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// linear is 1 ms per token: P(T) = T/1000 s.
func linear(t testing.TB) *Curve {
	c, err := NewCurve("test", "cpu", []Point{{1000, 1000}})
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

func ms(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }

// links is a link matrix keyed "from>to".
type links map[string]Link

func (l links) get(from, to string) Link { return l[from+">"+to] }

func TestPlanExact(t *testing.T) {
	c := linear(t)
	// K = 1000 B/token, B = 100 tokens/block: a block is 100 kB and
	// takes 100 ms to prefill; a 10-block chain, 1000 tokens.
	base := func(nodes []Node, l links) *Request {
		return &Request{KVBytesPerToken: 1000, BlockTokens: 100, ChainBlocks: 10, Nominal: c, Nodes: nodes, Link: l.get}
	}
	cases := []struct {
		name string
		req  *Request
		want []NodePlan // every candidate, in rank order
	}{
		{
			// Fetching all 10 blocks at 1 MB/s takes 1.01 s against
			// 1 s of recompute; splitting at k=5 computes 500 ms while
			// 510 ms load.
			name: "split beats both",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c},
				{ID: "s", Candidate: true, Prefill: c, Blocks: 10, Queue: 2 * time.Second},
			}, links{"s>a": {BytesPerSecond: 1e6, RTT: 10 * time.Millisecond}}),
			want: []NodePlan{
				{
					Node: "a", PoolBlocks: 10, Source: "s", Link: Link{BytesPerSecond: 1e6, RTT: 10 * time.Millisecond},
					FetchBytes: 1e6, Transfer: ms(1010), Recompute: ms(1000), Remainder: 0,
					RecomputeTotal: ms(1000), FetchTotal: ms(1010), SplitBlocks: 5, SplitTotal: ms(510),
					Plan: Split, Total: ms(510), BreakevenBytesPerSecond: 1e6 / 0.99,
				},
				{
					Node: "s", Queue: 2 * time.Second, LocalBlocks: 10, PoolBlocks: 10,
					RecomputeTotal: 2 * time.Second, FetchTotal: 2 * time.Second, SplitBlocks: 10, SplitTotal: 2 * time.Second,
					Plan: Recompute, Total: 2 * time.Second,
				},
			},
		},
		{
			// h=4: 6 blocks (600 kB) at 4 MB/s are 150 ms against 600 ms
			// of compute; the split at k=5 computes 100 ms while 125 ms
			// load.
			name: "local prefix, fast link",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c, Blocks: 4},
				{ID: "s", Blocks: 10},
			}, links{"s>a": {BytesPerSecond: 4e6}}),
			want: []NodePlan{{
				Node: "a", LocalBlocks: 4, PoolBlocks: 10, Source: "s", Link: Link{BytesPerSecond: 4e6},
				FetchBytes: 6e5, Transfer: ms(150), Recompute: ms(600),
				RecomputeTotal: ms(600), FetchTotal: ms(150), SplitBlocks: 5, SplitTotal: ms(125),
				Plan: Split, Total: ms(125), BreakevenBytesPerSecond: 1e6,
			}},
		},
		{
			// A fetch's fixed cost (20 ms) and per-block cost (5 ms)
			// count with its bytes: the 6 blocks take 20 + 30 + 150 ms;
			// the split at k=5 computes 100 ms while 20 + 5·5 + 125 ms
			// load; the break-even leaves the 50 ms of overhead out of
			// the head's 600 ms.
			name: "fixed and per-block costs",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c, Blocks: 4},
				{ID: "s", Blocks: 10},
			}, links{"s>a": {BytesPerSecond: 4e6, Fixed: 20 * time.Millisecond, PerBlock: 5 * time.Millisecond}}),
			want: []NodePlan{{
				Node: "a", LocalBlocks: 4, PoolBlocks: 10, Source: "s", Link: Link{BytesPerSecond: 4e6, Fixed: 20 * time.Millisecond, PerBlock: 5 * time.Millisecond},
				FetchBytes: 6e5, Transfer: ms(200), Recompute: ms(600),
				RecomputeTotal: ms(600), FetchTotal: ms(200), SplitBlocks: 5, SplitTotal: ms(170),
				Plan: Split, Total: ms(170), BreakevenBytesPerSecond: 6e5 / 0.55,
			}},
		},
		{
			// A cost per doubling of the chain (10 ms): 8 blocks pay 3 of
			// it, so the fetch takes 30 + 200 ms; the split at k=4
			// computes 200 ms while log2(6)·10 + 150 = 175.85 ms load
			// (k=3 would load 203 ms); the break-even leaves the 30 ms
			// out of the head's 800 ms.
			name: "per-doubling cost",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c, Blocks: 2},
				{ID: "s", Blocks: 10},
			}, links{"s>a": {BytesPerSecond: 4e6, PerDoubling: 10 * time.Millisecond}}),
			want: []NodePlan{{
				Node: "a", LocalBlocks: 2, PoolBlocks: 10, Source: "s", Link: Link{BytesPerSecond: 4e6, PerDoubling: 10 * time.Millisecond},
				FetchBytes: 8e5, Transfer: ms(230), Recompute: ms(800),
				RecomputeTotal: ms(800), FetchTotal: ms(230), SplitBlocks: 4, SplitTotal: ms(200),
				Plan: Split, Total: ms(200), BreakevenBytesPerSecond: 8e5 / 0.77,
			}},
		},
		{
			// The engine holds 2 blocks in GPU memory, the node's host
			// memory 6: blocks 2..5 (400 kB) load at 4 MB/s, 100 ms,
			// before the 400 ms of prefill past block 6.
			name: "GPU tier and host tier",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c, Blocks: 6, GPUBlocks: 2, HostToGPUBytesPerSecond: 4e6},
				{ID: "b", Candidate: true, Prefill: c, GPUBlocks: 7},
			}, links{}),
			want: []NodePlan{
				{
					// b's engine holds 7 blocks its daemon does not: free.
					Node: "b", LocalBlocks: 7, GPUBlocks: 7, PoolBlocks: 7, Recompute: ms(300), Remainder: ms(300),
					RecomputeTotal: ms(300), FetchTotal: ms(300), SplitBlocks: 7, SplitTotal: ms(300),
					Plan: Recompute, Total: ms(300),
				},
				{
					Node: "a", LocalBlocks: 6, GPUBlocks: 2, LocalLoad: ms(100), PoolBlocks: 6, Recompute: ms(400), Remainder: ms(400),
					RecomputeTotal: ms(500), FetchTotal: ms(500), SplitBlocks: 6, SplitTotal: ms(500),
					Plan: Recompute, Total: ms(500),
				},
			},
		},
		{
			// Host memory holds 2 blocks, the disk 3 more: blocks 2..4
			// (300 kB) promote at min(disk 2 MB/s, h2d 4 MB/s), 150 ms,
			// after 2 blocks (200 kB) of host-to-GPU, 50 ms; then 500 ms
			// of prefill past block 5. A node without the disk recomputes
			// 800 ms.
			name: "disk tier behind host memory",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c, Blocks: 2, DiskBlocks: 5, DiskBytesPerSecond: 2e6, HostToGPUBytesPerSecond: 4e6},
				{ID: "b", Candidate: true, Prefill: c, Blocks: 2, DiskBlocks: 1, DiskBytesPerSecond: 2e6},
			}, links{}),
			want: []NodePlan{
				{
					Node: "a", LocalBlocks: 5, LocalLoad: ms(200), DiskBlocks: 3, PoolBlocks: 5, Recompute: ms(500), Remainder: ms(500),
					RecomputeTotal: ms(700), FetchTotal: ms(700), SplitBlocks: 5, SplitTotal: ms(700),
					Plan: Recompute, Total: ms(700),
				},
				{
					Node: "b", LocalBlocks: 2, PoolBlocks: 2, Recompute: ms(800), Remainder: ms(800),
					RecomputeTotal: ms(800), FetchTotal: ms(800), SplitBlocks: 2, SplitTotal: ms(800),
					Plan: Recompute, Total: ms(800),
				},
			},
		},
		{
			// The same without the split: the pure fetch wins.
			name: "local prefix, fast link, no split",
			req: func() *Request {
				r := base([]Node{
					{ID: "a", Candidate: true, Prefill: c, Blocks: 4},
					{ID: "s", Blocks: 10},
				}, links{"s>a": {BytesPerSecond: 4e6}})
				r.NoSplit = true
				return r
			}(),
			want: []NodePlan{{
				Node: "a", LocalBlocks: 4, PoolBlocks: 10, Source: "s", Link: Link{BytesPerSecond: 4e6},
				FetchBytes: 6e5, Transfer: ms(150), Recompute: ms(600),
				RecomputeTotal: ms(600), FetchTotal: ms(150), SplitBlocks: 4, SplitTotal: ms(150),
				Plan: Fetch, Total: ms(150), BreakevenBytesPerSecond: 1e6,
			}},
		},
		{
			// The same at 100 kB/s: loading costs 1 s per block, so the
			// best split is k=p, the recompute.
			name: "slow link recomputes",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c, Blocks: 4},
				{ID: "s", Blocks: 10},
			}, links{"s>a": {BytesPerSecond: 1e5}}),
			want: []NodePlan{{
				Node: "a", LocalBlocks: 4, PoolBlocks: 10, Source: "s", Link: Link{BytesPerSecond: 1e5},
				FetchBytes: 6e5, Transfer: 6 * time.Second, Recompute: ms(600),
				RecomputeTotal: ms(600), FetchTotal: 6 * time.Second, SplitBlocks: 10, SplitTotal: ms(600),
				Plan: Recompute, Total: ms(600), BreakevenBytesPerSecond: 1e6,
			}},
		},
		{
			// A 250 ms rtt makes the split's tail cost at least 250 ms,
			// so a pure fetch of 2 blocks at 10 MB/s (270 ms) loses to
			// recomputing them (200 ms) and the split cannot help.
			name: "rtt dominates",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c, Blocks: 8},
				{ID: "s", Blocks: 10},
			}, links{"s>a": {BytesPerSecond: 1e7, RTT: 250 * time.Millisecond}}),
			want: []NodePlan{{
				Node: "a", LocalBlocks: 8, PoolBlocks: 10, Source: "s", Link: Link{BytesPerSecond: 1e7, RTT: 250 * time.Millisecond},
				FetchBytes: 2e5, Transfer: ms(270), Recompute: ms(200),
				RecomputeTotal: ms(200), FetchTotal: ms(270), SplitBlocks: 10, SplitTotal: ms(200),
				Plan: Recompute, Total: ms(200), BreakevenBytesPerSecond: math.Inf(1),
			}},
		},
		{
			// Two sources: 10 blocks over 1 MB/s, or 8 blocks over
			// 100 MB/s. The fast, shorter one: 8 blocks load in 8 ms,
			// then 200 ms of prefill.
			name: "best source is not the deepest",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c},
				{ID: "deep", Blocks: 10},
				{ID: "near", Blocks: 8},
			}, links{"deep>a": {BytesPerSecond: 1e6}, "near>a": {BytesPerSecond: 1e8}}),
			want: []NodePlan{{
				Node: "a", PoolBlocks: 8, Source: "near", Link: Link{BytesPerSecond: 1e8},
				FetchBytes: 8e5, Transfer: ms(8), Recompute: ms(1000), Remainder: ms(200),
				RecomputeTotal: ms(1000), FetchTotal: ms(208), SplitBlocks: 0, SplitTotal: ms(208),
				Plan: Fetch, Total: ms(208), BreakevenBytesPerSecond: 1e6,
			}},
		},
		{
			// A 200-token tail past the chain is always prefilled; the
			// queue adds to every total and ranks a busy holder behind
			// an idle node that fetches.
			name: "queue and tail",
			req: func() *Request {
				r := base([]Node{
					{ID: "busy", Candidate: true, Prefill: c, Blocks: 10, Queue: 500 * time.Millisecond},
					{ID: "idle", Candidate: true, Prefill: c},
				}, links{"busy>idle": {BytesPerSecond: 1e8}})
				r.PromptTokens = 1200
				return r
			}(),
			want: []NodePlan{
				{
					Node: "idle", PoolBlocks: 10, Source: "busy", Link: Link{BytesPerSecond: 1e8},
					FetchBytes: 1e6, Transfer: ms(10), Recompute: ms(1200), Remainder: ms(200),
					RecomputeTotal: ms(1200), FetchTotal: ms(210), SplitBlocks: 0, SplitTotal: ms(210),
					Plan: Fetch, Total: ms(210), BreakevenBytesPerSecond: 1e6,
				},
				{
					Node: "busy", Queue: ms(500), LocalBlocks: 10, PoolBlocks: 10,
					Recompute: ms(200), Remainder: ms(200),
					RecomputeTotal: ms(700), FetchTotal: ms(700), SplitBlocks: 10, SplitTotal: ms(700),
					Plan: Recompute, Total: ms(700),
				},
			},
		},
		{
			// An unusable link (no estimate) is no source.
			name: "zero bandwidth",
			req: base([]Node{
				{ID: "a", Candidate: true, Prefill: c},
				{ID: "s", Blocks: 10},
			}, links{}),
			want: []NodePlan{{
				Node: "a", Recompute: ms(1000), Remainder: ms(1000),
				RecomputeTotal: ms(1000), FetchTotal: ms(1000), SplitTotal: ms(1000),
				Plan: Recompute, Total: ms(1000),
			}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Plan(tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Nodes) != len(tc.want) {
				t.Fatalf("got %d candidates, want %d", len(res.Nodes), len(tc.want))
			}
			for i, want := range tc.want {
				got := res.Nodes[i]
				if !approxBreakeven(got.BreakevenBytesPerSecond, want.BreakevenBytesPerSecond) {
					t.Errorf("rank %d: breakeven %v, want %v", i, got.BreakevenBytesPerSecond, want.BreakevenBytesPerSecond)
				}
				got.BreakevenBytesPerSecond, want.BreakevenBytesPerSecond = 0, 0
				if got != want {
					t.Errorf("rank %d:\n got %+v\nwant %+v", i, got, want)
				}
			}
		})
	}
}

func approxBreakeven(a, b float64) bool {
	if math.IsInf(b, 1) {
		return math.IsInf(a, 1)
	}
	return math.Abs(a-b) <= 1e-6*math.Abs(b)
}

func TestPlanPromptFigures(t *testing.T) {
	c := linear(t)
	res, err := Plan(&Request{KVBytesPerToken: 1000, BlockTokens: 100, ChainBlocks: 10, Nominal: c,
		Nodes: []Node{{ID: "a", Candidate: true, Prefill: c}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.PromptTokens != 1000 || res.PrefillTokensPerSecond != 1000 || res.BreakevenBytesPerSecond != 1e6 || res.Winner().Node != "a" {
		t.Fatalf("got %+v", res)
	}
}

func TestPlanRejectsBadRequests(t *testing.T) {
	c := linear(t)
	ok := func() Request {
		return Request{KVBytesPerToken: 1000, BlockTokens: 100, ChainBlocks: 10, Nominal: c,
			Nodes: []Node{{ID: "a", Candidate: true, Prefill: c}}}
	}
	cases := map[string]func(*Request){
		"zero kv bytes":        func(r *Request) { r.KVBytesPerToken = 0 },
		"nan kv bytes":         func(r *Request) { r.KVBytesPerToken = math.NaN() },
		"zero block tokens":    func(r *Request) { r.BlockTokens = 0 },
		"prompt below chain":   func(r *Request) { r.PromptTokens = 999 },
		"empty prompt":         func(r *Request) { r.ChainBlocks = 0 },
		"no nominal":           func(r *Request) { r.Nominal = nil },
		"no candidates":        func(r *Request) { r.Nodes[0].Candidate = false },
		"candidate no curve":   func(r *Request) { r.Nodes[0].Prefill = nil },
		"negative queue":       func(r *Request) { r.Nodes[0].Queue = -1 },
		"prefix beyond chain":  func(r *Request) { r.Nodes[0].Blocks = 11 },
		"negative chain":       func(r *Request) { r.ChainBlocks = -1 },
		"negative node blocks": func(r *Request) { r.Nodes[0].Blocks = -1 },
		"gpu beyond chain":     func(r *Request) { r.Nodes[0].GPUBlocks = 11 },
		"negative h2d":         func(r *Request) { r.Nodes[0].HostToGPUBytesPerSecond = -1 },
		"disk beyond chain":    func(r *Request) { r.Nodes[0].DiskBlocks = 11 },
		"disk without rate":    func(r *Request) { r.Nodes[0].DiskBlocks = 10 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			r := ok()
			r.Nodes = append([]Node(nil), r.Nodes...)
			mutate(&r)
			if _, err := Plan(&r); !errors.Is(err, ErrBadRequest) {
				t.Fatalf("got %v, want ErrBadRequest", err)
			}
		})
	}
}

// randomRequest is a cluster of 2-8 nodes with random prefixes, queues,
// speeds and links over the H200 Llama-3-8B curve.
func randomRequest(rng *rand.Rand) (*Request, links) {
	base, _ := NewProfiles().Curve("llama3-8b", "h200")
	chain := 1 + rng.IntN(128)
	r := &Request{KVBytesPerToken: 131072, BlockTokens: 16 << rng.IntN(6), ChainBlocks: chain, Nominal: base}
	r.PromptTokens = chain*r.BlockTokens + rng.IntN(2*r.BlockTokens)
	nodes := 2 + rng.IntN(7)
	l := links{}
	for i := range nodes {
		id := fmt.Sprintf("n%d", i)
		n := Node{
			ID: id, Candidate: rng.IntN(4) != 0 || i == 0, Blocks: rng.IntN(chain + 1),
			Queue:   time.Duration(rng.Int64N(int64(2 * time.Second))),
			Prefill: Scaled{Base: base, Factor: 0.25 + 2*rng.Float64()},
		}
		if rng.IntN(2) == 0 {
			// An engine that reports its GPU cache, and a host-to-GPU rate
			// above every B* here (up to 11 GB/s), as 48-54 GB/s is.
			n.GPUBlocks = rng.IntN(chain + 1)
			n.HostToGPUBytesPerSecond = 20e9 + 80e9*rng.Float64()
		}
		r.Nodes = append(r.Nodes, n)
		for j := range nodes {
			if j != i && rng.IntN(5) != 0 {
				l[fmt.Sprintf("n%d>%s", j, id)] = Link{BytesPerSecond: 1e8 * math.Pow(10, 3*rng.Float64()), RTT: time.Duration(rng.Int64N(int64(20 * time.Millisecond)))}
			}
		}
	}
	r.Link = l.get
	return r, l
}

func totals(t *testing.T, r *Request) map[string]NodePlan {
	t.Helper()
	res, err := Plan(r)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]NodePlan{}
	for i, np := range res.Nodes {
		out[np.Node] = np
		if i > 0 && res.Nodes[i-1].Total > np.Total {
			t.Fatalf("ranking out of order at %d: %v after %v", i, np.Total, res.Nodes[i-1].Total)
		}
	}
	return out
}

func TestPlanProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 2000 {
		r, l := randomRequest(rng)
		before := totals(t, r)
		for id, np := range before {
			if np.SplitTotal > np.FetchTotal || np.SplitTotal > np.RecomputeTotal {
				t.Fatalf("iter %d node %s: split %v worse than fetch %v or recompute %v", iter, id, np.SplitTotal, np.FetchTotal, np.RecomputeTotal)
			}
			if np.Total != min(np.RecomputeTotal, np.FetchTotal, np.SplitTotal) {
				t.Fatalf("iter %d node %s: total %v is not the least of %+v", iter, id, np.Total, np)
			}
		}

		// More bandwidth on every link never raises a total.
		faster := links{}
		for k, v := range l {
			v.BytesPerSecond *= 1 + 3*rng.Float64()
			faster[k] = v
		}
		r2 := *r
		r2.Link = faster.get
		for id, np := range totals(t, &r2) {
			if np.Total > before[id].Total {
				t.Fatalf("iter %d node %s: faster links raised the total %v → %v", iter, id, before[id].Total, np.Total)
			}
		}

		// A longer prefix in the engine's GPU memory never raises that
		// node's total.
		i := rng.IntN(len(r.Nodes))
		id := r.Nodes[i].ID
		if r.Nodes[i].Candidate && r.Nodes[i].GPUBlocks < r.ChainBlocks {
			r4 := *r
			r4.Nodes = append([]Node(nil), r.Nodes...)
			r4.Nodes[i].GPUBlocks += 1 + rng.IntN(r.ChainBlocks-r4.Nodes[i].GPUBlocks)
			if got := totals(t, &r4)[id]; got.Total > before[id].Total {
				t.Fatalf("iter %d node %s: GPU prefix %d → %d raised the total %v → %v", iter, id, r.Nodes[i].GPUBlocks, r4.Nodes[i].GPUBlocks, before[id].Total, got.Total)
			}
		}

		// Nor does a longer local prefix. (Not checked with a known GPU
		// tier: host blocks then load before the prefill, not overlapped
		// with a split's compute as fetched ones are, so a longer host
		// prefix can cost a split a little overlap.)
		if !r.Nodes[i].Candidate || r.Nodes[i].Blocks == r.ChainBlocks || r.Nodes[i].HostToGPUBytesPerSecond > 0 {
			continue
		}
		r3 := *r
		r3.Nodes = append([]Node(nil), r.Nodes...)
		r3.Nodes[i].Blocks += 1 + rng.IntN(r.ChainBlocks-r3.Nodes[i].Blocks)
		if got := totals(t, &r3)[id]; got.Total > before[id].Total {
			t.Fatalf("iter %d node %s: prefix %d → %d raised the total %v → %v", iter, id, r.Nodes[i].Blocks, r3.Nodes[i].Blocks, before[id].Total, got.Total)
		}
	}
}

// The H200 anchors: B* of a 4k-token prompt is 4.68 GB/s for Llama-3-8B and
// 1.39 GB/s for Llama-3-70B; every measured row within 5%.
func TestAnchorBreakeven(t *testing.T) {
	p := NewProfiles()
	rows := []struct {
		model  string
		tokens int
		gbps   float64
	}{
		{"llama3-8b", 1024, 4.48}, {"llama3-8b", 4096, 4.68}, {"llama3-8b", 16384, 3.97}, {"llama3-8b", 32768, 3.17},
		{"llama3-70b", 1024, 1.47}, {"llama3-70b", 4096, 1.39}, {"llama3-70b", 16384, 1.21}, {"llama3-70b", 32768, 1.07},
	}
	for _, row := range rows {
		m, err := p.Model(row.model)
		if err != nil {
			t.Fatal(err)
		}
		c, err := p.Curve(row.model, "h200")
		if err != nil {
			t.Fatal(err)
		}
		res, err := Plan(&Request{KVBytesPerToken: m.KVBytesPerToken(), BlockTokens: row.tokens, ChainBlocks: 1, Nominal: c,
			Nodes: []Node{{ID: "a", Candidate: true, Prefill: c}}})
		if err != nil {
			t.Fatal(err)
		}
		got := res.BreakevenBytesPerSecond / 1e9
		if math.Abs(got-row.gbps)/row.gbps > 0.05 {
			t.Errorf("%s at %d tokens: B* %.3f GB/s, want %.2f ± 5%%", row.model, row.tokens, got, row.gbps)
		}
	}
}

// Mooncake (FAST'25) Eq. 2: reusing an 8192-token Llama-3-70B prefix pays
// above about 6 GB/s on 8×A800 and 19 GB/s on 8×H800, with the paper's
// FLOPs model (a = 4, b = 22, d = 8192, 80 layers) at the GPUs' dense
// bf16 peaks (312 and 989 TFLOPS).
func TestMooncakeEq2(t *testing.T) {
	m, _ := NewProfiles().Model("llama3-70b")
	for _, tc := range []struct {
		gpu    string
		tflops float64
		gbps   float64
	}{{"8xA800", 312, 6}, {"8xH800", 989, 19}} {
		f := FLOPsCurve{Layers: 80, Hidden: 8192, Attn: 4, Linear: 22, FLOPS: 8 * tc.tflops * 1e12}
		res, err := Plan(&Request{KVBytesPerToken: m.KVBytesPerToken(), BlockTokens: 8192, ChainBlocks: 1, Nominal: f,
			Nodes: []Node{{ID: "a", Candidate: true, Prefill: f}}})
		if err != nil {
			t.Fatal(err)
		}
		got := res.BreakevenBytesPerSecond / 1e9
		if math.Abs(got-tc.gbps)/tc.gbps > 0.05 {
			t.Errorf("%s: B* %.2f GB/s, want about %v", tc.gpu, got, tc.gbps)
		}
		t.Logf("%s: B* = %.2f GB/s (paper: about %v)", tc.gpu, got, tc.gbps)
	}
}

// BenchmarkPlan: 8 candidate nodes, a 128-block chain, every link known.
func BenchmarkPlan(b *testing.B) {
	base, _ := NewProfiles().Curve("llama3-8b", "h200")
	r := &Request{KVBytesPerToken: 131072, BlockTokens: 256, ChainBlocks: 128, Nominal: base}
	l := links{}
	for i := range 8 {
		id := fmt.Sprintf("n%d", i)
		r.Nodes = append(r.Nodes, Node{ID: id, Candidate: true, Blocks: i * 16, Queue: time.Duration(i) * 10 * time.Millisecond, Prefill: Scaled{base, 1}})
		for j := range 8 {
			if j != i {
				l[fmt.Sprintf("n%d>%s", j, id)] = Link{BytesPerSecond: float64(1+j) * 1e9, RTT: 50 * time.Microsecond}
			}
		}
	}
	r.Link = l.get
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(r); err != nil {
			b.Fatal(err)
		}
	}
}
