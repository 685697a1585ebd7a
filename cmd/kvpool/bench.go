package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/cmd/kvpool/internal/bench"
)

func benchCmd(e *env) *cobra.Command {
	cfg := bench.Config{Op: "get", BlockBytes: 2 << 20, Clients: 1, Duration: 5 * time.Second}
	var blockBytes int64 = 2 << 20
	var path string
	var asJSON, quiet bool
	var cpuProfile string
	var remote bool
	var transport string
	var conns, chainBlocks int
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure Get or Put throughput against the raw-TCP or memcpy baseline",
		Long: `bench measures Get or Put throughput and latency of a node and, in the same run,
the physical baseline it must be judged against:

  --path data (default)  raw TCP streams of the same block size and connection
                         count, in this process over loopback; with --server,
                         the node's own source/sink frames over the real link
  --path shm             single-threaded memcpy of the same size (per client);
                         gets of blocks a client read before skip the node
                         (--no-location-cache makes every get ask it)
  --path grpc            as data

With --remote, bench starts an embedded etcd and two nodes, stores blocks on
one, and measures the other fetching them in chains (pin on the holder,
one-sided reads into its arena, checksum, commit as a replica) against raw TCP
with as many connections as the transport uses.

Half of the baseline runs before the measured phase and half after, so drift
on a noisy machine hits both. Without --server, bench starts a node in this
process. Progress goes to stderr; the result to stdout (--json for machines).`,
		Example: `  kvpool bench --op get --block-size 2MiB --clients 4 --duration 10s --json
  kvpool bench --op get --path shm --block-size 2MiB --json
  kvpool bench --server 10.0.0.5:7070 --op put --clients 2
  kvpool bench --remote --transport tcp --conns 2 --block-size 2MiB --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := api.ParsePath(path)
			if err != nil {
				return usageError{error: err}
			}
			if !remote && cfg.Op != "get" && cfg.Op != "put" {
				return usageError{error: fmt.Errorf("--op %q: want get or put", cfg.Op)}
			}
			if cfg.Clients < 1 || cfg.Duration <= 0 || cfg.Rounds < 1 {
				return usageError{error: fmt.Errorf("--clients and --rounds must be at least 1 and --duration positive")}
			}
			if blockBytes <= 0 || blockBytes > 1<<32-1 {
				return usageError{error: fmt.Errorf("--block-size %d: want 1 byte to 4 GiB", blockBytes)}
			}
			cfg.Path, cfg.BlockBytes = p, int(blockBytes)
			if !quiet {
				cfg.Progress = &bench.Progress{W: e.stderr, Terminal: isTerminal(e.stderr)}
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			var res *bench.Result
			if remote {
				res, err = bench.RunRemote(cmd.Context(), cfg, bench.RemoteConfig{Transport: transport, Conns: conns, ChainBlocks: chainBlocks})
			} else {
				res, err = bench.Run(cmd.Context(), cfg)
			}
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(e.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			fmt.Fprintf(e.stdout, "%s %s, %s blocks, %d clients, %s (%s)\n", res.Op, res.Path, formatSize(int64(res.BlockBytes)), res.Clients, time.Duration(res.DurationS*float64(time.Second)).Round(time.Millisecond), res.Server)
			fmt.Fprintf(e.stdout, "  throughput  %.2f GB/s  (%.0f ops/s)\n", res.GBps, res.OpsPerS)
			fmt.Fprintf(e.stdout, "  latency     p50 %.3f ms  p99 %.3f ms\n", res.P50Ms, res.P99Ms)
			if res.Baseline != "" {
				fmt.Fprintf(e.stdout, "  baseline    %.2f GB/s  %s\n", res.BaselineGBps, res.Baseline)
				fmt.Fprintf(e.stdout, "  ratio       %.3f\n", res.RatioToBaseline)
			}
			for i, r := range res.Rounds {
				fmt.Fprintf(e.stdout, "  round %d     %.2f GB/s, baseline %.2f GB/s, ratio %.3f\n", i+1, r.GBps, r.BaselineGBps, r.RatioToBaseline)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.Server, "server", "", "node address (host:port); empty starts a node in this process")
	f.StringVar(&cfg.Op, "op", cfg.Op, "operation: get or put")
	f.Var(sizeFlag{&blockBytes}, "block-size", "value size, e.g. 4KiB or 2MiB")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients, one connection each")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the measured phase of each round (the baseline takes as long again)")
	f.IntVar(&cfg.Rounds, "rounds", 1, "repeat baseline-half, measure, baseline-half this many times; figures sum over all rounds")
	f.StringVar(&path, "path", "data", "how bytes move: data (framed TCP), shm (same-host shared memory) or grpc")
	f.Var(sizeFlag{&cfg.WorkingSetBytes}, "working-set", "distinct block data gets cycle through (default 128MiB)")
	f.Var(sizeFlag{&cfg.CapacityBytes}, "capacity", "arena size of the in-process node (default 4GiB)")
	f.BoolVar(&cfg.NoBaseline, "no-baseline", false, "skip the baseline")
	f.BoolVar(&cfg.NoLocationCache, "no-location-cache", false, "shm: ask the node on every get instead of reading blocks read before straight from the segment")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.BoolVar(&quiet, "quiet", false, "no progress bar")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
	f.BoolVar(&remote, "remote", false, "two nodes in this process: measure one fetching chains held by the other (--op is ignored)")
	f.StringVar(&transport, "transport", "tcp", "with --remote: the transport the fetching node pulls with: tcp, grpc, or shm (both nodes on this host; the baseline is then memcpy)")
	f.IntVar(&conns, "conns", 2, "with --remote: tcp connections per peer (the raw-TCP baseline uses as many)")
	f.IntVar(&chainBlocks, "chain-blocks", 16, "with --remote: blocks per Fetch")
	return c
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
