package api

import (
	"context"
	"time"

	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// Plan asks the node where a request for a prefix chain should run and
// whether that node should fetch or recompute what it lacks: every
// candidate's plan with all its terms, cheapest first. Fill Tenant,
// Namespace and Keys; the other fields default on the node.
func (c *Client) Plan(ctx context.Context, req *kvpoolv1.PlanRequest) (*kvpoolv1.PlanResponse, error) {
	resp, err := c.rpc.Plan(ctx, req)
	return resp, FromStatus(err)
}

// Estimate is Plan for one node: req.NodeId, or the node asked.
func (c *Client) Estimate(ctx context.Context, req *kvpoolv1.EstimateRequest) (*kvpoolv1.EstimateResponse, error) {
	resp, err := c.rpc.Estimate(ctx, req)
	return resp, FromStatus(err)
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
