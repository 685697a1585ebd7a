package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/admin"
)

// adminFlags registers what the cluster and policy commands take: the
// daemon to ask, --json and --timeout. They speak gRPC only.
func adminFlags(c *cobra.Command, f *clientFlags) {
	c.Flags().StringVar(&f.server, "server", "127.0.0.1:7070", "daemon address (host:port)")
	c.Flags().BoolVar(&f.asJSON, "json", false, "print machine-readable JSON")
	c.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "give up after this long")
	f.creds.register(c)
	f.path = "grpc"
}

func clusterNodesCmd(e *env) *cobra.Command {
	var f clientFlags
	c := &cobra.Command{
		Use:   "nodes",
		Short: "List nodes with their state in etcd and in gossip, capacity, use and load",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				nodes, err := a.Nodes(ctx)
				if err != nil || f.asJSON {
					return printOr(e, err, nodes)
				}
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NODE\tADDRESS\tETCD\tGOSSIP\tCAPACITY\tUSED\tBLOCKS\tQUEUE\tPREFILL\tZONE")
				for _, n := range nodes.Nodes {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", n.ID, n.Addrs["grpc"], n.EtcdState, n.GossipState,
						humanBytes(n.CapacityBytes), humanBytes(n.UsedBytes), n.Blocks, seconds(n.QueueSeconds), tokensPerSecond(n.PrefillTokensPerSecond), dash(n.Zone))
				}
				return w.Flush()
			})
		},
	}
	adminFlags(c, &f)
	return c
}

func seconds(s float64) string {
	if s == 0 {
		return "-"
	}
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

// micros formats a short time to the microsecond.
func micros(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
}

// printOr prints v as JSON unless err; it returns err.
func printOr(e *env, err error, v any) error {
	if err != nil {
		return err
	}
	return printJSON(e.stdout, v)
}

func tokensPerSecond(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f tok/s", v)
}

func clusterLocateCmd(e *env) *cobra.Command {
	var f clientFlags
	var chf chainFlags
	c := &cobra.Command{
		Use:   "locate",
		Short: "Show how many leading blocks of a prefix chain each node holds",
		Long: `locate asks for one prefix chain: either its keys (--keys, block 0 first, text or
--hex), or the prompt's tokens (--tokens-file with --block-tokens, hashed with
--scheme and --seed as the engine hashes them). It prints, for every live
node, how many leading blocks it holds in each tier: GPU (its engines' own
caches, from their KV events; "-" where the daemon does not follow them),
HOST (the node's kvpool memory) and DISK (its disk tier, --disk-dir: each
node holding part of the chain is asked; "?" where it did not answer, HOST
then counting both); then the deepest prefix and who holds it, and how much
of the chain the pool holds anywhere.`,
		Example: `  kvpool cluster locate --tenant acme --namespace llama3-8b --tokens-file prompt.txt --block-tokens 16
  kvpool cluster locate --tenant acme --namespace llama3-8b --hex --keys 9f3a...,77c1...`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.checkNames(); err != nil {
				return usage(err)
			}
			chain, _, err := chf.chain(e, &f)
			if err != nil {
				return err
			}
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				loc, err := a.Locate(ctx, f.tenant, f.namespace, chain)
				if err != nil {
					return err
				}
				if err := f.askTiers(ctx, a, &loc, chain); err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(e.stdout, loc)
				}
				printLocate(e.stdout, &loc)
				return nil
			})
		},
	}
	adminFlags(c, &f)
	f.registerNames(c)
	chf.register(c)
	return c
}

// printLocate prints the per-node prefix table of a cluster locate: per
// tier, the GPU's (the engines' caches, "-" where not followed), the
// node's host memory and its disk tier ("?" for a node that did not
// answer; HOST is then memory and disk together).
func printLocate(w io.Writer, loc *admin.Location) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "NODE\tGPU\tHOST\tDISK\tOF %d\n", loc.ChainBlocks)
	for _, n := range loc.Nodes {
		gpu := "-"
		if n.GPUFollowed {
			gpu = strconv.Itoa(n.GPUBlocks)
		}
		// '#' for blocks in GPU memory, '+' for those only in host memory.
		scale := func(b int) int { return b * 30 / max(loc.ChainBlocks, 1) }
		g := 0
		if n.GPUFollowed {
			g = scale(n.GPUBlocks)
		}
		// '#' for blocks in GPU memory, '+' in host memory, '.' only on disk.
		host, disk := strconv.Itoa(n.Blocks), "?"
		memory := n.Blocks
		if n.TiersKnown {
			memory = n.MemoryBlocks
			host, disk = strconv.Itoa(memory), strconv.Itoa(n.Blocks-memory)
		}
		bar := strings.Repeat("#", g) + strings.Repeat("+", max(scale(memory)-g, 0)) + strings.Repeat(".", max(scale(n.Blocks)-max(scale(memory), g), 0))
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Node, gpu, host, disk, bar)
	}
	tw.Flush()
	fmt.Fprintf(w, "deepest prefix: %d blocks on %s\n", loc.DeepestBlocks, dash(strings.Join(loc.DeepestNodes, ", ")))
	fmt.Fprintf(w, "held anywhere in the pool: %d leading blocks\n", loc.PoolPrefixBlocks)
}

func clusterBlocksCmd(e *env) *cobra.Command {
	var f clientFlags
	var node string
	var limit int
	c := &cobra.Command{
		Use:   "blocks",
		Short: "List the blocks a node has published",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := api.ValidateName("--node", node); err != nil {
				return usage(err)
			}
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				list, err := a.Blocks(ctx, node, limit)
				if err != nil || f.asJSON {
					return printOr(e, err, list)
				}
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "TENANT\tNAMESPACE\tKEY")
				for _, b := range list.Blocks {
					fmt.Fprintf(w, "%s\t%s\t%x\n", b.Tenant, b.Namespace, []byte(b.Key))
				}
				w.Flush()
				fmt.Fprintf(e.stderr, "%d of %d blocks on %s\n", len(list.Blocks), list.Total, node)
				return nil
			})
		},
	}
	adminFlags(c, &f)
	c.Flags().StringVar(&node, "node", "", "node id (required)")
	c.Flags().IntVar(&limit, "limit", 1000, "most blocks to list")
	return c
}

func clusterStatsCmd(e *env) *cobra.Command {
	var f clientFlags
	c := &cobra.Command{
		Use:   "stats",
		Short: "Summarize the cluster and the answering daemon's metadata work",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				st, err := a.Stats(ctx)
				if err != nil || f.asJSON {
					return printOr(e, err, st)
				}
				printClusterStats(e.stdout, &st)
				printTenants(e.stdout, st.AnsweredBy, st.Tenants)
				return nil
			})
		},
	}
	adminFlags(c, &f)
	return c
}

func printClusterStats(w io.Writer, st *admin.Stats) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "nodes\t%d (%d alive in gossip)\n", st.Nodes, st.LiveNodes)
	fmt.Fprintf(tw, "capacity\t%s\n", humanBytes(st.CapacityBytes))
	fmt.Fprintf(tw, "used\t%s in %d blocks\n", humanBytes(st.UsedBytes), st.StoredBlocks)
	fmt.Fprintf(tw, "mirror on %s\t%d blocks at etcd revision %d, %d records applied, %d malformed skipped, %d reloads\n",
		st.AnsweredBy, st.MirrorBlocks, st.MirrorRevision, st.MirrorRecordsApplied, st.MirrorMalformed, st.MirrorReloads)
	fmt.Fprintf(tw, "published by %s\t%d records in %d batches, %d snapshots, %d queued, %d etcd failures\n",
		st.AnsweredBy, st.PublishedRecords, st.PublishedBatches, st.PublishedSnapshots, st.PublishQueued, st.PublishFailures)
	tw.Flush()
}

func clusterLinksCmd(e *env) *cobra.Command {
	var f clientFlags
	c := &cobra.Command{
		Use:   "links",
		Short: "Show the daemon's measured bandwidth and latency to each peer",
		Long: `links shows, for each peer, the bandwidth and round trip the daemon measured on
real transfers (a moving average that decays back toward the configured seed
while the link is idle), or the seed when nothing was measured yet, and what a
fetch costs beyond them: FIXED per fetch (the call, pins, reserve, commit,
publish), PER BLOCK and PER DOUBLING (what each doubling of a chain adds: the
work its blocks share), fitted over the last 96 fetches (FITS of them). The
fetch-or-recompute cost model reads these: a fetch of n blocks of b bytes
takes RTT + FIXED + n·PER BLOCK + log2(n)·PER DOUBLING + n·b / BANDWIDTH.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				links, err := a.Links(ctx)
				if err != nil || f.asJSON {
					return printOr(e, err, links)
				}
				fmt.Fprintf(e.stdout, "links from %s (transport %s)\n", links.Node, links.Transport)
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "PEER\tBANDWIDTH\tRTT\tFIXED\tPER BLOCK\tPER DOUBLING\tSAMPLES\tFITS\tMOVED\tIDLE")
				for _, l := range links.Links {
					idle := "never measured (seed)"
					if l.IdleSeconds >= 0 {
						idle = seconds(l.IdleSeconds)
					}
					fmt.Fprintf(w, "%s\t%.2f GB/s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", l.Peer, l.BytesPerSecond/1e9, micros(l.RTTSeconds), micros(l.FixedSeconds),
						micros(l.PerBlockSeconds), micros(l.PerDoublingSeconds), l.BandwidthSamples, l.FitSamples, humanBytes(l.Bytes), idle)
				}
				return w.Flush()
			})
		},
	}
	adminFlags(c, &f)
	return c
}

// askTiers asks every node that holds part of the chain how much of it is
// in its host memory and how much on its disk tier (the cluster map says
// only that it holds the blocks). A node that cannot be reached keeps
// TiersKnown false.
func (f *clientFlags) askTiers(ctx context.Context, a *admin.Client, loc *admin.Location, chain [][]byte) error {
	nodes, err := a.Nodes(ctx)
	if err != nil {
		return err
	}
	addrs := map[string]string{}
	for _, n := range nodes.Nodes {
		addrs[n.ID] = n.Addrs["grpc"]
	}
	for i := range loc.Nodes {
		np := &loc.Nodes[i]
		addr := addrs[np.Node]
		if np.Blocks == 0 || addr == "" {
			continue
		}
		cfg := api.ClientConfig{Server: addr, Path: api.PathGRPC}
		if err := f.creds.apply(&cfg); err != nil {
			return err
		}
		c, err := api.Dial(ctx, cfg)
		if err != nil {
			continue
		}
		total, memory, err := c.LocateTiers(ctx, f.tenant, f.namespace, chain[:np.Blocks])
		c.Close()
		if err == nil && total == np.Blocks {
			np.MemoryBlocks, np.TiersKnown = memory, true
		}
	}
	return nil
}

func clusterDrainCmd(e *env) *cobra.Command {
	var f clientFlags
	var node string
	var budget time.Duration
	c := &cobra.Command{
		Use:   "drain --node ID",
		Short: "Drain a node: it hands what only it holds to its peers, waits for leases, and stops",
		Long: `Drain makes a node leave the cluster without losing what only it holds.
The node stops taking new blocks and leases (clients get Unavailable and go
elsewhere), asks its live peers to pull every block in its memory that no
other live node holds, leased and hottest first, waits for read leases on
what is still only its own, all within --budget, and then stops: its
records leave etcd with its lease. Blocks on its disk tier stay there for
its return.

--server names any daemon; the node's address comes from that daemon's view
of the cluster. The command waits for the drain and prints what it did.
The drained daemon then exits 0. A supervisor that restarts it on any exit
(a DaemonSet) starts it again, serving: with its blocks when it has a
--data-dir, else empty. To take a machine away, keep it from being
restarted (cordon the node), or let --drain-on-stop drain the daemon on the
supervisor's SIGTERM.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return usagef("--node is required: the id of the node to drain (kvpool cluster nodes lists them)")
			}
			if budget < 0 {
				return usagef("--budget %v: want ≥ 0", budget)
			}
			if !cmd.Flags().Changed("timeout") {
				// The drain's own budget bounds it (the node's default is 60 s).
				f.timeout = max(budget, 10*time.Minute) + 30*time.Second
			}
			var addr string
			if err := f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				nodes, err := a.Nodes(ctx)
				if err != nil {
					return err
				}
				for _, n := range nodes.Nodes {
					if n.ID == node {
						addr = n.Addrs["grpc"]
					}
				}
				if addr == "" {
					return fmt.Errorf("%w: %s knows no node %q with an address", api.ErrNotFound, nodes.AnsweredBy, node)
				}
				return nil
			}); err != nil {
				return err
			}
			f.server = addr
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				r, err := a.Drain(ctx, node, budget)
				if err != nil || f.asJSON {
					return printOr(e, err, r)
				}
				fmt.Fprintf(e.stdout, "drained %s in %s: %d blocks (%s) in memory\n", r.NodeID, seconds(r.TookSeconds), r.Blocks, humanBytes(r.Bytes))
				fmt.Fprintf(e.stdout, "  already on another node  %d\n", r.ReplicatedBlocks)
				fmt.Fprintf(e.stdout, "  handed off               %d (%s) in %s\n", r.HandedOffBlocks, humanBytes(r.HandedOffBytes), seconds(r.HandOffSeconds))
				fmt.Fprintf(e.stdout, "  left with the node       %d (%d under a lease)\n", r.KeptBlocks, r.LeasedKeptBlocks)
				if r.LeaseWaitSeconds > 0 {
					fmt.Fprintf(e.stdout, "  waited for leases        %s\n", seconds(r.LeaseWaitSeconds))
				}
				peers := slices.Sorted(maps.Keys(r.PeerBlocks))
				for _, p := range peers {
					fmt.Fprintf(e.stdout, "  to %-22s %d\n", p, r.PeerBlocks[p])
				}
				for _, msg := range r.Errors {
					fmt.Fprintf(e.stdout, "  not handed off: %s\n", msg)
				}
				return nil
			})
		},
	}
	adminFlags(c, &f)
	t := c.Flags().Lookup("timeout")
	t.Usage, t.DefValue = "give up waiting after this long (default: --budget or 10m, whichever is longer, plus 30s)", "0s"
	c.Flags().StringVar(&node, "node", "", "id of the node to drain (required)")
	c.Flags().DurationVar(&budget, "budget", 0, "longest the drain may take, hand-off and lease wait together (default: the node's --drain-budget)")
	return c
}
