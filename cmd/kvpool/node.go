package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/metadata/embedded"
	"github.com/kvpool/kvpool/pool/bench"
	"github.com/kvpool/kvpool/pool/disk"
	"github.com/kvpool/kvpool/transfer"
)

func nodeStatsCmd(e *env) *cobra.Command {
	var f clientFlags
	c := &cobra.Command{
		Use:   "stats",
		Short: "Show a node's capacity, usage, allocator state and tenants",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withClient(cmd, func(ctx context.Context, c *api.Client) error {
				st, err := c.Stats(ctx)
				if err != nil || f.asJSON {
					return printOr(e, err, st)
				}
				printStats(e.stdout, &st)
				return nil
			})
		},
	}
	f.register(c, false, 30*time.Second)
	return c
}

func printStats(w io.Writer, st *api.NodeStats) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "node\t%s\n", st.NodeID)
	fmt.Fprintf(tw, "capacity\t%s\n", humanBytes(st.CapacityBytes))
	fmt.Fprintf(tw, "used\t%s (%.1f%%)\n", humanBytes(st.UsedBytes), 100*float64(st.UsedBytes)/float64(max(st.CapacityBytes, 1)))
	fmt.Fprintf(tw, "stored\t%s in %d blocks\n", humanBytes(st.StoredBytes), st.Blocks)
	fmt.Fprintf(tw, "reservations\t%d (%s)\n", st.Reservations, humanBytes(st.ReservedBytes))
	fmt.Fprintf(tw, "page\t%s\n", humanBytes(st.PageBytes))
	fmt.Fprintf(tw, "largest free run\t%s\n", humanBytes(st.LargestFreeBytes))
	fmt.Fprintf(tw, "fragmentation\texternal %.3f, internal %.3f\n", st.ExternalFragmentation, st.InternalFragmentation)
	fmt.Fprintf(tw, "memory locked\t%v\n", st.MemoryLocked)
	tw.Flush()
	if len(st.Namespaces) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TENANT\tNAMESPACE\tBLOCKS\tSTORED")
		for _, ns := range st.Namespaces {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", ns.Tenant, ns.Namespace, ns.Blocks, humanBytes(ns.StoredBytes))
		}
		tw.Flush()
	}
	if len(st.Tenants) > 0 {
		fmt.Fprintln(w)
		printTenants(w, st.NodeID, st.Tenants)
	}
}

// printTenants shows a node's per-tenant usage and what eviction did.
func printTenants(w io.Writer, node string, ts []api.TenantStats) {
	if len(ts) == 0 {
		return
	}
	fmt.Fprintf(w, "tenants on %s:\n", node)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tPOLICY\tQUOTA\tSTORED\tBLOCKS\tHITS\tMISSES\tEVICTED (quota/pressure/ttl)\tREJECTED")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d/%d/%d\t%d\n", t.Tenant, t.Policy, quota(t.QuotaBytes), humanBytes(t.StoredBytes),
			t.Blocks, t.Hits, t.Misses, t.QuotaEvictions, t.PressureEvictions, t.Expirations, t.Rejected)
	}
	tw.Flush()
}

func quota(q int64) string {
	if q > 0 {
		return humanBytes(uint64(q))
	}
	return "none"
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func nodeBenchCmd(e *env) *cobra.Command {
	cfg := bench.Config{Op: "get", BlockBytes: 2 << 20, Clients: 1, Duration: 5 * time.Second}
	var blockBytes int64 = 2 << 20
	var path string
	var asJSON, quiet bool
	var cpuProfile, memProfile, execTrace string
	var remote, authCompare bool
	var diskDir, segmentPath string
	var diskIO disk.IOMode
	rc := bench.RemoteConfig{Transport: transfer.ProtocolTCP, Conns: 2, ChainBlocks: 16}
	so := soakOptions{keys: 1024, maxValue: 1 << 20}
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure Get or Put throughput against the raw-TCP or memcpy baseline",
		Long: `bench measures Get or Put throughput and latency of a node and, in the same run,
the physical baseline it must be judged against:

  --path data (default)  raw TCP streams of the same block size and connection
                         count, in this process over loopback; with --server,
                         the node's own source/sink frames over the real link.
                         A put in this process also gets a floor: the same
                         raw connections sending each call's values and
                         waiting for a 16-byte answer before the next, as a
                         put waits for the node's. Each run over
                         TCP in this process also measures the streams
                         checked: every block checksummed (CRC-32C) as it
                         arrives and, for a put, as it is sent, as kvpool's
                         ends must; where the CPUs bound raw TCP, that is the
                         most any transfer that checks its bytes moves here
  --path shm             single-threaded memcpy of the same size (per client);
                         gets of blocks a client read before skip the node
                         (--no-location-cache makes every get ask it)
  --path grpc            as data
  --path disk            a node's disk tier (--disk-dir, on the disk to measure):
                         blocks spilled by its writers against plain writes of
                         as many files of the same size by as many writers, and
                         Fetches promoting blocks only the disk holds against
                         plain sequential reads of those files, with the same
                         I/O mode (--disk-io); working set default 1GiB, four
                         times the arena

With --soak DURATION, bench runs a mixed workload instead: put (plain and,
on shm, reserve/commit), get (copied and, on shm, zero-copy views) and remove,
of log-uniform sizes up to --soak-max-value, one worker per path (shm, data,
grpc), every byte read back checked. It samples the node's RSS, arena,
private (anonymous) memory, heap, goroutines and descriptors and fails
(exit 1) on a wrong byte, a removed block served, an unexpected error, or
growth between the load's second quarter and its last past stated bounds
(RSS ×1.1 + 48 MiB, private ×1.25 + 32 MiB, heap ×1.5 + 32 MiB, goroutines
+20, descriptors +10; idle after against idle before too). Without --server
it starts a daemon as a child process (arena --capacity, default 64MiB for a
soak) so /proc is read for it; with --server give --metrics and --pid.

With --remote, bench starts an embedded etcd and two nodes, stores blocks on
one, and measures the other fetching them in chains (pin on the holder,
one-sided reads into its arena, checksum, commit as a replica) against raw TCP
with as many connections as the transport uses. With the tcp transport it also
measures a floor: the same raw connections asked for one chain's bytes at a
time, each chain read in full before the next is asked for, which is what a
fetch costing nothing of its own would reach (the streaming baseline never
waits on a round trip; one fetcher fetching chain after chain always does),
the streams checked (each block checksummed as it arrives, as the fetcher
verifies it), and the relayed floor: the floor asked for through a relay over a
loopback connection of its own, as an engine asks its node, the relay
checksumming each chain as it arrives (what kvpool's design costs with nothing
of kvpool's in it).

Half of the baseline runs before the measured phase and half after, so drift
on a noisy machine hits both. Without --server, bench starts a node in this
process. With --server the process holds only clients, each standing for an
engine (a process with a thread of its own), and runs them on as many threads
as there are clients when the cores are fewer (GOMAXPROCS, unless set in the
environment); the baseline runs on as many. Progress goes to stderr; the
result to stdout (--json for machines).`,
		Example: `  kvpool node bench --op get --block-size 2MiB --clients 4 --duration 10s --json
  kvpool node bench --op get --path shm --block-size 2MiB --json
  kvpool node bench --server 10.0.0.5:7070 --op put --clients 2
  kvpool node bench --remote --transport tcp --conns 2 --block-size 2MiB --json
  kvpool node bench --path disk --disk-dir /mnt/nvme --rounds 3 --json
  kvpool node bench --soak 30m`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if so.duration != 0 {
				if so.duration < 0 || so.keys < 1 || so.maxValue < 1 || so.maxValue > 64<<20 {
					return usagef("--soak must be positive, --soak-keys at least 1 and --soak-max-value 1 byte to 64 MiB")
				}
				capacity := cfg.CapacityBytes
				if !cmd.Flags().Changed("capacity") {
					capacity = 64 << 20
				}
				return runSoak(cmd.Context(), e, cfg.Server, capacity, so, asJSON)
			}
			var p api.Path
			var err error
			if path != "disk" {
				if p, err = api.ParsePath(path); err != nil {
					return usage(err)
				}
			}
			if !remote && cfg.Op != "get" && cfg.Op != "put" {
				return usagef("--op %q: want get or put", cfg.Op)
			}
			if cfg.Clients < 1 || cfg.Duration <= 0 || cfg.Rounds < 1 {
				return usagef("--clients and --rounds must be at least 1 and --duration positive")
			}
			if blockBytes <= 0 || blockBytes > 1<<32-1 {
				return usagef("--block-size %d: want 1 byte to 4 GiB", blockBytes)
			}
			cfg.Path, cfg.BlockBytes = p, int(blockBytes)
			if segmentPath != "" && !remote && path != "disk" && path != "shm" && (path != "data" || cfg.Server != "") {
				return usagef("--segment-path is for --path shm or disk, --path data with the node in this process, or --remote")
			}
			cfg.SegmentPath = segmentPath
			if !quiet {
				cfg.Progress = &bench.Progress{W: e.stderr, Terminal: isTerminal(e.stderr)}
			}
			// The CPU profile and the execution trace run for the whole
			// run, each into its file.
			for _, r := range []struct {
				path  string
				start func(io.Writer) error
				stop  func()
			}{{cpuProfile, pprof.StartCPUProfile, pprof.StopCPUProfile}, {execTrace, trace.Start, trace.Stop}} {
				if r.path == "" {
					continue
				}
				f, err := os.Create(r.path)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := r.start(f); err != nil {
					return err
				}
				defer r.stop()
			}
			if memProfile != "" {
				f, err := os.Create(memProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				// Deferred before the run, so it sees everything the run
				// allocated (the baselines' few buffers included).
				defer func() {
					runtime.GC() // the profile holds what the last completed cycle saw
					if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
						fmt.Fprintf(e.stderr, "memprofile: %v\n", err)
					}
				}()
			}
			if path == "disk" {
				dc := bench.DiskConfig{Dir: diskDir, IO: diskIO, BlockBytes: int(blockBytes), Clients: cfg.Clients, Duration: cfg.Duration, Rounds: cfg.Rounds, SegmentPath: segmentPath}
				if cmd.Flags().Changed("working-set") {
					dc.WorkingSetBytes = cfg.WorkingSetBytes
				}
				if !quiet {
					dc.Progress = &bench.Progress{W: e.stderr, Terminal: isTerminal(e.stderr)}
				}
				return benchDisk(cmd, e, dc, asJSON)
			}
			if authCompare {
				res, err := bench.RunAuth(cmd.Context(), cfg)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(e.stdout, res)
				}
				fmt.Fprintf(e.stdout, "%s data, %s blocks, %d clients, %d rounds of each mode\n", res.Op, formatSize(int64(res.BlockBytes)), res.Clients, res.Rounds)
				for _, m := range res.Modes {
					fmt.Fprintf(e.stdout, "  %-6s %6.2f GB/s  p50 %.3f ms  p99 %.3f ms\n", m.Name, m.GBps, m.P50Ms, m.P99Ms)
				}
				fmt.Fprintf(e.stdout, "  token/open %.3f   tls/token %.3f\n", res.TokenRatio, res.TLSRatio)
				return nil
			}
			var res *bench.Result
			if remote {
				res, err = benchRemote(cmd.Context(), cfg, rc)
			} else {
				if cfg.Server != "" && cfg.Clients > runtime.GOMAXPROCS(0) && os.Getenv("GOMAXPROCS") == "" {
					// With the node in another process this process is
					// only clients, each standing for an engine, which
					// is a process with a thread of its own: as many
					// processors as clients (a client waiting for its
					// answer holds one, and with fewer the others' copies
					// wait for it). The baseline runs on as many.
					runtime.GOMAXPROCS(cfg.Clients)
				}
				res, err = bench.Run(cmd.Context(), cfg)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(e.stdout, res)
			}
			fmt.Fprintf(e.stdout, "%s %s, %s blocks, %d clients on %d threads, %s (%s)\n", res.Op, res.Path, formatSize(int64(res.BlockBytes)), res.Clients, res.Threads, time.Duration(res.DurationS*float64(time.Second)).Round(time.Millisecond), res.Server)
			fmt.Fprintf(e.stdout, "  throughput  %.2f GB/s  (%.0f ops/s)\n", res.GBps, res.OpsPerS)
			fmt.Fprintf(e.stdout, "  latency     p50 %.3f ms  p99 %.3f ms\n", res.P50Ms, res.P99Ms)
			if res.Baseline != "" {
				fmt.Fprintf(e.stdout, "  baseline    %.2f GB/s  %s\n", res.BaselineGBps, res.Baseline)
				fmt.Fprintf(e.stdout, "  ratio       %.3f\n", res.RatioToBaseline)
			}
			if res.Floor != "" {
				fmt.Fprintf(e.stdout, "  floor       %.2f GB/s  %s\n", res.FloorGBps, res.Floor)
				fmt.Fprintf(e.stdout, "  of floor    %.3f\n", res.RatioToFloor)
			}
			if res.Checked != "" {
				fmt.Fprintf(e.stdout, "  checked     %.2f GB/s  %s\n", res.CheckedGBps, res.Checked)
				fmt.Fprintf(e.stdout, "  of checked  %.3f\n", res.RatioToChecked)
			}
			if res.Relayed != "" {
				fmt.Fprintf(e.stdout, "  relayed     %.2f GB/s  %s\n", res.RelayedGBps, res.Relayed)
				fmt.Fprintf(e.stdout, "  of relayed  %.3f\n", res.RatioToRelayed)
			}
			for i, r := range res.Rounds {
				fmt.Fprintf(e.stdout, "  round %d     %.2f GB/s, baseline %.2f GB/s, ratio %.3f", i+1, r.GBps, r.BaselineGBps, r.RatioToBaseline)
				if r.FloorGBps > 0 {
					fmt.Fprintf(e.stdout, "; floor %.2f GB/s, of floor %.3f", r.FloorGBps, r.RatioToFloor)
				}
				if r.CheckedGBps > 0 {
					fmt.Fprintf(e.stdout, "; checked %.2f GB/s, of checked %.3f", r.CheckedGBps, r.RatioToChecked)
				}
				if r.RelayedGBps > 0 {
					fmt.Fprintf(e.stdout, "; relayed %.2f GB/s, of relayed %.3f", r.RelayedGBps, r.RatioToRelayed)
				}
				fmt.Fprintln(e.stdout)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.Server, "server", "", "node address (host:port); empty starts a node in this process")
	f.StringVar(&cfg.Op, "op", cfg.Op, "operation: get or put")
	f.Var(sizeV(&blockBytes), "block-size", "value size, e.g. 4KiB or 2MiB")
	f.IntVar(&cfg.Clients, "clients", cfg.Clients, "concurrent clients, one connection each")
	f.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the measured phase of each round (the baseline takes as long again)")
	f.IntVar(&cfg.Rounds, "rounds", 1, "repeat baseline-half, measure, baseline-half this many times; figures sum over all rounds")
	f.StringVar(&path, "path", "data", "how bytes move: data (framed TCP), shm (same-host shared memory) or grpc; or disk, the disk tier")
	f.StringVar(&diskDir, "disk-dir", "", "with --path disk: the directory to measure in (default $TMPDIR)")
	f.Var(&diskIO, "disk-io", "with --path disk: auto, direct or buffered")
	f.StringVar(&segmentPath, "segment-path", "", "with --path disk or shm, --path data and no --server, or --remote: back the in-process node's arena (with --remote both nodes', at this path plus -fetcher and -holder) with a file at this path (on a hugetlbfs mount: huge pages; --capacity a whole number of free ones) and the baseline's memory with one beside it, the same kind (a shm put's baseline copies into frames of the arena itself); with --server, only a get baseline's (name the mount the node's arena is on) (default: memfds for disk; otherwise memfd arenas and baselines on the heap)")
	f.Var(sizeV(&cfg.WorkingSetBytes), "working-set", "distinct block data gets cycle through (default 128MiB)")
	f.Var(sizeV(&cfg.CapacityBytes), "capacity", "arena size of the in-process node (default 4GiB)")
	f.BoolVar(&cfg.NoBaseline, "no-baseline", false, "skip the baseline")
	f.BoolVar(&cfg.NoLocationCache, "no-location-cache", false, "shm: ask the node on every get instead of reading blocks read before straight from the segment")
	f.BoolVar(&cfg.NoShmMailbox, "no-shm-mailbox", false, "shm: keep the sessions' requests and answers on their unix sockets instead of the mailbox they share with the node")
	f.BoolVar(&cfg.NoLocalServe, "no-local-serve", false, "shm, node in this process: clients wait for the node's goroutine to serve each request, as clients in another process do, instead of serving it themselves in their own goroutine")
	f.IntVar(&cfg.Batch, "batch", 1, "with --op put: blocks per call; above 1 each client stores them with PutMany from as many distinct buffers (an engine saving a request's blocks), and the memcpy baseline copies from as many")
	f.DurationVar(&cfg.NodeSpinWait, "node-spin-wait", 0, "the in-process nodes' --spin-wait (0: its default, 100µs; negative: never)")
	f.StringVar(&cfg.TCPCongestion, "tcp-congestion", "", "TCP congestion control of everything the run sends over TCP: the in-process nodes', the clients' and the raw-TCP baselines' connections, so the baselines move bytes as kvpool does; with --server, name the node's (default cubic, as a node's; host: the host's default)")
	f.BoolVar(&cfg.WriteBehind, "write-behind", false, "with --op put: each client puts with PutAsync, which returns once the block is copied and its commit posted (answered while the client copies its next block), and flushes before its last put counts; the memcpy baseline copies into as many frames more as the client's spares beyond one")
	f.DurationVar(&cfg.ClientSpinWait, "client-spin-wait", 0, "how long each client call polls its socket for the node's response before parking (0: the client's default, 50µs; negative: never)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.BoolVar(&quiet, "quiet", false, "no progress bar")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
	f.StringVar(&execTrace, "trace", "", "write a Go execution trace of the run to this file (go tool trace): where each goroutine waited, and on what")
	f.StringVar(&memProfile, "memprofile", "", "write a profile of the run's heap allocations to this file when it ends (go tool pprof -sample_index=alloc_space)")
	f.BoolVar(&authCompare, "auth", false, "compare, in one run, an open node, a secured node over plaintext with a token, and the secured node over TLS with a client certificate (data path; --op, --block-size, --clients, --duration and --rounds apply)")
	f.BoolVar(&remote, "remote", false, "two nodes in this process: measure one fetching chains held by the other (--op is ignored)")
	f.Var(textV[transfer.Protocol]{&rc.Transport}, "transport", "with --remote: the transport the fetching node pulls with: tcp, grpc, or shm (both nodes on this host; the baseline is then memcpy)")
	f.IntVar(&rc.Conns, "conns", rc.Conns, "with --remote: tcp connections per peer (the raw-TCP baseline uses as many)")
	f.IntVar(&rc.ChainBlocks, "chain-blocks", rc.ChainBlocks, "with --remote: blocks per Fetch")
	f.Var(sizeOrOffV{v: &rc.ServeSendBufferBytes}, "transfer-send-buffer", "with --remote: both nodes' --transfer-send-buffer (off: the kernel's autotuning; the baselines' sockets always have it) (default 512KiB)")
	f.DurationVar(&so.duration, "soak", 0, "run the soak for this long instead of measuring throughput (see above)")
	f.StringVar(&so.metrics, "metrics", "", "with --soak --server: the node's metrics address (host:port)")
	f.IntVar(&so.pid, "pid", 0, "with --soak --server: the node's process id, to read its memory and descriptors from /proc")
	f.IntVar(&so.keys, "soak-keys", so.keys, "with --soak: key slots per worker")
	f.Var(sizeV(&so.maxValue), "soak-max-value", "with --soak: largest value (sizes are log-uniform from 1 byte)")
	return c
}

// benchRemote runs the two-node benchmark on an embedded etcd of its own.
func benchRemote(ctx context.Context, cfg bench.Config, rc bench.RemoteConfig) (*bench.Result, error) {
	dir, err := os.MkdirTemp("", "kvpool-bench-etcd-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	e, err := embedded.Start(embedded.Config{Dir: dir, ClientURL: "http://127.0.0.1:0", Fast: true})
	if err != nil {
		return nil, err
	}
	defer e.Close()
	rc.EtcdEndpoints = []string{e.ClientURL()}
	return bench.RunRemote(ctx, cfg, rc)
}

func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// benchDisk runs and prints a disk-tier benchmark.
func benchDisk(cmd *cobra.Command, e *env, dc bench.DiskConfig, asJSON bool) error {
	res, err := bench.RunDisk(cmd.Context(), dc)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(e.stdout, res)
	}
	mode := "buffered"
	if res.Direct {
		mode = "direct"
	}
	fmt.Fprintf(e.stdout, "disk tier, %s blocks, %d blocks, %d clients, %s I/O\n", formatSize(int64(res.BlockBytes)), res.Blocks, res.Clients, mode)
	fmt.Fprintf(e.stdout, "  spill       %.2f GB/s  plain writes %.2f GB/s  ratio %.3f\n", res.SpillGBps, res.WriteBaselineGBps, res.SpillRatio)
	fmt.Fprintf(e.stdout, "  promote     %.2f GB/s  plain reads  %.2f GB/s  ratio %.3f  (%d promotes, p50 %.3f ms, p99 %.3f ms)\n",
		res.PromoteGBps, res.ReadBaselineGBps, res.PromoteRatio, res.Promotes, res.P50Ms, res.P99Ms)
	fmt.Fprintf(e.stdout, "  into one private buffer: plain reads %.2f GB/s, promote ratio %.3f\n", res.ReadPrivateBaselineGBps, res.PromotePrivateRatio)
	if res.PromoteKiBPerRequest > 0 {
		fmt.Fprintf(e.stdout, "  KiB per disk read request: promote %.0f, plain reads %.0f, into the private buffer %.0f\n",
			res.PromoteKiBPerRequest, res.ReadBaselineKiBPerRequest, res.ReadPrivateKiBPerRequest)
	}
	for i, r := range res.Rounds {
		fmt.Fprintf(e.stdout, "  round %d     promote %.2f GB/s, plain reads %.2f GB/s, ratio %.3f\n", i+1, r.PromoteGBps, r.ReadBaselineGBps, r.Ratio)
	}
	return nil
}
