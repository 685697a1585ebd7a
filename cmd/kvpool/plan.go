package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/transfer/cost"
)

// profilesDoc is a profiles file: model profiles and measured prefill
// curves. A GPU anchor document (gpu_anchor.py's JSON: "gpu" and
// "prefill") is accepted as well.
type profilesDoc struct {
	Models []cost.Model `json:"models"`
	Curves []cost.Curve `json:"curves"`
}

// loadProfiles returns the built-in profiles plus those in files and the
// inline ones, reporting every problem.
func loadProfiles(files []string, models []cost.Model, curves []cost.Curve) (*cost.Profiles, error) {
	p := cost.NewProfiles()
	var errs []error
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var probe map[string]any
		if err := yaml.Unmarshal(b, &probe); err != nil {
			errs = append(errs, fmt.Errorf("profiles %s: %w", file, err))
			continue
		}
		if _, ok := probe["prefill"]; ok {
			cs, err := cost.ReadAnchorCurves(strings.NewReader(string(b)), "")
			if err != nil {
				errs = append(errs, fmt.Errorf("profiles %s: %w", file, err))
			}
			curves = append(curves, cs...)
			continue
		}
		var doc profilesDoc
		if err := yaml.UnmarshalStrict(b, &doc); err != nil {
			errs = append(errs, fmt.Errorf("profiles %s: %w", file, err))
			continue
		}
		models, curves = append(models, doc.Models...), append(curves, doc.Curves...)
	}
	for _, m := range models {
		errs = append(errs, p.AddModel(m))
	}
	for _, c := range curves {
		errs = append(errs, p.AddCurve(c))
	}
	return p, errors.Join(errs...)
}

type planFlags struct {
	cf          clientFlags
	chain       chainFlags
	profiles    []string
	model       string
	accelerator string
	tokens      int
	cached      int
	linkGBps    float64
	rtt         time.Duration
	prefillTPS  float64
	prompt      int
	candidates  []string
}

func planCmd(e *env) *cobra.Command {
	var f planFlags
	c := &cobra.Command{
		Use:   "plan",
		Short: "Fetch or recompute: what a prompt's KV costs, per node",
		Long: `plan answers the question kvpool exists for: should a node fetch a prompt's
cached KV from the pool, or recompute it?

Without --server it uses profiles alone. For --model on --accelerator it
prints the KV bytes per token, the prefill speed at --tokens, the break-even
bandwidth B* (a link slower than this delivers KV more slowly than prefill
computes it), and, with --link-gbps, how long fetching the prefix takes
against recomputing it, and the best plan: recompute, fetch, or split
(compute the head while the tail loads).

With --server and a chain (--keys, or --tokens-file hashed as the engine
hashes it), the node plans against the live cluster: for every node its
queue, the prefix it holds (local), the best prefix another node holds
(pool) and that source, fetch and recompute times over the measured link,
the chosen plan and its total; the cheapest node wins.

GB/s is 10^9 bytes per second. Model profiles built in: llama3-8b,
llama3-70b, llama3-405b, qwen2.5-7b, deepseek-v3 (MLA). Prefill curves built
in: llama3-8b and llama3-70b on h200, measured. --profiles adds models and
curves from a YAML or JSON file ("models:" and "curves:" lists), or a GPU
anchor document written by gpu_anchor.py.`,
		Example: `  kvpool plan --model llama3-8b --tokens 4096 --accelerator h200 --json
  kvpool plan --model llama3-70b --tokens 8192 --link-gbps 3.2
  kvpool plan --server 127.0.0.1:7070 --tenant acme --namespace llama3-8b --tokens-file prompt.txt --block-tokens 16`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("server") {
				return f.live(cmd, e)
			}
			return f.offline(e)
		},
	}
	fl := c.Flags()
	f.cf.register(c, true)
	f.chain.register(c, &f.cf)
	fl.StringSliceVar(&f.profiles, "profiles", nil, "extra model profiles and prefill curves (YAML/JSON, or a GPU anchor document); repeatable")
	fl.StringVar(&f.model, "model", "llama3-8b", "model profile (with --server, default: the node's)")
	fl.StringVar(&f.accelerator, "accelerator", cost.DefaultAccelerator, "accelerator whose prefill curve to use (without --server)")
	fl.IntVar(&f.tokens, "tokens", 0, "prompt length in tokens (without --server; required there)")
	fl.IntVar(&f.cached, "cached-tokens", 0, "tokens of the prompt already on the node (without --server)")
	fl.Float64Var(&f.linkGBps, "link-gbps", 0, "link bandwidth in GB/s (10^9 B/s) to fetch over; with --server a what-if replacing every measured link")
	fl.DurationVar(&f.rtt, "rtt", 0, "link round trip (without --server)")
	fl.Float64Var(&f.prefillTPS, "prefill-tps", 0, "prefill speed in tokens/s, for a model or accelerator without a curve (without --server)")
	fl.IntVar(&f.prompt, "prompt-tokens", 0, "prompt length with --server when it exceeds the chain's blocks × --block-tokens")
	fl.StringSliceVar(&f.candidates, "candidates", nil, "with --server: nodes that may serve (default every live node)")
	return c
}

// offline plans with profiles alone: one node holding --cached-tokens,
// and the pool holding the whole prompt behind a --link-gbps link.
func (f *planFlags) offline(e *env) error {
	var errs []error
	if f.tokens <= 0 {
		errs = append(errs, fmt.Errorf("--tokens %d: want the prompt's length, a positive count", f.tokens))
	}
	if f.cached < 0 || f.cached > f.tokens {
		errs = append(errs, fmt.Errorf("--cached-tokens %d: want 0 to --tokens", f.cached))
	}
	if f.linkGBps < 0 || math.IsNaN(f.linkGBps) || math.IsInf(f.linkGBps, 0) || f.rtt < 0 || f.prefillTPS < 0 {
		errs = append(errs, errors.New("--link-gbps, --rtt and --prefill-tps must not be negative"))
	}
	p, err := loadProfiles(f.profiles, nil, nil)
	errs = append(errs, err)
	model, err := p.Model(f.model)
	errs = append(errs, err)
	var curve cost.Prefill
	if f.prefillTPS > 0 {
		c, err := cost.NewCurve(f.model, f.accelerator, []cost.Point{{Tokens: max(f.tokens, 1), TokensPerSecond: f.prefillTPS}})
		errs, curve = append(errs, err), &c
	} else if c, err := p.Curve(f.model, f.accelerator); err != nil {
		errs = append(errs, fmt.Errorf("%w (or give --prefill-tps)", err))
	} else {
		curve = c
	}
	if err := errors.Join(errs...); err != nil {
		return usageError{error: err}
	}
	// Blocks of one token: the plan's split may fall anywhere.
	req := &cost.Request{
		KVBytesPerToken: model.KVBytesPerToken(), BlockTokens: 1, ChainBlocks: f.tokens, Nominal: curve,
		Nodes: []cost.Node{
			{ID: "node", Candidate: true, Blocks: f.cached, Prefill: curve},
			{ID: "pool", Blocks: f.tokens},
		},
	}
	if f.linkGBps > 0 {
		req.Link = func(string, string) cost.Link { return cost.Link{BytesPerSecond: f.linkGBps * 1e9, RTT: f.rtt} }
	}
	res, err := cost.Plan(req)
	if err != nil {
		return err
	}
	np := res.Winner()
	out := map[string]any{
		"model": f.model, "accelerator": f.accelerator, "tokens": f.tokens, "cached_tokens": f.cached,
		"kv_bytes_per_token": res.KVBytesPerToken, "kv_bytes": res.KVBytesPerToken * float64(f.tokens),
		"prefill_tokens_per_s": res.PrefillTokensPerSecond, "breakeven_gbps": res.BreakevenBytesPerSecond / 1e9,
		"recompute_ms": ms(np.Recompute),
	}
	if f.linkGBps > 0 {
		out["link_gbps"], out["rtt_ms"] = f.linkGBps, ms(f.rtt)
		out["fetch_ms"], out["fetch_total_ms"] = ms(np.Transfer), ms(np.FetchTotal)
		out["split_tokens"], out["split_ms"] = np.SplitBlocks, ms(np.SplitTotal)
		out["plan"], out["total_ms"] = np.Plan.String(), ms(np.Total)
		out["fetch_speedup"] = np.Recompute.Seconds() / np.Total.Seconds()
	}
	if f.cf.asJSON {
		return printJSON(e.stdout, out)
	}
	w := e.stdout
	fmt.Fprintf(w, "model %s on %s, %d-token prompt (%d cached)\n", f.model, f.accelerator, f.tokens, f.cached)
	fmt.Fprintf(w, "  KV per token        %.0f B (%s for the prompt)\n", res.KVBytesPerToken, humanBytes(uint64(res.KVBytesPerToken*float64(f.tokens))))
	fmt.Fprintf(w, "  prefill speed       %.0f tokens/s\n", res.PrefillTokensPerSecond)
	fmt.Fprintf(w, "  break-even B*       %.2f GB/s: slower links lose to recompute\n", res.BreakevenBytesPerSecond/1e9)
	fmt.Fprintf(w, "  recompute           %.2f ms\n", ms(np.Recompute))
	if f.linkGBps > 0 {
		fmt.Fprintf(w, "  fetch at %.2f GB/s  %.2f ms transfer, %.2f ms in all\n", f.linkGBps, ms(np.Transfer), ms(np.FetchTotal))
		fmt.Fprintf(w, "  split               compute %d tokens while the rest loads: %.2f ms\n", np.SplitBlocks-f.cached, ms(np.SplitTotal))
		fmt.Fprintf(w, "  plan                %s, %.2f ms\n", np.Plan, ms(np.Total))
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// live asks a node to plan the chain against the cluster.
func (f *planFlags) live(cmd *cobra.Command, e *env) error {
	var errs []error
	errs = append(errs, f.cf.checkNames())
	chain, promptTokens, err := f.chain.chain(e, &f.cf)
	errs = append(errs, err)
	if f.prompt > 0 {
		promptTokens = f.prompt
	}
	if f.linkGBps < 0 || math.IsNaN(f.linkGBps) || math.IsInf(f.linkGBps, 0) {
		errs = append(errs, fmt.Errorf("--link-gbps %v: want a non-negative number", f.linkGBps))
	}
	for _, flag := range []string{"accelerator", "tokens", "cached-tokens", "rtt", "prefill-tps", "profiles"} {
		if cmd.Flags().Changed(flag) {
			errs = append(errs, fmt.Errorf("--%s applies without --server only; the node plans with its own profiles", flag))
		}
	}
	if err := errors.Join(errs...); err != nil {
		var u usageError
		if errors.As(err, &u) && len(errs) == 1 {
			return err
		}
		return usageError{error: err}
	}
	// With --keys and no --block-tokens, and no --model, the node's
	// defaults apply.
	blockTokens, model := uint32(f.chain.blockTokens), f.model
	if f.chain.tokensFile == "" && !cmd.Flags().Changed("block-tokens") {
		blockTokens = 0
	}
	if !cmd.Flags().Changed("model") {
		model = ""
	}
	return f.cf.withClient(cmd, func(ctx context.Context, c *api.Client) error {
		resp, err := c.Plan(ctx, &kvpoolv1.PlanRequest{
			Tenant: f.cf.tenant, Namespace: f.cf.namespace, Keys: chain, Model: model,
			BlockTokens: blockTokens, PromptTokens: uint64(promptTokens),
			LinkBytesPerSecond: f.linkGBps * 1e9, Candidates: f.candidates,
		})
		if err != nil {
			return err
		}
		if f.cf.asJSON {
			return printJSON(e.stdout, planJSON(resp))
		}
		printPlan(e.stdout, resp)
		return nil
	})
}

func planJSON(r *kvpoolv1.PlanResponse) map[string]any {
	s := r.GetSummary()
	nodes := []map[string]any{}
	for _, n := range r.GetNodes() {
		nodes = append(nodes, nodePlanJSON(n))
	}
	out := map[string]any{
		"answered_by": s.GetAnsweredBy(), "model": s.GetModel(), "kv_bytes_per_token": s.GetKvBytesPerToken(),
		"block_tokens": s.GetBlockTokens(), "chain_blocks": s.GetChainBlocks(), "prompt_tokens": s.GetPromptTokens(),
		"reference_accelerator": s.GetReferenceAccelerator(), "prefill_tokens_per_s": s.GetPrefillTokensPerSecond(),
		"breakeven_gbps": s.GetBreakevenBytesPerSecond() / 1e9, "nodes": nodes,
	}
	if len(r.GetNodes()) > 0 {
		out["winner"], out["winner_plan"] = r.GetNodes()[0].GetNodeId(), r.GetNodes()[0].GetPlan()
	}
	return out
}

func nodePlanJSON(n *kvpoolv1.NodePlan) map[string]any {
	secMs := func(s float64) float64 { return s * 1e3 }
	gbps := func(b float64) any {
		if math.IsInf(b, 1) {
			return "inf"
		}
		return b / 1e9
	}
	return map[string]any{
		"node": n.GetNodeId(), "accelerator": n.GetAccelerator(), "prefill_tokens_per_s": n.GetPrefillTokensPerSecond(),
		"queue_ms": secMs(n.GetQueueSeconds()), "local_blocks": n.GetLocalBlocks(), "pool_blocks": n.GetPoolBlocks(),
		"source": n.GetSource(), "link_gbps": n.GetLinkBytesPerSecond() / 1e9, "link_rtt_ms": secMs(n.GetLinkRttSeconds()),
		"link_measured": n.GetLinkMeasured(), "fetch_bytes": n.GetFetchBytes(), "fetch_ms": secMs(n.GetTransferSeconds()),
		"recompute_ms": secMs(n.GetRecomputeSeconds()), "remainder_ms": secMs(n.GetRemainderSeconds()),
		"recompute_total_ms": secMs(n.GetRecomputeTotalSeconds()), "fetch_total_ms": secMs(n.GetFetchTotalSeconds()),
		"split_blocks": n.GetSplitBlocks(), "split_total_ms": secMs(n.GetSplitTotalSeconds()),
		"plan": n.GetPlan(), "total_ms": secMs(n.GetTotalSeconds()), "breakeven_gbps": gbps(n.GetBreakevenBytesPerSecond()),
	}
}

func printPlan(w io.Writer, r *kvpoolv1.PlanResponse) {
	s := r.GetSummary()
	fmt.Fprintf(w, "%s, %d-token prompt (%d blocks of %d), KV %.0f B/token; prefill %.0f tokens/s on %s, B* %.2f GB/s\n",
		s.GetModel(), s.GetPromptTokens(), s.GetChainBlocks(), s.GetBlockTokens(), s.GetKvBytesPerToken(),
		s.GetPrefillTokensPerSecond(), s.GetReferenceAccelerator(), s.GetBreakevenBytesPerSecond()/1e9)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tQUEUE ms\tLOCAL\tPOOL\tSOURCE\tLINK GB/s\tFETCH ms\tRECOMPUTE ms\tPLAN\tTOTAL ms")
	for _, n := range r.GetNodes() {
		link, fetch := "-", "-"
		if n.GetSource() != "" {
			link = fmt.Sprintf("%.2f", n.GetLinkBytesPerSecond()/1e9)
			if !n.GetLinkMeasured() {
				link += "*"
			}
			fetch = fmt.Sprintf("%.2f", n.GetTransferSeconds()*1e3)
		}
		plan := n.GetPlan()
		if plan == "split" {
			plan = fmt.Sprintf("split@%d", n.GetSplitBlocks())
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%d\t%d\t%s\t%s\t%s\t%.2f\t%s\t%.2f\n", n.GetNodeId(), n.GetQueueSeconds()*1e3,
			n.GetLocalBlocks(), n.GetPoolBlocks(), dash(n.GetSource()), link, fetch, n.GetRecomputeSeconds()*1e3, plan, n.GetTotalSeconds()*1e3)
	}
	tw.Flush()
	if len(r.GetNodes()) > 0 {
		win := r.GetNodes()[0]
		fmt.Fprintf(w, "winner: %s, %s, %.2f ms", win.GetNodeId(), win.GetPlan(), win.GetTotalSeconds()*1e3)
		if len(r.GetNodes()) > 1 {
			fmt.Fprintf(w, " (next: %s, %.2f ms)", r.GetNodes()[1].GetNodeId(), r.GetNodes()[1].GetTotalSeconds()*1e3)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "* link not measured yet: the configured seed, or --link-gbps")
}
