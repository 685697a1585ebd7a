package api

import (
	"context"
	"time"

	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// PlanRequest asks where a request for a prefix chain should run, and
// whether that node should fetch or recompute what it lacks. Tenant,
// Namespace and Keys are required; the rest default on the node.
type PlanRequest struct {
	Tenant, Namespace string
	// Keys is the request's prefix chain, block 0 first.
	Keys [][]byte
	// Model is a profile name ("llama3-8b"); empty: the node's.
	Model string
	// BlockTokens is tokens per key; 0: the node's.
	BlockTokens int
	// PromptTokens is the prompt's length; 0: Keys × BlockTokens.
	PromptTokens int
	// LinkBytesPerSecond, when positive, replaces every link's measured
	// bandwidth: a what-if.
	LinkBytesPerSecond float64
	// Candidates are the nodes that may serve; nil means every live node.
	Candidates []string
	// Place says the caller will send the request to the winner: the
	// answering node counts it in the winner's queue and cache for the
	// plans it answers next, until that node's engine reports again.
	Place bool
}

func (r *PlanRequest) proto() *kvpoolv1.PlanRequest {
	return &kvpoolv1.PlanRequest{Tenant: r.Tenant, Namespace: r.Namespace, Keys: r.Keys, Model: r.Model,
		BlockTokens: uint32(max(r.BlockTokens, 0)), PromptTokens: uint64(max(r.PromptTokens, 0)),
		LinkBytesPerSecond: r.LinkBytesPerSecond, Candidates: r.Candidates, Place: r.Place}
}

// Plan is the cost model's answer: what the prompt costs, and every
// candidate's plan with all its terms, cheapest first.
type Plan struct {
	AnsweredBy      string
	Model           string
	KVBytesPerToken float64
	BlockTokens     int
	ChainBlocks     int
	PromptTokens    int
	// ReferenceAccelerator is the answering node's: its prefill speed at
	// the prompt's length gives PrefillTokensPerSecond and B*.
	ReferenceAccelerator    string
	PrefillTokensPerSecond  float64
	BreakevenBytesPerSecond float64
	Nodes                   []NodePlan
}

// NodePlan is one candidate's plan: recompute what it lacks, fetch it from
// Source, or split the two.
type NodePlan struct {
	Node                   string
	Accelerator            string
	PrefillTokensPerSecond float64 // at the prompt's length, after the engine's report
	Queue                  time.Duration
	LocalBlocks            int           // leading blocks the node holds (GPU or host)
	GPUBlocks              int           // of them, in its engine's GPU memory
	LocalLoad              time.Duration // loading the rest from host memory
	PoolBlocks             int           // leading blocks Source holds
	Source                 string
	LinkBytesPerSecond     float64
	LinkRTT                time.Duration
	LinkMeasured           bool // the link's figures come from transfers, not the seed
	FetchBytes             float64
	Transfer               time.Duration // moving the fetched blocks
	Recompute              time.Duration // prefilling what the node lacks
	Remainder              time.Duration // prefilling past what the pool holds
	RecomputeTotal         time.Duration
	FetchTotal             time.Duration
	SplitBlocks            int // the block where a split's compute and load meet
	SplitTotal             time.Duration
	Plan                   string // "recompute", "fetch" or "split"
	Total                  time.Duration
	// BreakevenBytesPerSecond is the link speed above which fetching beats
	// recomputing on this node (+Inf when it never does).
	BreakevenBytesPerSecond float64
}

// Plan asks the node where a request for req's chain should run and how.
func (c *Client) Plan(ctx context.Context, req PlanRequest) (Plan, error) {
	resp, err := c.rpc.Plan(ctx, req.proto())
	if err != nil {
		return Plan{}, FromStatus(err)
	}
	p := planFromProto(resp.GetSummary())
	for _, n := range resp.GetNodes() {
		p.Nodes = append(p.Nodes, nodePlanFromProto(n))
	}
	return p, nil
}

// Estimate is Plan for one node (empty: the node asked); req.Candidates
// is ignored.
func (c *Client) Estimate(ctx context.Context, req PlanRequest, node string) (Plan, error) {
	pr := req.proto()
	resp, err := c.rpc.Estimate(ctx, &kvpoolv1.EstimateRequest{Tenant: pr.Tenant, Namespace: pr.Namespace, Keys: pr.Keys, Model: pr.Model,
		BlockTokens: pr.BlockTokens, PromptTokens: pr.PromptTokens, LinkBytesPerSecond: pr.LinkBytesPerSecond, NodeId: node})
	if err != nil {
		return Plan{}, FromStatus(err)
	}
	p := planFromProto(resp.GetSummary())
	p.Nodes = []NodePlan{nodePlanFromProto(resp.GetNode())}
	return p, nil
}

func planFromProto(s *kvpoolv1.PlanSummary) Plan {
	return Plan{AnsweredBy: s.GetAnsweredBy(), Model: s.GetModel(), KVBytesPerToken: s.GetKvBytesPerToken(),
		BlockTokens: int(s.GetBlockTokens()), ChainBlocks: int(s.GetChainBlocks()), PromptTokens: int(s.GetPromptTokens()),
		ReferenceAccelerator: s.GetReferenceAccelerator(), PrefillTokensPerSecond: s.GetPrefillTokensPerSecond(),
		BreakevenBytesPerSecond: s.GetBreakevenBytesPerSecond()}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func nodePlanFromProto(n *kvpoolv1.NodePlan) NodePlan {
	return NodePlan{Node: n.GetNodeId(), Accelerator: n.GetAccelerator(), PrefillTokensPerSecond: n.GetPrefillTokensPerSecond(),
		Queue: seconds(n.GetQueueSeconds()), LocalBlocks: int(n.GetLocalBlocks()), GPUBlocks: int(n.GetGpuBlocks()),
		LocalLoad: seconds(n.GetLocalLoadSeconds()), PoolBlocks: int(n.GetPoolBlocks()),
		Source: n.GetSource(), LinkBytesPerSecond: n.GetLinkBytesPerSecond(), LinkRTT: seconds(n.GetLinkRttSeconds()),
		LinkMeasured: n.GetLinkMeasured(), FetchBytes: n.GetFetchBytes(), Transfer: seconds(n.GetTransferSeconds()),
		Recompute: seconds(n.GetRecomputeSeconds()), Remainder: seconds(n.GetRemainderSeconds()),
		RecomputeTotal: seconds(n.GetRecomputeTotalSeconds()), FetchTotal: seconds(n.GetFetchTotalSeconds()),
		SplitBlocks: int(n.GetSplitBlocks()), SplitTotal: seconds(n.GetSplitTotalSeconds()), Plan: n.GetPlan(),
		Total: seconds(n.GetTotalSeconds()), BreakevenBytesPerSecond: n.GetBreakevenBytesPerSecond()}
}

// Load is what an engine tells its daemon about itself.
type Load struct {
	// Queue is how long a request arriving now waits before its prefill.
	Queue time.Duration
	// PrefillTokensPerSecond is the engine's current prefill speed,
	// measured on prompts of PromptTokens (0: unknown).
	PrefillTokensPerSecond float64
	PromptTokens           int
	// Model is the profile the engine serves ("llama3-8b"), if known.
	Model string
}

// ReportLoad tells the node its engine's load; the node plans with it and
// gossips it to the cluster. Engines call it whenever it changes.
func (c *Client) ReportLoad(ctx context.Context, l Load) error {
	_, err := c.rpc.ReportLoad(ctx, &kvpoolv1.ReportLoadRequest{
		QueueSeconds: l.Queue.Seconds(), PrefillTokensPerSecond: l.PrefillTokensPerSecond,
		PrefillPromptTokens: uint64(max(l.PromptTokens, 0)), Model: l.Model,
	})
	return FromStatus(err)
}
