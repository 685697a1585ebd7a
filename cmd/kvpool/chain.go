package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/transfer/cost"
)

// chainCmd is the chain noun. Given flags and no verb it computes keys, as
// the "chain" verb of the previous release did.
func chainCmd(e *env) *cobra.Command {
	c := chainKeysCmd(e)
	c.Use, c.Short = "chain", "Compute a prompt's prefix-chain keys, and plan where its KV should come from"
	keys := c.RunE
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if cmd.Flags().NFlag() == 0 {
			return usagef("chain needs a verb: keys or plan")
		}
		fmt.Fprintln(e.stderr, `kvpool: "kvpool chain" with flags is now "kvpool chain keys"; the old form goes in the next release`)
		return keys(cmd, args)
	}
	c.Example = ""
	c.AddCommand(chainKeysCmd(e), chainPlanCmd(e))
	return c
}

type chainKeysJSON struct {
	Scheme      string   `json:"scheme"`
	BlockTokens int      `json:"block_tokens"`
	Tokens      int      `json:"tokens"`
	Keys        []string `json:"keys"`
}

func chainKeysCmd(e *env) *cobra.Command {
	var f chainFlags
	var csv, asJSON bool
	c := &cobra.Command{
		Use:   "keys",
		Short: "Compute the prefix-chain keys of a token sequence",
		Long: `keys cuts a token sequence into blocks of --block-tokens and prints one key per
full block, block 0 first, in hex. Tokens are integers separated by spaces,
commas or newlines, read from --tokens-file or stdin.

--scheme sha256_cbor reproduces vLLM's prefix_caching_hash_algo=sha256_cbor
with --seed set to the engine's PYTHONHASHSEED; --scheme sha256 is kvpool's
own fixed-width encoding.`,
		Example: `  echo 1 2 3 4 5 6 7 8 | kvpool chain keys --block-tokens 4 --scheme sha256_cbor --seed 0`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			keys, tokens, err := f.hashTokens(e)
			if err != nil {
				return err
			}
			hexKeys := make([]string, len(keys))
			for i, k := range keys {
				hexKeys[i] = hex.EncodeToString(k)
			}
			switch {
			case asJSON:
				return printJSON(e.stdout, chainKeysJSON{Scheme: f.scheme, BlockTokens: f.blockTokens, Tokens: tokens, Keys: hexKeys})
			case csv:
				fmt.Fprintln(e.stdout, strings.Join(hexKeys, ","))
			default:
				for _, k := range hexKeys {
					fmt.Fprintln(e.stdout, k)
				}
			}
			return nil
		},
	}
	f.registerTokens(c, "file of token ids (default stdin)")
	c.Flags().BoolVar(&csv, "csv", false, "print the keys on one comma-separated line (for --keys)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
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

func chainPlanCmd(e *env) *cobra.Command {
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
		Example: `  kvpool chain plan --model llama3-8b --tokens 4096 --accelerator h200 --json
  kvpool chain plan --model llama3-70b --tokens 8192 --link-gbps 3.2
  kvpool chain plan --server 127.0.0.1:7070 --tenant acme --namespace llama3-8b --tokens-file prompt.txt --block-tokens 16`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("server") {
				return f.live(cmd, e)
			}
			return f.offline(e)
		},
	}
	fl := c.Flags()
	f.cf.register(c, true, 30*time.Second)
	f.chain.register(c)
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

// offlinePlanJSON is the --json shape of a plan from profiles alone; the
// link fields come with --link-gbps.
type offlinePlanJSON struct {
	Model                  string   `json:"model"`
	Accelerator            string   `json:"accelerator"`
	Tokens                 int      `json:"tokens"`
	CachedTokens           int      `json:"cached_tokens"`
	KVBytesPerToken        float64  `json:"kv_bytes_per_token"`
	KVBytes                float64  `json:"kv_bytes"`
	PrefillTokensPerSecond float64  `json:"prefill_tokens_per_s"`
	BreakevenGBps          float64  `json:"breakeven_gbps"`
	RecomputeMs            float64  `json:"recompute_ms"`
	LinkGBps               *float64 `json:"link_gbps,omitempty"`
	RTTMs                  *float64 `json:"rtt_ms,omitempty"`
	FetchMs                *float64 `json:"fetch_ms,omitempty"`
	FetchTotalMs           *float64 `json:"fetch_total_ms,omitempty"`
	SplitTokens            *int     `json:"split_tokens,omitempty"`
	SplitMs                *float64 `json:"split_ms,omitempty"`
	Plan                   string   `json:"plan,omitempty"`
	TotalMs                *float64 `json:"total_ms,omitempty"`
	FetchSpeedup           *float64 `json:"fetch_speedup,omitempty"`
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
	p, err := loadProfiles(f.profiles, cost.Document{})
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
		return usage(err)
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
	out := offlinePlanJSON{
		Model: f.model, Accelerator: f.accelerator, Tokens: f.tokens, CachedTokens: f.cached,
		KVBytesPerToken: res.KVBytesPerToken, KVBytes: res.KVBytesPerToken * float64(f.tokens),
		PrefillTokensPerSecond: res.PrefillTokensPerSecond, BreakevenGBps: res.BreakevenBytesPerSecond / 1e9,
		RecomputeMs: ms(np.Recompute),
	}
	if f.linkGBps > 0 {
		num := func(v float64) *float64 { return &v }
		out.LinkGBps, out.RTTMs = num(f.linkGBps), num(ms(f.rtt))
		out.FetchMs, out.FetchTotalMs = num(ms(np.Transfer)), num(ms(np.FetchTotal))
		out.SplitTokens, out.SplitMs = &np.SplitBlocks, num(ms(np.SplitTotal))
		out.Plan, out.TotalMs = np.Plan.String(), num(ms(np.Total))
		out.FetchSpeedup = num(np.Recompute.Seconds() / np.Total.Seconds())
	}
	if f.cf.asJSON {
		return printJSON(e.stdout, out)
	}
	w := e.stdout
	fmt.Fprintf(w, "model %s on %s, %d-token prompt (%d cached)\n", f.model, f.accelerator, f.tokens, f.cached)
	fmt.Fprintf(w, "  KV per token        %.0f B (%s for the prompt)\n", res.KVBytesPerToken, humanBytes(uint64(out.KVBytes)))
	fmt.Fprintf(w, "  prefill speed       %.0f tokens/s\n", res.PrefillTokensPerSecond)
	fmt.Fprintf(w, "  break-even B*       %.2f GB/s: slower links lose to recompute\n", out.BreakevenGBps)
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
	keys, promptTokens, err := f.chain.chain(e, &f.cf)
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
		return usage(err)
	}
	// With --keys and no --block-tokens, and no --model, the node's
	// defaults apply.
	req := api.PlanRequest{Tenant: f.cf.tenant, Namespace: f.cf.namespace, Keys: keys, Model: f.model, BlockTokens: f.chain.blockTokens,
		PromptTokens: promptTokens, LinkBytesPerSecond: f.linkGBps * 1e9, Candidates: f.candidates}
	if f.chain.tokensFile == "" && !cmd.Flags().Changed("block-tokens") {
		req.BlockTokens = 0
	}
	if !cmd.Flags().Changed("model") {
		req.Model = ""
	}
	return f.cf.withClient(cmd, func(ctx context.Context, c *api.Client) error {
		p, err := c.Plan(ctx, req)
		if err != nil {
			return err
		}
		if f.cf.asJSON {
			return printJSON(e.stdout, newPlanJSON(&p))
		}
		printPlan(e.stdout, &p)
		return nil
	})
}

// planJSON is the --json shape of a live plan.
type planJSON struct {
	AnsweredBy             string         `json:"answered_by"`
	Model                  string         `json:"model"`
	KVBytesPerToken        float64        `json:"kv_bytes_per_token"`
	BlockTokens            int            `json:"block_tokens"`
	ChainBlocks            int            `json:"chain_blocks"`
	PromptTokens           int            `json:"prompt_tokens"`
	ReferenceAccelerator   string         `json:"reference_accelerator"`
	PrefillTokensPerSecond float64        `json:"prefill_tokens_per_s"`
	BreakevenGBps          float64        `json:"breakeven_gbps"`
	Nodes                  []nodePlanJSON `json:"nodes"`
	Winner                 string         `json:"winner,omitempty"`
	WinnerPlan             string         `json:"winner_plan,omitempty"`
}

type nodePlanJSON struct {
	Node                   string  `json:"node"`
	Accelerator            string  `json:"accelerator"`
	PrefillTokensPerSecond float64 `json:"prefill_tokens_per_s"`
	QueueMs                float64 `json:"queue_ms"`
	LocalBlocks            int     `json:"local_blocks"`
	PoolBlocks             int     `json:"pool_blocks"`
	Source                 string  `json:"source"`
	LinkGBps               float64 `json:"link_gbps"`
	LinkRTTMs              float64 `json:"link_rtt_ms"`
	LinkMeasured           bool    `json:"link_measured"`
	FetchBytes             float64 `json:"fetch_bytes"`
	FetchMs                float64 `json:"fetch_ms"`
	RecomputeMs            float64 `json:"recompute_ms"`
	RemainderMs            float64 `json:"remainder_ms"`
	RecomputeTotalMs       float64 `json:"recompute_total_ms"`
	FetchTotalMs           float64 `json:"fetch_total_ms"`
	SplitBlocks            int     `json:"split_blocks"`
	SplitTotalMs           float64 `json:"split_total_ms"`
	Plan                   string  `json:"plan"`
	TotalMs                float64 `json:"total_ms"`
	// BreakevenGBps is a number, or "inf" when fetching never wins.
	BreakevenGBps any `json:"breakeven_gbps"`
}

func newPlanJSON(p *api.Plan) planJSON {
	out := planJSON{AnsweredBy: p.AnsweredBy, Model: p.Model, KVBytesPerToken: p.KVBytesPerToken, BlockTokens: p.BlockTokens,
		ChainBlocks: p.ChainBlocks, PromptTokens: p.PromptTokens, ReferenceAccelerator: p.ReferenceAccelerator,
		PrefillTokensPerSecond: p.PrefillTokensPerSecond, BreakevenGBps: p.BreakevenBytesPerSecond / 1e9, Nodes: []nodePlanJSON{}}
	for _, n := range p.Nodes {
		var breakeven any = n.BreakevenBytesPerSecond / 1e9
		if math.IsInf(n.BreakevenBytesPerSecond, 1) {
			breakeven = "inf"
		}
		out.Nodes = append(out.Nodes, nodePlanJSON{
			Node: n.Node, Accelerator: n.Accelerator, PrefillTokensPerSecond: n.PrefillTokensPerSecond, QueueMs: ms(n.Queue),
			LocalBlocks: n.LocalBlocks, PoolBlocks: n.PoolBlocks, Source: n.Source, LinkGBps: n.LinkBytesPerSecond / 1e9,
			LinkRTTMs: ms(n.LinkRTT), LinkMeasured: n.LinkMeasured, FetchBytes: n.FetchBytes, FetchMs: ms(n.Transfer),
			RecomputeMs: ms(n.Recompute), RemainderMs: ms(n.Remainder), RecomputeTotalMs: ms(n.RecomputeTotal),
			FetchTotalMs: ms(n.FetchTotal), SplitBlocks: n.SplitBlocks, SplitTotalMs: ms(n.SplitTotal), Plan: n.Plan,
			TotalMs: ms(n.Total), BreakevenGBps: breakeven,
		})
	}
	if len(p.Nodes) > 0 {
		out.Winner, out.WinnerPlan = p.Nodes[0].Node, p.Nodes[0].Plan
	}
	return out
}

func printPlan(w io.Writer, p *api.Plan) {
	fmt.Fprintf(w, "%s, %d-token prompt (%d blocks of %d), KV %.0f B/token; prefill %.0f tokens/s on %s, B* %.2f GB/s\n",
		p.Model, p.PromptTokens, p.ChainBlocks, p.BlockTokens, p.KVBytesPerToken,
		p.PrefillTokensPerSecond, p.ReferenceAccelerator, p.BreakevenBytesPerSecond/1e9)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tQUEUE ms\tLOCAL\tPOOL\tSOURCE\tLINK GB/s\tFETCH ms\tRECOMPUTE ms\tPLAN\tTOTAL ms")
	for _, n := range p.Nodes {
		link, fetch := "-", "-"
		if n.Source != "" {
			link = fmt.Sprintf("%.2f", n.LinkBytesPerSecond/1e9)
			if !n.LinkMeasured {
				link += "*"
			}
			fetch = fmt.Sprintf("%.2f", ms(n.Transfer))
		}
		plan := n.Plan
		if plan == "split" {
			plan = fmt.Sprintf("split@%d", n.SplitBlocks)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%d\t%d\t%s\t%s\t%s\t%.2f\t%s\t%.2f\n", n.Node, ms(n.Queue),
			n.LocalBlocks, n.PoolBlocks, dash(n.Source), link, fetch, ms(n.Recompute), plan, ms(n.Total))
	}
	tw.Flush()
	if len(p.Nodes) > 0 {
		win := p.Nodes[0]
		fmt.Fprintf(w, "winner: %s, %s, %.2f ms", win.Node, win.Plan, ms(win.Total))
		if len(p.Nodes) > 1 {
			fmt.Fprintf(w, " (next: %s, %.2f ms)", p.Nodes[1].Node, ms(p.Nodes[1].Total))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "* link not measured yet: the configured seed, or --link-gbps")
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
