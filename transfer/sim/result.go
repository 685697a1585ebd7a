package sim

import (
	"math"
	"slices"
)

// Outcome is what happened to one request.
type Outcome struct {
	ID, Node int
	// Plan is what the router chose: recompute, fetch or split.
	Plan string
	// TTFTS is arrival to first token, QueueS arrival to the start of its
	// prefill, TPOTS the mean time per answer token after the first, and
	// DoneS when its last token came, all in seconds.
	TTFTS, QueueS, TPOTS, DoneS float64
	// The prompt's tokens by where their KV came from; they sum to the
	// prompt's length.
	Computed, Reused, FromHost, Fetched int
	// FetchFailed is whether the planned source had evicted a block by
	// the time the engine started, so it recomputed instead.
	FetchFailed bool
}

// Stats summarizes a distribution, in seconds.
type Stats struct {
	P50 float64 `json:"p50_s"`
	P90 float64 `json:"p90_s"`
	P99 float64 `json:"p99_s"`
	// Mean is the average.
	Mean float64 `json:"mean_s"`
}

// Result is one run's report.
type Result struct {
	Policy   string `json:"policy"`
	Requests int    `json:"requests"`
	// TTFT over every request, TPOT over those with an answer of two
	// tokens or more.
	TTFT Stats `json:"ttft"`
	TPOT Stats `json:"tpot"`
	// MakespanS is from the first arrival to the last token.
	MakespanS float64 `json:"makespan_s"`
	// OutputTokensPerS and RequestsPerS are throughput over the makespan.
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	// The prompts' tokens by where their KV came from: prefilled, reused
	// from the engine's GPU cache, loaded from its own host tier, fetched
	// from another node's.
	InputTokens    int `json:"input_tokens"`
	ComputedTokens int `json:"computed_tokens"`
	ReusedTokens   int `json:"reused_tokens"`
	HostTokens     int `json:"host_tokens"`
	FetchedTokens  int `json:"fetched_tokens"`
	// Hit ratios per tier: the share of prompt tokens each served.
	GPUHitRatio  float64 `json:"gpu_hit_ratio"`
	HostHitRatio float64 `json:"host_hit_ratio"`
	PoolHitRatio float64 `json:"pool_hit_ratio"`
	// NetworkBytes moved between nodes, HostToGPUBytes within them.
	NetworkBytes   float64 `json:"network_bytes"`
	HostToGPUBytes float64 `json:"host_to_gpu_bytes"`
	// Fetches from other nodes, and planned fetches that failed because
	// the source had evicted a block.
	Fetches       int `json:"fetches"`
	FetchesFailed int `json:"fetches_failed"`
	// GPUStored and GPUEvicted count the blocks the GPU caches stored and
	// evicted, all nodes together: the events engines would publish.
	GPUStored  int `json:"gpu_stored_blocks"`
	GPUEvicted int `json:"gpu_evicted_blocks"`
	// Outcomes is every request's, by ID.
	Outcomes []Outcome `json:"-"`
}

// Percentile is the q-quantile (0 ≤ q ≤ 1) of sorted xs, by linear
// interpolation between closest ranks; 0 for none.
func Percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := q * float64(len(sorted)-1)
	i := int(math.Floor(pos))
	if i >= len(sorted)-1 {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (pos-float64(i))*(sorted[i+1]-sorted[i])
}

// Distribution is the Stats of xs (which it sorts).
func Distribution(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Stats{P50: Percentile(xs, 0.5), P90: Percentile(xs, 0.9), P99: Percentile(xs, 0.99), Mean: sum / float64(len(xs))}
}

func (c *cluster) summarize() {
	c.res = Summarize(c.cfg.Policy.String(), c.reqs, c.res.Outcomes)
	for _, e := range c.engines {
		c.res.GPUStored += e.gpu.Insertions
		c.res.GPUEvicted += e.gpu.Evictions
	}
	for _, o := range c.res.Outcomes {
		if o.Fetched > 0 {
			c.res.Fetches++
		}
		c.res.NetworkBytes += float64(o.Fetched) * c.cfg.KVBytesPerToken
		c.res.HostToGPUBytes += float64(o.FromHost) * c.cfg.KVBytesPerToken
	}
}

// Summarize reports a run from every request's outcome (by ID, one per
// request): the distributions, throughput and token shares. It leaves
// the byte counts and fetches to the caller, who knows what moved.
func Summarize(policy string, reqs []Request, outcomes []Outcome) Result {
	r := Result{Policy: policy, Requests: len(reqs), Outcomes: outcomes}
	ttft := make([]float64, 0, len(reqs))
	var tpot []float64
	first, last, out := math.Inf(1), 0.0, 0
	for _, o := range outcomes {
		req := &reqs[o.ID]
		ttft = append(ttft, o.TTFTS)
		if req.OutputTokens > 1 {
			tpot = append(tpot, o.TPOTS)
		}
		first, last = min(first, req.ArrivalS), max(last, o.DoneS)
		out += max(req.OutputTokens, 1)
		r.InputTokens += req.InputTokens
		r.ComputedTokens += o.Computed
		r.ReusedTokens += o.Reused
		r.HostTokens += o.FromHost
		r.FetchedTokens += o.Fetched
		if o.FetchFailed {
			r.FetchesFailed++
		}
	}
	r.TTFT, r.TPOT = Distribution(ttft), Distribution(tpot)
	r.MakespanS = last - first
	if r.MakespanS > 0 {
		r.OutputTokensPerS = float64(out) / r.MakespanS
		r.RequestsPerS = float64(len(reqs)) / r.MakespanS
	}
	if in := float64(r.InputTokens); in > 0 {
		r.GPUHitRatio = float64(r.ReusedTokens) / in
		r.HostHitRatio = float64(r.HostTokens) / in
		r.PoolHitRatio = float64(r.FetchedTokens) / in
	}
	return r
}
