package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/transfer/cost"
	"github.com/kvpool/kvpool/transfer/sim"
)

// simOptions are kvpool sim's flags: one simulated cluster, or a grid of
// them with --sweep.
type simOptions struct {
	trace       string
	nodes       int
	model       string
	accelerator string
	linkGbps    float64
	timeScale   float64
	blockTokens int
	policies    []string
	seed        uint64
	json        bool
	sweeps      []string
	plot        string
	plotFrom    []string
	profiles    []string
	progress    string

	// The engine: zero takes the model's serving profile.
	gpus         int
	weightsGB    float64
	hbmGB        float64
	hbmTBps      float64
	memFraction  float64
	h2dGBps      float64
	maxBatch     int
	stepOverhead float64 // ms

	// The pool.
	hostGB       float64
	routerSees   string
	gpuPolicy    string
	hostPolicy   string
	rttUS        float64
	fetchFixedMS float64
}

// registerShared adds the flags kvpool sim and kvpool replay share: the
// trace, the cluster, the engine and the pool.
func (o *simOptions) registerShared(fl *pflag.FlagSet) {
	fl.StringVar(&o.trace, "trace", "", "the trace: Mooncake JSON Lines (timestamp ms, input_length, output_length, hash_ids); required")
	fl.IntVar(&o.nodes, "nodes", 8, "engine nodes")
	fl.StringVar(&o.model, "model", "llama3-8b", "model profile (llama3-8b, llama3-70b, deepseek-v3, llama3-8b-sparse8, or one from --profiles)")
	fl.StringVar(&o.accelerator, "accelerator", "h200", "accelerator whose prefill curve and memory the engines have")
	fl.Float64Var(&o.linkGbps, "link-gbps", 100, "each node's network bandwidth into it, in Gbit/s (10^9 bits per second), shared by the fetches it receives")
	fl.Float64Var(&o.timeScale, "time-scale", 1, "divide the trace's inter-arrival times by this: 2 is twice the load")
	fl.IntVar(&o.blockTokens, "block-tokens", 512, "tokens per hash id in the trace (512 in Mooncake's)")
	fl.Uint64Var(&o.seed, "seed", 1, "seed that breaks ties between equally good nodes")
	fl.StringSliceVar(&o.profiles, "profiles", nil, "extra model profiles and prefill curves (YAML/JSON, or a GPU anchor document); repeatable")
	fl.StringVar(&o.progress, "progress", "auto", "progress bar on stderr: auto (when stderr is a terminal), always, never")
	fl.IntVar(&o.gpus, "gpus-per-engine", 0, "GPUs per engine, tensor parallel; prefill and decode scale ideally (0: the model's serving profile: 1 for 8B, 2 for 70B, 8 for DeepSeek-V3)")
	fl.Float64Var(&o.weightsGB, "weights-gb", 0, "the model's weights across the engine, GB (0: the serving profile's)")
	fl.Float64Var(&o.hbmGB, "hbm-gb", 0, "one GPU's memory, GB (0: the accelerator's; 141 on an H200)")
	fl.Float64Var(&o.hbmTBps, "hbm-tbps", 0, "one GPU's memory bandwidth, TB/s, for the decode roofline (0: the accelerator's; 4.8 on an H200)")
	fl.Float64Var(&o.memFraction, "mem-fraction", 0.9, "share of GPU memory for weights and KV (vLLM's gpu_memory_utilization)")
	fl.Float64Var(&o.h2dGBps, "h2d-gbps", 0, "host-to-GPU copy rate of pinned memory, GB/s (0: the accelerator's; 54.46 measured on an H200)")
	fl.IntVar(&o.maxBatch, "max-batch", 256, "most sequences an engine decodes at once")
	fl.Float64Var(&o.stepOverhead, "step-overhead-ms", 0, "what a decode step costs beyond its memory traffic, ms")
	fl.Float64Var(&o.hostGB, "host-gb", 200, "each node's kvpool host tier, GB (0: none; then only GPU caches reuse)")
	fl.StringVar(&o.routerSees, "router-sees", routerSeesAll, "what the router knows of each node's cache: gpu+host (the engines' GPU caches from their KV events, and kvpool's host tier) or host (kvpool's host tier only, as without KV events)")
	fl.StringVar(&o.gpuPolicy, "gpu-policy", "lru", "eviction policy of the GPU prefix caches")
	fl.StringVar(&o.hostPolicy, "host-policy", "lru", "eviction policy of the host tiers")
	fl.Float64Var(&o.rttUS, "rtt-us", 20, "network round trip, µs, paid once per fetch")
	fl.Float64Var(&o.fetchFixedMS, "fetch-fixed-ms", 0.53, "what one fetch costs beyond its bytes and the round trip, ms (the call, pin, reserve, commit, publish): the intercept of kvpool node bench --remote's p50 per Fetch against its bytes, over chains of 4, 16 and 64 2-MiB blocks")
}

func (o *simOptions) register(fl *pflag.FlagSet) {
	o.registerShared(fl)
	fl.StringSliceVar(&o.policies, "policies", nil, "routing policies to compare: round-robin, least-loaded, affinity, cost, pool, pool-split, oracle (default all)")
	fl.BoolVar(&o.json, "json", false, "print one JSON object per run (policy × grid point) in an array")
	fl.StringArrayVar(&o.sweeps, "sweep", nil, "vary a parameter: NAME=V1,V2,... with NAME one of link-gbps, model, time-scale, nodes, host-gb, seed, router-sees; repeatable (the grid is every combination)")
	fl.StringVar(&o.plot, "plot", "", "write PNG plots to this directory: TTFT p90 against link bandwidth per policy (per model), and against KV bytes per token")
	fl.StringSliceVar(&o.plotFrom, "plot-from", nil, "with --plot: plot the runs in these files (what --json printed) instead of simulating; repeatable, so runs at different time scales share the plots")
}

func simCmd(e *env) *cobra.Command {
	o := &simOptions{}
	c := &cobra.Command{
		Use:   "sim --trace FILE [flags]",
		Short: "Simulate a serving cluster over a trace and compare routing policies",
		Long: `sim replays a trace through a simulated cluster of engines, once per routing
policy, and reports each policy's time to first token (p50, p90, p99), time per
output token, throughput, and where the prompts' KV came from: computed, reused
from a GPU cache, loaded from the node's kvpool host tier, or fetched from
another node's.

The simulator is deterministic: the same flags give the same numbers. It uses
kvpool's own cost model (prefill curves, the fetch/recompute/split planner) and
eviction policies. Each engine prefills first (no chunked prefill) and decodes
with continuous batching: a step reads the weights and the batch's KV once, at
the GPU's memory bandwidth (the roofline). A request reserves its whole KV
(prompt and answer) when it starts, so none is preempted.

Policies: round-robin; least-loaded (least queued prefill); affinity (longest
cached prefix, then least loaded); cost (queue + what the node's own caches
leave to prefill); pool (cost, and any node may fetch from another's host
tier); pool-split (pool with the split plan: compute the head of the missing
prefix while its tail loads); oracle (every prefix ever computed is on every
node for free: a bound no policy beats).

Bandwidth units: --link-gbps is Gbit/s; --hbm-tbps, --h2d-gbps are bytes.`,
		Example: `  kvpool sim --trace conversation_trace.jsonl --nodes 8 --model llama3-8b --link-gbps 100 --time-scale 4
  kvpool sim --trace conversation_trace.jsonl --time-scale 4 --sweep link-gbps=10,25,100,400 --json
  kvpool sim --trace conversation_trace.jsonl --time-scale 4 --sweep link-gbps=1,10,25,100,400 \
      --sweep model=llama3-8b,llama3-70b,deepseek-v3,llama3-8b-sparse8 --plot plots/`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSim(e, o)
		},
	}
	o.register(c.Flags())
	return c
}

// simPoint is one point of the grid.
type simPoint struct {
	seed      uint64
	model     string
	linkGbps  float64
	timeScale float64
	nodes     int
	hostGB    float64
	// routerSees is routerSeesAll or routerSeesHost.
	routerSees string
}

// Values of --router-sees.
const (
	routerSeesAll  = "gpu+host"
	routerSeesHost = "host"
)

// simRow is one run's report: the --json shape.
type simRow struct {
	Model           string  `json:"model"`
	Accelerator     string  `json:"accelerator"`
	KVBytesPerToken float64 `json:"kv_bytes_per_token"`
	Nodes           int     `json:"nodes"`
	LinkGbps        float64 `json:"link_gbps"`
	TimeScale       float64 `json:"time_scale"`
	HostGB          float64 `json:"host_gb"`
	RouterSees      string  `json:"router_sees"`
	Seed            uint64  `json:"seed"`
	Policy          string  `json:"policy"`
	Requests        int     `json:"requests"`
	TTFTP50         float64 `json:"ttft_p50_s"`
	TTFTP90         float64 `json:"ttft_p90_s"`
	TTFTP99         float64 `json:"ttft_p99_s"`
	TTFTMean        float64 `json:"ttft_mean_s"`
	TPOTP50         float64 `json:"tpot_p50_s"`
	TPOTP90         float64 `json:"tpot_p90_s"`
	TPOTMean        float64 `json:"tpot_mean_s"`
	OutputTPS       float64 `json:"output_tokens_per_s"`
	RequestsPerS    float64 `json:"requests_per_s"`
	MakespanS       float64 `json:"makespan_s"`
	InputTokens     int     `json:"input_tokens"`
	Computed        int     `json:"computed_tokens"`
	Reused          int     `json:"reused_tokens"`
	FromHost        int     `json:"host_tokens"`
	Fetched         int     `json:"fetched_tokens"`
	GPUHit          float64 `json:"gpu_hit_ratio"`
	HostHit         float64 `json:"host_hit_ratio"`
	PoolHit         float64 `json:"pool_hit_ratio"`
	NetworkBytes    float64 `json:"network_bytes"`
	HostToGPUBytes  float64 `json:"host_to_gpu_bytes"`
	Fetches         int     `json:"fetches"`
	FetchesFailed   int     `json:"fetches_failed"`
	GPUStored       int     `json:"gpu_stored_blocks"`
	GPUEvicted      int     `json:"gpu_evicted_blocks"`
}

func newSimRow(p simPoint, accelerator string, kv float64, r *sim.Result) simRow {
	return simRow{
		Model: p.model, Accelerator: accelerator, KVBytesPerToken: kv, Nodes: p.nodes, LinkGbps: p.linkGbps,
		TimeScale: p.timeScale, HostGB: p.hostGB, RouterSees: p.routerSees, Seed: p.seed, Policy: r.Policy, Requests: r.Requests,
		TTFTP50: r.TTFT.P50, TTFTP90: r.TTFT.P90, TTFTP99: r.TTFT.P99, TTFTMean: r.TTFT.Mean,
		TPOTP50: r.TPOT.P50, TPOTP90: r.TPOT.P90, TPOTMean: r.TPOT.Mean,
		OutputTPS: r.OutputTokensPerS, RequestsPerS: r.RequestsPerS, MakespanS: r.MakespanS,
		InputTokens: r.InputTokens, Computed: r.ComputedTokens, Reused: r.ReusedTokens, FromHost: r.HostTokens, Fetched: r.FetchedTokens,
		GPUHit: r.GPUHitRatio, HostHit: r.HostHitRatio, PoolHit: r.PoolHitRatio,
		NetworkBytes: r.NetworkBytes, HostToGPUBytes: r.HostToGPUBytes, Fetches: r.Fetches, FetchesFailed: r.FetchesFailed,
		GPUStored: r.GPUStored, GPUEvicted: r.GPUEvicted,
	}
}

// grid expands the sweeps into points, first sweep outermost.
func (o *simOptions) grid() ([]simPoint, error) {
	points := []simPoint{{seed: o.seed, model: o.model, linkGbps: o.linkGbps, timeScale: o.timeScale, nodes: o.nodes, hostGB: o.hostGB, routerSees: o.routerSees}}
	seen := map[string]bool{}
	var errs []error
	reported := map[string]bool{} // a bad value is reported once, not per point
	for _, s := range o.sweeps {
		name, list, ok := strings.Cut(s, "=")
		if !ok || list == "" {
			errs = append(errs, fmt.Errorf("--sweep %q: want NAME=V1,V2,...", s))
			continue
		}
		if seen[name] {
			errs = append(errs, fmt.Errorf("--sweep %s given twice", name))
			continue
		}
		seen[name] = true
		var next []simPoint
		values := strings.Split(list, ",")
		for _, p := range points {
			for _, v := range values {
				v = strings.TrimSpace(v)
				q := p
				var err error
				switch name {
				case "model":
					q.model = v
				case "link-gbps":
					q.linkGbps, err = strconv.ParseFloat(v, 64)
				case "time-scale":
					q.timeScale, err = strconv.ParseFloat(v, 64)
				case "host-gb":
					q.hostGB, err = strconv.ParseFloat(v, 64)
				case "nodes":
					q.nodes, err = strconv.Atoi(v)
				case "seed":
					q.seed, err = strconv.ParseUint(v, 10, 64)
				case "router-sees":
					q.routerSees, err = v, checkRouterSees(v)
				default:
					err = errors.New("unknown parameter (want link-gbps, model, time-scale, nodes, host-gb, seed or router-sees)")
				}
				if err != nil {
					if msg := fmt.Sprintf("--sweep %s=%s: %v", name, v, err); !reported[msg] {
						reported[msg] = true
						errs = append(errs, errors.New(msg))
					}
					continue
				}
				next = append(next, q)
			}
		}
		points = next
	}
	return points, errors.Join(errs...)
}

// simSetup is everything a run needs besides its point.
type simSetup struct {
	o        *simOptions
	profiles *cost.Profiles
	policies []sim.Policy
	gpuKind  eviction.Kind
	hostKind eviction.Kind
}

// config builds the simulator's config for point p under policy pol.
func (s *simSetup) config(p simPoint, pol sim.Policy) (sim.Config, float64, error) {
	o := s.o
	m, err := s.profiles.Model(p.model)
	if err != nil {
		return sim.Config{}, 0, err
	}
	curve, err := s.profiles.Curve(p.model, o.accelerator)
	if err != nil {
		return sim.Config{}, 0, err
	}
	hw, err := sim.DefaultHardware(p.model, o.accelerator)
	if err != nil && (o.gpus == 0 || o.weightsGB == 0 || o.hbmGB == 0 || o.hbmTBps == 0 || o.h2dGBps == 0) {
		return sim.Config{}, 0, fmt.Errorf("%w (flags --gpus-per-engine, --weights-gb, --hbm-gb, --hbm-tbps, --h2d-gbps)", err)
	}
	if o.gpus > 0 {
		hw.GPUs = o.gpus
	}
	if o.weightsGB > 0 {
		hw.WeightsBytes = o.weightsGB * 1e9
	}
	if o.hbmGB > 0 {
		hw.HBMBytes = o.hbmGB * 1e9
	}
	if o.hbmTBps > 0 {
		hw.HBMBytesPerSecond = o.hbmTBps * 1e12
	}
	if o.h2dGBps > 0 {
		hw.HostToGPUBytesPerSecond = o.h2dGBps * 1e9
	}
	hw.MemoryFraction = o.memFraction
	kv := m.KVBytesPerToken()
	cfg := sim.Config{
		Nodes: p.nodes, Policy: pol, BlockTokens: o.blockTokens, MaxBatch: o.maxBatch,
		GPUPolicy: s.gpuKind, HostPolicy: s.hostKind,
		NetworkBytesPerSecond: p.linkGbps * 1e9 / 8, RTTS: o.rttUS * 1e-6, FetchFixedS: o.fetchFixedMS * 1e-3,
		Seed: p.seed,
	}
	cfg.Decode.StepOverheadS = o.stepOverhead * 1e-3
	if err := hw.Apply(&cfg, curve, kv); err != nil {
		return sim.Config{}, 0, fmt.Errorf("model %s: %w", p.model, err)
	}
	cfg.HostBlocks = int(p.hostGB * 1e9 / (kv * float64(o.blockTokens)))
	switch p.routerSees {
	case routerSeesAll:
	case routerSeesHost:
		cfg.RouterSeesHostOnly = true
	default:
		return sim.Config{}, 0, fmt.Errorf("--router-sees %q: want %s or %s", p.routerSees, routerSeesAll, routerSeesHost)
	}
	return cfg, kv, cfg.Validate()
}

func (o *simOptions) setup() (*simSetup, []simPoint, error) {
	var errs []error
	if o.trace == "" {
		errs = append(errs, errors.New("--trace is required"))
	}
	s := &simSetup{o: o}
	pols := o.policies
	if len(pols) == 0 {
		for _, p := range sim.Policies() {
			pols = append(pols, p.String())
		}
	}
	for _, name := range pols {
		p, err := sim.ParsePolicy(strings.TrimSpace(name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !slices.Contains(s.policies, p) {
			s.policies = append(s.policies, p)
		}
	}
	var err error
	if s.gpuKind, err = eviction.ParseKind(o.gpuPolicy); err != nil {
		errs = append(errs, fmt.Errorf("--gpu-policy: %w", err))
	}
	if s.hostKind, err = eviction.ParseKind(o.hostPolicy); err != nil {
		errs = append(errs, fmt.Errorf("--host-policy: %w", err))
	}
	if err := checkRouterSees(o.routerSees); err != nil {
		errs = append(errs, fmt.Errorf("--router-sees: %w", err))
	}
	switch o.progress {
	case "auto", "always", "never":
	default:
		errs = append(errs, fmt.Errorf("--progress %q: want auto, always or never", o.progress))
	}
	s.profiles, err = loadProfiles(o.profiles, sim.Profiles())
	errs = append(errs, err)
	points, err := o.grid()
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, nil, usage(err)
	}
	// Every point must make a valid config before anything runs.
	for _, p := range points {
		for _, pol := range s.policies {
			if _, _, err := s.config(p, pol); err != nil {
				errs = append(errs, fmt.Errorf("%s at %g Gbit/s, time scale %g, %d nodes, policy %s: %w", p.model, p.linkGbps, p.timeScale, p.nodes, pol, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, usage(err)
	}
	return s, points, nil
}

func runSim(e *env, o *simOptions) error {
	if len(o.plotFrom) > 0 {
		return replotSim(o)
	}
	s, points, err := o.setup()
	if err != nil {
		return err
	}
	traces := map[float64][]sim.Request{}
	for _, p := range points {
		if _, ok := traces[p.timeScale]; ok {
			continue
		}
		f, err := os.Open(o.trace)
		if err != nil {
			return usage(err)
		}
		reqs, err := sim.ParseTrace(f, sim.TraceConfig{TimeScale: p.timeScale, BlockTokens: o.blockTokens})
		f.Close()
		if err != nil {
			return usage(fmt.Errorf("%s: %w", o.trace, err))
		}
		traces[p.timeScale] = reqs
	}
	type run struct {
		point simPoint
		pol   sim.Policy
	}
	var runs []run
	total := 0
	for _, p := range points {
		for _, pol := range s.policies {
			runs = append(runs, run{p, pol})
			total += len(traces[p.timeScale])
		}
	}
	bar := newProgress(e.stderr, o.progress, total, len(runs))
	rows := make([]simRow, len(runs))
	errs := make([]error, len(runs))
	// Runs are independent and each is single-threaded: one per CPU.
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(runs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				r := runs[i]
				cfg, kv, err := s.config(r.point, r.pol)
				if err == nil {
					var res sim.Result
					res, err = sim.Run(cfg, traces[r.point.timeScale], bar.reporter(i))
					rows[i] = newSimRow(r.point, o.accelerator, kv, &res)
				}
				errs[i] = err
				bar.runDone()
			}
		}()
	}
	for i := range runs {
		work <- i
	}
	close(work)
	wg.Wait()
	bar.finish()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if o.plot != "" {
		if err := writeSimPlots(o.plot, rows); err != nil {
			return err
		}
	}
	if o.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	printSimTable(e.stdout, rows, len(traces[points[0].timeScale]))
	return nil
}

// replotSim draws --plot from saved --json output.
func replotSim(o *simOptions) error {
	if o.plot == "" {
		return usagef("--plot-from needs --plot DIR")
	}
	var rows []simRow
	for _, file := range o.plotFrom {
		b, err := os.ReadFile(file)
		if err != nil {
			return usage(err)
		}
		var rs []simRow
		if err := json.Unmarshal(b, &rs); err != nil {
			return usage(fmt.Errorf("%s: not kvpool sim --json output: %w", file, err))
		}
		rows = append(rows, rs...)
	}
	return writeSimPlots(o.plot, rows)
}

func printSimTable(w io.Writer, rows []simRow, requests int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%d requests; TTFT and TPOT in seconds; tokens as shares of all prompt tokens\n", requests)
	fmt.Fprintln(tw, "model\tGbit/s\tscale\tnodes\tpolicy\tTTFT p50\tp90\tp99\tTPOT mean\tout tok/s\tcomputed\tGPU hit\thost hit\tpool hit\tnet GB\tfetches\tfailed\t")
	for _, r := range rows {
		in := float64(max(r.InputTokens, 1))
		fmt.Fprintf(tw, "%s\t%g\t%g\t%d\t%s\t%.3f\t%.3f\t%.3f\t%.4f\t%.0f\t%.1f%%\t%.1f%%\t%.1f%%\t%.1f%%\t%.1f\t%d\t%d\t\n",
			r.Model, r.LinkGbps, r.TimeScale, r.Nodes, policyLabel(r), r.TTFTP50, r.TTFTP90, r.TTFTP99, r.TPOTMean, r.OutputTPS,
			100*float64(r.Computed)/in, 100*r.GPUHit, 100*r.HostHit, 100*r.PoolHit, r.NetworkBytes/1e9, r.Fetches, r.FetchesFailed)
	}
	tw.Flush()
}

func checkRouterSees(v string) error {
	if v != routerSeesAll && v != routerSeesHost {
		return fmt.Errorf("%q: want %s or %s", v, routerSeesAll, routerSeesHost)
	}
	return nil
}

// policyLabel names a row's policy, and says when its router saw only the
// host tiers.
func policyLabel(r simRow) string {
	if r.RouterSees == routerSeesHost {
		return r.Policy + " (host only)"
	}
	return r.Policy
}

// progress is the bar on stderr: requests simulated, over all runs.
type progress struct {
	mu          sync.Mutex
	w           io.Writer
	on          bool
	total       int
	perRun      []int // requests each run has finished
	runsDone    int
	lastPercent int
}

func newProgress(w io.Writer, mode string, total, runs int) *progress {
	on := mode == "always" || (mode == "auto" && isTerminal(w))
	return &progress{w: w, on: on, total: total, perRun: make([]int, runs), lastPercent: -1}
}

// reporter is run i's sim.Run progress callback (nil when the bar is
// off).
func (p *progress) reporter(i int) func(done, total int) {
	if !p.on {
		return nil
	}
	return func(done, _ int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.perRun[i] = done
		p.draw()
	}
}

func (p *progress) runDone() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runsDone++
	p.draw()
}

func (p *progress) draw() {
	if !p.on {
		return
	}
	done := 0
	for _, n := range p.perRun {
		done += n
	}
	pct := min(100, 100*done/max(p.total, 1))
	if pct == p.lastPercent && p.runsDone < len(p.perRun) {
		return
	}
	p.lastPercent = pct
	const width = 40
	n := width * pct / 100
	fmt.Fprintf(p.w, "\rsim [%s%s] %3d%%  %d/%d runs", strings.Repeat("=", n), strings.Repeat(" ", width-n), pct, p.runsDone, len(p.perRun))
}

func (p *progress) finish() {
	if p.on {
		fmt.Fprintln(p.w)
	}
}
