package sim

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/transfer/cost"
)

// Policy is how the router places each request.
type Policy uint8

const (
	policyInvalid Policy = iota
	// RoundRobin sends request i to node i mod N.
	RoundRobin
	// LeastLoaded sends each request to the node with the least queued
	// prefill work (the router's estimate of its queue time).
	LeastLoaded
	// Affinity sends each request to the node holding the longest prefix
	// of it (GPU or the node's own host tier); ties go to the least
	// loaded.
	Affinity
	// Cost is the cost router without a pool: per node queue time plus
	// what the node's own tiers leave to prefill, a + b/c; the cheapest
	// node wins.
	Cost
	// Pool is Cost with the global pool: a node may also fetch the prefix
	// from another node's host tier over the network.
	Pool
	// PoolSplit is Pool with the split plan: compute the head of the
	// missing prefix while its tail loads.
	PoolSplit
	// Oracle is the no-limit bound: every prefix ever computed is local
	// to every node, in unlimited memory, and moves for free; requests go
	// where the cost router sends them. No real policy beats it.
	Oracle
)

var policyNames = []string{"", "round-robin", "least-loaded", "affinity", "cost", "pool", "pool-split", "oracle"}

// Policies lists every policy, in the order reports show them.
func Policies() []Policy {
	return []Policy{RoundRobin, LeastLoaded, Affinity, Cost, Pool, PoolSplit, Oracle}
}

func (p Policy) String() string {
	if int(p) < len(policyNames) && p != policyInvalid {
		return policyNames[p]
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// ParsePolicy returns the policy named s.
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if n != "" && n == s {
			return Policy(i), nil
		}
	}
	return policyInvalid, fmt.Errorf("sim: unknown policy %q (known: %s)", s, strings.Join(policyNames[1:], ", "))
}

// fetchesRemote is whether p may fetch from other nodes.
func (p Policy) fetchesRemote() bool { return p == Pool || p == PoolSplit }

// Config is one simulated cluster under one routing policy. Times are
// seconds, sizes bytes or blocks as named.
type Config struct {
	// Nodes is how many engines serve. Required.
	Nodes int
	// Policy routes the requests. Required.
	Policy Policy
	// KVBytesPerToken is the model's KV size per token
	// (cost.Model.KVBytesPerToken). Required.
	KVBytesPerToken float64
	// Prefill is one engine's prefill cost: a measured curve, scaled for
	// the engine's GPUs. Required.
	Prefill cost.Prefill
	// BlockTokens is how many tokens one block holds: the trace's.
	// Default 512.
	BlockTokens int
	// Decode is one engine's decode step. Required.
	Decode Roofline
	// MaxBatch is the most sequences an engine decodes at once. Default
	// 256.
	MaxBatch int
	// GPUBlocks is how many blocks of KV one engine's memory holds,
	// running requests and its prefix cache together. Required.
	GPUBlocks int
	// HostBlocks is each node's kvpool host tier, in blocks; 0: none.
	HostBlocks int
	// NoGPUCache leaves the engines without a prefix cache of their own:
	// GPU memory only holds running requests, and every reuse comes from
	// the node's host tier. This is how kvpool replay emulates engines
	// (they map kvpool's memory), so the simulator configured like a live
	// cluster runs this way.
	NoGPUCache bool
	// RouterSeesHostOnly has the router know only the kvpool daemons'
	// host tiers, not what the engines' GPU caches hold (kvpool without
	// the engines' KV events): its plans count no GPU blocks, so a prefix
	// that is only in some engine's GPU looks uncached. The engines still
	// reuse what they hold.
	RouterSeesHostOnly bool
	// GPUPolicy and HostPolicy order the tiers' evictions. Default LRU.
	GPUPolicy, HostPolicy eviction.Kind
	// HostToGPUBytesPerSecond is the rate blocks load from the node's
	// host tier into its GPU, shared by the loads running at once.
	// Required when HostBlocks > 0.
	HostToGPUBytesPerSecond float64
	// NetworkBytesPerSecond is each node's network bandwidth into it,
	// shared by the fetches it receives. Required for Pool and PoolSplit.
	NetworkBytesPerSecond float64
	// RTTS is the network's round trip and FetchFixedS what else one
	// fetch costs regardless of its size (pin, reserve, commit); both are
	// paid once per fetch before its bytes move.
	RTTS, FetchFixedS float64
	// Seed breaks ties between equally good nodes.
	Seed uint64
}

func (c *Config) fill() {
	if c.BlockTokens == 0 {
		c.BlockTokens = 512
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 256
	}
	if c.GPUPolicy == 0 {
		c.GPUPolicy = eviction.LRU
	}
	if c.HostPolicy == 0 {
		c.HostPolicy = eviction.LRU
	}
}

func positive(x float64) bool { return x > 0 && !math.IsInf(x, 0) }

// Validate fills the defaults and reports every problem with c.
func (c *Config) Validate() error {
	c.fill()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Nodes < 1 {
		bad("nodes %d: want at least 1", c.Nodes)
	}
	if c.Policy == policyInvalid || int(c.Policy) >= len(policyNames) {
		bad("no routing policy")
	}
	if !positive(c.KVBytesPerToken) {
		bad("kv bytes per token %v: want a positive number", c.KVBytesPerToken)
	}
	if c.Prefill == nil {
		bad("no prefill curve")
	}
	if c.BlockTokens < 1 {
		bad("block tokens %d: want at least 1", c.BlockTokens)
	}
	if !positive(c.Decode.HBMBytesPerSecond) || c.Decode.WeightsBytes < 0 || c.Decode.StepOverheadS < 0 {
		bad("decode roofline %+v: want a positive HBM bandwidth and non-negative weights and overhead", c.Decode)
	}
	if c.MaxBatch < 1 {
		bad("max batch %d: want at least 1", c.MaxBatch)
	}
	if c.GPUBlocks < 1 {
		bad("GPU blocks %d: want at least 1 (the weights may leave no room for KV)", c.GPUBlocks)
	}
	if c.HostBlocks < 0 {
		bad("host blocks %d: want 0 (no host tier) or more", c.HostBlocks)
	}
	if c.HostBlocks > 0 && !positive(c.HostToGPUBytesPerSecond) {
		bad("host-to-GPU bandwidth %v: want a positive rate with a host tier", c.HostToGPUBytesPerSecond)
	}
	if c.Policy.fetchesRemote() {
		if !positive(c.NetworkBytesPerSecond) {
			bad("network bandwidth %v: policy %v fetches, so it needs a positive rate", c.NetworkBytesPerSecond, c.Policy)
		}
		if c.HostBlocks == 0 {
			bad("policy %v fetches from other nodes' host tiers, so it needs host blocks", c.Policy)
		}
	}
	if c.RTTS < 0 || c.FetchFixedS < 0 || math.IsNaN(c.RTTS) || math.IsNaN(c.FetchFixedS) {
		bad("round trip %v s and fetch fixed cost %v s: want ≥ 0", c.RTTS, c.FetchFixedS)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sim: config: %w", err)
	}
	return nil
}
