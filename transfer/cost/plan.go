package cost

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"
)

// Link is what a transfer from a source to a candidate costs.
type Link struct {
	// BytesPerSecond is the link's measured (or seeded) bandwidth; 0
	// means the source cannot be used.
	BytesPerSecond float64
	// RTT is paid once per fetch.
	RTT time.Duration
	// Fixed is what else one fetch costs whatever its size (the call,
	// the pins, reserve, commit, publish), PerBlock what each block it
	// moves adds beyond its bytes, and PerDoubling what each doubling of
	// its chain adds (the work a chain's blocks share): measured per link
	// from real fetches (transfer.Links). A fetch of n blocks of b bytes
	// takes RTT + Fixed + n·PerBlock + log2(n)·PerDoubling + n·b /
	// BytesPerSecond.
	Fixed, PerBlock, PerDoubling time.Duration
}

// overhead is what a fetch of n blocks over l costs beyond its bytes.
func (l Link) overhead(n int) float64 {
	return l.RTT.Seconds() + l.Fixed.Seconds() + float64(n)*l.PerBlock.Seconds() + math.Log2(float64(max(n, 1)))*l.PerDoubling.Seconds()
}

// Node is one node of the cluster as the planner sees it.
type Node struct {
	// ID names the node.
	ID string
	// Candidate is whether the request may run here; other nodes are
	// only sources.
	Candidate bool
	// Queue is how long a new request waits in the node's engine.
	Queue time.Duration
	// Blocks is how many leading blocks of the chain the node holds in
	// its kvpool host memory.
	Blocks int
	// GPUBlocks is how many leading blocks its engine holds in GPU memory
	// (from the engine's KV events); 0 when none or unknown. The node's
	// local prefix is the longer of the two.
	GPUBlocks int
	// HostToGPUBytesPerSecond prices the local blocks the GPU lacks,
	// [GPUBlocks, Blocks): they load from host memory at this rate before
	// the prefill. 0: free, for a node whose engine's cache is unknown
	// (every local block counts as usable at once, as before engines
	// reported their caches).
	HostToGPUBytesPerSecond float64
	// DiskBlocks is how many leading blocks the node holds in host
	// memory or on its local disk tier (pool/disk); 0 when it has none,
	// or no more than Blocks. The blocks [Blocks, DiskBlocks) are read
	// from disk into host memory (a promote) at DiskBytesPerSecond, and
	// cross to the GPU at the slower of that and HostToGPUBytesPerSecond.
	DiskBlocks int
	// DiskBytesPerSecond is the node's measured disk read rate. Required
	// (> 0) when DiskBlocks > Blocks.
	DiskBytesPerSecond float64
	// Prefill is the node's engine's prefill cost. Required for
	// candidates.
	Prefill Prefill
}

// Request is everything the planner needs. It is not modified.
type Request struct {
	// KVBytesPerToken is the model's KV size per token (Model.KVBytesPerToken).
	KVBytesPerToken float64
	// BlockTokens is how many tokens one block (one chain key) holds.
	BlockTokens int
	// ChainBlocks is the chain's length in blocks.
	ChainBlocks int
	// PromptTokens is the prompt's length; at least
	// ChainBlocks×BlockTokens (the chain covers whole blocks only).
	// 0 means exactly that.
	PromptTokens int
	// Nominal is the model's prefill curve on the reference accelerator;
	// it gives the prompt's prefill speed and break-even bandwidth.
	Nominal Prefill
	// Nodes lists candidates and sources.
	Nodes []Node
	// Link returns the link from a source to a candidate. nil: no source
	// can be used.
	Link func(from, to string) Link
	// NoSplit leaves the split out: each candidate recomputes or fetches,
	// for an engine that cannot overlap loading with computing. Its
	// SplitBlocks is then h and SplitTotal the cheaper pure plan.
	NoSplit bool
}

// PlanKind is what a node should do with the prefix it does not hold.
type PlanKind uint8

const (
	planInvalid PlanKind = iota
	// Recompute prefills everything past the local prefix.
	Recompute
	// Fetch loads blocks [h, p) from the source, then prefills the rest.
	Fetch
	// Split computes blocks [h, k) while blocks [k, p) load.
	Split
)

func (k PlanKind) String() string {
	switch k {
	case Recompute:
		return "recompute"
	case Fetch:
		return "fetch"
	case Split:
		return "split"
	}
	return fmt.Sprintf("PlanKind(%d)", uint8(k))
}

// NodePlan is one candidate's answer, with every term. Times include the
// queue only where the name says Total.
type NodePlan struct {
	Node string
	// Queue is the node's queue time, a.
	Queue time.Duration
	// LocalBlocks is h, the chain prefix the node holds (GPU or host), and
	// GPUBlocks the part of it in GPU memory.
	LocalBlocks, GPUBlocks int
	// LocalLoad is loading the local blocks the GPU lacks from host
	// memory, and those on the local disk from disk; every total
	// includes it.
	LocalLoad time.Duration
	// DiskBlocks is the part of LocalBlocks read from the local disk.
	DiskBlocks int
	// PoolBlocks is p, the prefix held by Source, the source that gives
	// this node its best plan; p = h and Source empty when no node holds
	// more of the chain over a usable link.
	PoolBlocks int
	Source     string
	Link       Link
	// FetchBytes is (p−h)·B·K, and Transfer its rtt + bytes/bw.
	FetchBytes float64
	Transfer   time.Duration
	// Recompute is P(n) − P(hB): prefill everything past the local prefix.
	Recompute time.Duration
	// Remainder is P(n) − P(pB): prefill past the pool prefix.
	Remainder time.Duration
	// RecomputeTotal = a + LocalLoad + Recompute; FetchTotal = a +
	// LocalLoad + Transfer + Remainder (equal to RecomputeTotal when there
	// is no source).
	RecomputeTotal, FetchTotal time.Duration
	// SplitBlocks is the k of the best split and SplitTotal its total;
	// the head [h, k) computes while [k, p) loads.
	SplitBlocks int
	SplitTotal  time.Duration
	// Plan is the cheapest of the three (the simpler one on a tie) and
	// Total its cost.
	Plan  PlanKind
	Total time.Duration
	// BreakevenBytesPerSecond is the link bandwidth above which fetching
	// [h, p) beats recomputing it on this node; +Inf when the rtt alone
	// exceeds the recompute and 0 without a source.
	BreakevenBytesPerSecond float64
}

// Result ranks the candidates, best first.
type Result struct {
	// PromptTokens is n.
	PromptTokens int
	// KVBytesPerToken is K.
	KVBytesPerToken float64
	// PrefillTokensPerSecond is c(n) on the nominal curve.
	PrefillTokensPerSecond float64
	// BreakevenBytesPerSecond is B* = c(n)·K.
	BreakevenBytesPerSecond float64
	// Nodes are the candidates, cheapest total first (then by id).
	Nodes []NodePlan
}

// Winner is the best candidate's plan.
func (r *Result) Winner() NodePlan { return r.Nodes[0] }

// ErrBadRequest marks a request the planner cannot answer.
var ErrBadRequest = errors.New("cost: bad plan request")

func (r *Request) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !(r.KVBytesPerToken > 0) || math.IsInf(r.KVBytesPerToken, 0) {
		bad("kv bytes per token %v must be positive", r.KVBytesPerToken)
	}
	if r.BlockTokens <= 0 {
		bad("block tokens %d must be positive", r.BlockTokens)
	}
	if r.ChainBlocks < 0 {
		bad("chain blocks %d must not be negative", r.ChainBlocks)
	}
	if r.PromptTokens != 0 && r.PromptTokens < r.ChainBlocks*r.BlockTokens {
		bad("prompt tokens %d is shorter than the chain's %d blocks × %d tokens", r.PromptTokens, r.ChainBlocks, r.BlockTokens)
	}
	if r.PromptTokens == 0 && r.ChainBlocks == 0 {
		bad("an empty prompt")
	}
	if r.Nominal == nil {
		bad("no nominal prefill curve")
	}
	candidates := 0
	for _, n := range r.Nodes {
		if n.Blocks < 0 || n.Blocks > r.ChainBlocks || n.GPUBlocks < 0 || n.GPUBlocks > r.ChainBlocks {
			bad("node %s holds %d blocks (%d in GPU) of a %d-block chain", n.ID, n.Blocks, n.GPUBlocks, r.ChainBlocks)
		}
		if n.HostToGPUBytesPerSecond < 0 || math.IsNaN(n.HostToGPUBytesPerSecond) || math.IsInf(n.HostToGPUBytesPerSecond, 0) {
			bad("node %s: host-to-GPU rate %v must be a non-negative number", n.ID, n.HostToGPUBytesPerSecond)
		}
		if n.DiskBlocks < 0 || n.DiskBlocks > r.ChainBlocks {
			bad("node %s holds %d blocks on disk of a %d-block chain", n.ID, n.DiskBlocks, r.ChainBlocks)
		}
		if n.DiskBlocks > n.Blocks && !(n.DiskBytesPerSecond > 0 && !math.IsInf(n.DiskBytesPerSecond, 0)) {
			bad("node %s: disk read rate %v must be a positive number when it holds disk blocks", n.ID, n.DiskBytesPerSecond)
		}
		if n.Candidate {
			candidates++
			if n.Prefill == nil {
				bad("candidate %s has no prefill curve", n.ID)
			}
			if n.Queue < 0 {
				bad("candidate %s has a negative queue time", n.ID)
			}
		}
	}
	if candidates == 0 {
		bad("no candidate nodes")
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return nil
}

// Plan answers r for every candidate. It is a pure function of r.
func Plan(r *Request) (Result, error) {
	if err := r.validate(); err != nil {
		return Result{}, err
	}
	n := r.PromptTokens
	if n == 0 {
		n = r.ChainBlocks * r.BlockTokens
	}
	res := Result{
		PromptTokens:           n,
		KVBytesPerToken:        r.KVBytesPerToken,
		PrefillTokensPerSecond: TokensPerSecond(r.Nominal, float64(n)),
	}
	res.BreakevenBytesPerSecond = res.PrefillTokensPerSecond * r.KVBytesPerToken
	for i := range r.Nodes {
		if r.Nodes[i].Candidate {
			res.Nodes = append(res.Nodes, r.planNode(&r.Nodes[i], n))
		}
	}
	slices.SortStableFunc(res.Nodes, func(a, b NodePlan) int {
		if c := cmp.Compare(a.Total, b.Total); c != 0 {
			return c
		}
		return cmp.Compare(a.Node, b.Node)
	})
	return res, nil
}

// seconds converts to a Duration, rounding to the nearest nanosecond.
func seconds(s float64) time.Duration {
	if s >= math.MaxInt64/1e9 {
		return math.MaxInt64
	}
	return time.Duration(math.Round(s * 1e9))
}

// planNode evaluates every usable source for c and keeps the best.
func (r *Request) planNode(c *Node, n int) NodePlan {
	B := float64(r.BlockTokens)
	P := func(blocks int) float64 { return c.Prefill.Seconds(float64(blocks) * B) }
	pn := c.Prefill.Seconds(float64(n))
	h := max(c.Blocks, c.GPUBlocks)
	// The local blocks the GPU lacks load first; a is the queue, then
	// that load: host memory at the host-to-GPU rate, then the disk's
	// blocks past them at the slower of the disk's and that rate.
	var load float64
	if c.HostToGPUBytesPerSecond > 0 && c.Blocks > c.GPUBlocks {
		load = float64(c.Blocks-c.GPUBlocks) * B * r.KVBytesPerToken / c.HostToGPUBytesPerSecond
	}
	diskBlocks := 0
	if c.DiskBlocks > h {
		diskBlocks = c.DiskBlocks - h
		bw := c.DiskBytesPerSecond
		if h2d := c.HostToGPUBytesPerSecond; h2d > 0 {
			bw = min(bw, h2d)
		}
		load += float64(diskBlocks) * B * r.KVBytesPerToken / bw
		h = c.DiskBlocks
	}
	localLoad := seconds(load)
	a := c.Queue + localLoad
	recompute := seconds(pn - P(h))
	np := NodePlan{
		Node: c.ID, Queue: c.Queue, LocalBlocks: h, GPUBlocks: min(c.GPUBlocks, h), LocalLoad: localLoad, DiskBlocks: diskBlocks, PoolBlocks: h,
		Recompute: recompute, Remainder: recompute,
		RecomputeTotal: a + recompute, FetchTotal: a + recompute,
		SplitBlocks: h, SplitTotal: a + recompute,
		Plan: Recompute, Total: a + recompute,
	}
	if r.Link == nil {
		return np
	}
	for i := range r.Nodes {
		s := &r.Nodes[i]
		p := s.Blocks
		if s.ID == c.ID || p <= h {
			continue
		}
		l := r.Link(s.ID, c.ID)
		if !(l.BytesPerSecond > 0) {
			continue
		}
		// Fetched blocks land in host memory and cross to the GPU as they
		// arrive: a node whose host-to-GPU rate is known moves them at the
		// slower of the two.
		bw := l.BytesPerSecond
		if h2d := c.HostToGPUBytesPerSecond; h2d > 0 {
			bw = min(bw, h2d)
		}
		load := func(k int) float64 { // seconds to load blocks [k, p)
			if k >= p {
				return 0
			}
			return l.overhead(p-k) + float64(p-k)*B*r.KVBytesPerToken/bw
		}
		remainder := pn - P(p)
		cand := np
		cand.PoolBlocks, cand.Source, cand.Link = p, s.ID, l
		cand.FetchBytes = float64(p-h) * B * r.KVBytesPerToken
		cand.Transfer = seconds(load(h))
		cand.Remainder = seconds(remainder)
		cand.FetchTotal = a + seconds(load(h)+remainder)
		if head := P(p) - P(h) - l.overhead(p-h); head > 0 {
			cand.BreakevenBytesPerSecond = cand.FetchBytes / head
		} else {
			cand.BreakevenBytesPerSecond = math.Inf(1)
		}
		// The head's compute grows with k and the tail's load shrinks:
		// find the first k where compute ≥ load; the best split is
		// there or one block before.
		f := func(k int) float64 { return max(P(k)-P(h), load(k)) }
		k := h + sort.Search(p-h+1, func(j int) bool { return P(h+j)-P(h) >= load(h+j) })
		best := min(k, p)
		if k > h && f(k-1) <= f(best) {
			best = k - 1
		}
		if r.NoSplit {
			best = h
		}
		cand.SplitBlocks = best
		// f(best) ≤ f(h) and f(p), so the split never costs more than
		// either pure plan; min only removes float rounding noise.
		cand.SplitTotal = min(a+seconds(f(best)+remainder), cand.FetchTotal, cand.RecomputeTotal)
		cand.Plan, cand.Total = Recompute, cand.RecomputeTotal
		if cand.FetchTotal < cand.Total {
			cand.Plan, cand.Total = Fetch, cand.FetchTotal
		}
		if cand.SplitTotal < cand.Total && best > h && best < p {
			cand.Plan, cand.Total = Split, cand.SplitTotal
		}
		if better(&cand, &np) {
			np = cand
		}
	}
	return np
}

// better orders a node's options: lower total, then a cheaper pure
// fetch, a longer pool prefix, a faster link, the source's id. Any
// source beats none, so the answer shows the best source's terms even
// when recomputing wins.
func better(a, b *NodePlan) bool {
	switch {
	case b.Source == "":
		return true
	case a.Total != b.Total:
		return a.Total < b.Total
	case a.FetchTotal != b.FetchTotal:
		return a.FetchTotal < b.FetchTotal
	case a.PoolBlocks != b.PoolBlocks:
		return a.PoolBlocks > b.PoolBlocks
	case a.Link.BytesPerSecond != b.Link.BytesPerSecond:
		return a.Link.BytesPerSecond > b.Link.BytesPerSecond
	}
	return a.Source < b.Source
}
