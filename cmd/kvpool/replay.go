package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/pool/replay"
	"github.com/kvpool/kvpool/transfer/sim"
)

type replayOptions struct {
	sim        simOptions
	servers    []string
	requests   int
	blockBytes int
	json       bool
	noCompare  bool
	onePlan    bool
	outcomes   string
	tenant     string
	timeout    time.Duration
	creds      credFlags
}

func replayCmd(e *env) *cobra.Command {
	o := &replayOptions{}
	c := &cobra.Command{
		Use:   "replay --trace FILE [--servers HOST:PORT,...] [flags]",
		Short: "Replay a trace against live daemons, engines emulated, and check the simulator against it",
		Long: `replay sends a trace's requests, at the trace's rate, to live kvpool daemons:
the daemons in --servers, or (without it) a cluster of --nodes daemons and an
embedded etcd started on loopback in this process. Engines are emulated, one per
daemon, by timers at the model's prefill and decode speeds, as kvpool sim models
them (there is no GPU here); everything else is real. For every request a daemon
plans where it runs (Plan, with the engines' reported queues), the engine looks
its prefix up in its daemon (Locate), fetches what the plan says from another
daemon (Fetch, with its pins, transfers and the source's evictions), computes the
rest, and puts the blocks it computed (Put).

The daemons hold small blocks (--block-bytes), since this machine cannot hold a
trace's real KV; a fetch takes the longer of the real transfer and the time the
model's blocks need on the modeled link (--link-gbps, --fetch-fixed-ms), and plans
are asked with that link as their bandwidth. Each daemon holds as many blocks as
the modeled host tier (--host-gb of the model's blocks).

It reports the simulator's table for the policy the daemons run (pool-split),
the daemons' latencies (Plan, Locate, Fetch, Put), and, unless --no-compare, the
simulator's answer for the same cluster: engines without a GPU prefix cache of
their own (they map kvpool's memory), the daemons' capacity as host tiers.`,
		Example: `  kvpool replay --trace conversation_trace.jsonl --requests 600 --nodes 3 --time-scale 1
  kvpool replay --trace conversation_trace.jsonl --servers 10.0.0.1:7070,10.0.0.2:7070 --tls-ca ca.pem --token-file t`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReplay(cmd.Context(), e, o)
		},
	}
	fl := c.Flags()
	o.sim.registerShared(fl)
	o.sim.nodes = 3 // a demo-sized cluster by default
	fl.Lookup("nodes").DefValue = "3"
	fl.StringSliceVar(&o.servers, "servers", nil, "daemons to replay against, one engine each (default: start --nodes daemons here)")
	fl.IntVar(&o.requests, "requests", 600, "replay the trace's first N requests (0: all)")
	fl.IntVar(&o.blockBytes, "block-bytes", 16<<10, "bytes each stored block holds")
	fl.BoolVar(&o.json, "json", false, "print JSON: the replay's and the simulator's rows and the daemons' latencies")
	fl.BoolVar(&o.noCompare, "no-compare", false, "do not run the simulator on the same cluster")
	fl.BoolVar(&o.onePlan, "one-daemon-plans", false, "route with one daemon's Plan for all nodes (daemons take turns), whose view of the other engines' queues is as old as gossip (up to about 1 s), instead of asking each daemon for its own node's plan")
	fl.StringVar(&o.outcomes, "outcomes", "", "write every request's outcome, replayed and simulated, to this file (JSON Lines)")
	fl.StringVar(&o.tenant, "tenant", "replay", "tenant the replay's blocks belong to (a fresh namespace per run); with credentials, one they may use")
	fl.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound on each call to a daemon")
	o.creds.register(c)
	return c
}

// replayReport is the --json shape.
type replayReport struct {
	Replay  simRow             `json:"replay"`
	Sim     *simRow            `json:"sim,omitempty"`
	Daemons replayLatencies    `json:"daemons"`
	Plans   map[string]int     `json:"plans"`
	Late    float64            `json:"late_p99_s"`
	Ratio   map[string]float64 `json:"sim_over_replay,omitempty"`
}

type replayLatencies struct {
	Plan        sim.Stats `json:"plan"`
	Locate      sim.Stats `json:"locate"`
	Fetch       sim.Stats `json:"fetch"`
	Put         sim.Stats `json:"put"`
	PlanCalls   int       `json:"plan_calls"`
	FetchCalls  int       `json:"fetch_calls"`
	PutCalls    int       `json:"put_calls"`
	FetchErrors int       `json:"fetch_errors"`
}

func runReplay(ctx context.Context, e *env, o *replayOptions) error {
	o.sim.policies = []string{sim.PoolSplit.String()}
	s, points, err := o.sim.setup()
	if err != nil {
		return err
	}
	var errs []error
	if o.requests < 0 || o.blockBytes < 1 {
		errs = append(errs, fmt.Errorf("--requests %d and --block-bytes %d: want ≥ 0 and ≥ 1", o.requests, o.blockBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return usage(err)
	}
	p := points[0]
	cfg, kv, err := s.config(p, sim.PoolSplit)
	if err != nil {
		return usage(err)
	}
	f, err := os.Open(o.sim.trace)
	if err != nil {
		return usage(err)
	}
	reqs, err := sim.ParseTrace(f, sim.TraceConfig{TimeScale: p.timeScale, BlockTokens: o.sim.blockTokens})
	f.Close()
	if err != nil {
		return usage(fmt.Errorf("%s: %w", o.sim.trace, err))
	}
	if o.requests > 0 && o.requests < len(reqs) {
		reqs = reqs[:o.requests]
	}

	// The daemons: given, or started here.
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	hostBlocks := cfg.HostBlocks
	var clients []*api.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	if len(o.servers) == 0 {
		dir, err := os.MkdirTemp("", "kvpool-replay-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		pageBytes := int64(4 << 10)
		perBlock := (int64(o.blockBytes) + pageBytes - 1) / pageBytes * pageBytes
		cl, err := startDemoCluster(ctx, dir, p.nodes, max(int64(hostBlocks), 1)*perBlock, perBlock, log)
		if err != nil {
			return err
		}
		defer cl.close()
		for _, n := range cl.nodes {
			c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathData})
			if err != nil {
				return err
			}
			clients = append(clients, c)
		}
		fmt.Fprintf(e.stderr, "replay: %d daemons on loopback, %d blocks of %d bytes each\n", p.nodes, hostBlocks, o.blockBytes)
	} else {
		var cc api.ClientConfig
		if err := o.creds.apply(&cc); err != nil {
			return err
		}
		hostBlocks = -1
		for _, addr := range o.servers {
			cc.Server = strings.TrimSpace(addr)
			c, err := api.Dial(ctx, cc)
			if err != nil {
				return fmt.Errorf("%s: %w", addr, err)
			}
			clients = append(clients, c)
			info := c.Info()
			page := max(int64(info.GetPageBytes()), 1)
			n := int(int64(info.GetCapacityBytes()) / ((int64(o.blockBytes) + page - 1) / page * page))
			if hostBlocks < 0 || n < hostBlocks {
				hostBlocks = n
			}
		}
		p.nodes = len(clients)
	}

	bar := newProgress(e.stderr, o.sim.progress, len(reqs), 1)
	rc := replay.Config{
		Clients: clients, Trace: reqs, Engine: cfg, Model: p.model,
		LinkBytesPerSecond: cfg.NetworkBytesPerSecond, FetchFixed: time.Duration(cfg.FetchFixedS * float64(time.Second)),
		BlockBytes: o.blockBytes, Tenant: o.tenant, Namespace: fmt.Sprintf("run-%d", time.Now().UnixNano()),
		Timeout: o.timeout, Logger: log, OneDaemonPlans: o.onePlan, Progress: bar.reporter(0),
	}
	res, err := replay.Run(ctx, rc)
	bar.runDone()
	bar.finish()
	if err != nil {
		return err
	}
	rep := replayReport{
		Replay: newSimRow(p, o.sim.accelerator, kv, &res.Result), Plans: res.Plans, Late: res.LateP99S,
		Daemons: replayLatencies{Plan: res.Plan, Locate: res.Locate, Fetch: res.Fetch, Put: res.Put,
			PlanCalls: res.PlanCalls, FetchCalls: res.FetchCalls, PutCalls: res.PutCalls, FetchErrors: res.FetchErrors},
	}
	rep.Replay.Nodes = len(clients)
	var simOutcomes []sim.Outcome
	if !o.noCompare {
		// The simulator, configured like the live cluster: engines that
		// map kvpool's memory instead of caching prefixes themselves, the
		// daemons' capacity as host tiers (they evict from 95 % down to
		// 85 % full: 90 % on average), local blocks free to use as the
		// daemons' planner counts them.
		scfg := cfg
		scfg.Nodes = len(clients)
		scfg.NoGPUCache = true
		scfg.HostBlocks = max(1, hostBlocks*9/10)
		scfg.HostToGPUBytesPerSecond = 1e15
		sres, err := sim.Run(scfg, reqs, nil)
		if err != nil {
			return err
		}
		simOutcomes = sres.Outcomes
		row := newSimRow(p, o.sim.accelerator, kv, &sres)
		row.Nodes = len(clients)
		rep.Sim = &row
		rep.Ratio = map[string]float64{
			"ttft_p50": row.TTFTP50 / rep.Replay.TTFTP50, "ttft_p90": row.TTFTP90 / rep.Replay.TTFTP90,
			"ttft_p99": row.TTFTP99 / rep.Replay.TTFTP99,
		}
	}
	if o.outcomes != "" {
		if err := writeOutcomes(o.outcomes, reqs, res.Outcomes, simOutcomes); err != nil {
			return err
		}
	}
	if o.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printReplay(e.stdout, &rep, len(reqs))
	return nil
}

// writeOutcomes writes one JSON line per request: its arrival and
// lengths, and what the replay and the simulator made of it.
func writeOutcomes(file string, reqs []sim.Request, replayed, simulated []sim.Outcome) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for i, q := range reqs {
		line := map[string]any{"id": q.ID, "arrival_s": q.ArrivalS, "input_tokens": q.InputTokens, "output_tokens": q.OutputTokens,
			"replay": replayed[i]}
		if simulated != nil {
			line["sim"] = simulated[i]
		}
		if err := enc.Encode(line); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}

func printReplay(w io.Writer, r *replayReport, requests int) {
	rows := []simRow{r.Replay}
	if r.Sim != nil {
		rows = append(rows, *r.Sim)
	}
	printSimTable(w, rows, requests)
	d := r.Daemons
	fmt.Fprintf(w, "\ndaemons, seconds p50 / p99: Plan %.4f / %.4f (%d calls), Locate %.4f / %.4f, Fetch %.4f / %.4f (%d calls, %d incomplete), Put %.4f / %.4f (%d calls)\n",
		d.Plan.P50, d.Plan.P99, d.PlanCalls, d.Locate.P50, d.Locate.P99, d.Fetch.P50, d.Fetch.P99, d.FetchCalls, d.FetchErrors, d.Put.P50, d.Put.P99, d.PutCalls)
	fmt.Fprintf(w, "plans: %v; requests planned up to %.3f s late (p99)\n", r.Plans, r.Late)
	if r.Ratio != nil {
		fmt.Fprintf(w, "sim / replay: TTFT p50 %.3f, p90 %.3f, p99 %.3f\n", r.Ratio["ttft_p50"], r.Ratio["ttft_p90"], r.Ratio["ttft_p99"])
	}
}
