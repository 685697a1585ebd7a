package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
)

// adminFlags registers what the cluster and policy commands take: the
// daemon to ask, --json and --timeout. They speak gRPC only.
func adminFlags(c *cobra.Command, f *clientFlags) {
	c.Flags().StringVar(&f.server, "server", "127.0.0.1:7070", "daemon address (host:port)")
	c.Flags().BoolVar(&f.asJSON, "json", false, "print machine-readable JSON")
	c.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "give up after this long")
	f.path = "grpc"
}

// The --json shapes of the cluster commands.
type (
	nodesJSON struct {
		AnsweredBy string           `json:"answered_by"`
		Nodes      []nodeStatusJSON `json:"nodes"`
	}
	nodeStatusJSON struct {
		ID                     string            `json:"id"`
		Addrs                  map[string]string `json:"addrs"`
		Zone                   string            `json:"zone"`
		Version                string            `json:"version"`
		EtcdState              string            `json:"etcd_state"`
		GossipState            string            `json:"gossip_state"`
		CapacityBytes          uint64            `json:"capacity_bytes"`
		UsedBytes              uint64            `json:"used_bytes"`
		Blocks                 uint64            `json:"blocks"`
		PublishedBlocks        uint64            `json:"published_blocks"`
		QueueSeconds           float64           `json:"queue_seconds"`
		PrefillTokensPerSecond float64           `json:"prefill_tokens_per_second"`
		Epoch                  string            `json:"epoch"`
	}
	clusterLocateJSON struct {
		ChainBlocks      int              `json:"chain_blocks"`
		Nodes            []nodePrefixJSON `json:"nodes"`
		DeepestBlocks    int              `json:"deepest_blocks"`
		DeepestNodes     []string         `json:"deepest_nodes"`
		PoolPrefixBlocks int              `json:"pool_prefix_blocks"`
		AnsweredBy       string           `json:"answered_by"`
	}
	nodePrefixJSON struct {
		Node         string `json:"node"`
		PrefixBlocks int    `json:"prefix_blocks"`
	}
	blocksJSON struct {
		Node   string         `json:"node"`
		Total  uint64         `json:"total"`
		Blocks []blockRefJSON `json:"blocks"`
	}
	blockRefJSON struct {
		Tenant    string `json:"tenant"`
		Namespace string `json:"namespace"`
		Key       string `json:"key"`
	}
	clusterStatsJSON struct {
		Nodes                int          `json:"nodes"`
		LiveNodes            int          `json:"live_nodes"`
		CapacityBytes        uint64       `json:"capacity_bytes"`
		UsedBytes            uint64       `json:"used_bytes"`
		StoredBlocks         uint64       `json:"stored_blocks"`
		MirrorBlocks         uint64       `json:"mirror_blocks"`
		MirrorRevision       int64        `json:"mirror_revision"`
		MirrorRecordsApplied uint64       `json:"mirror_records_applied"`
		MirrorMalformed      uint64       `json:"mirror_malformed"`
		MirrorReloads        uint64       `json:"mirror_reloads"`
		PublishedBatches     uint64       `json:"published_batches"`
		PublishedRecords     uint64       `json:"published_records"`
		PublishedSnapshots   uint64       `json:"published_snapshots"`
		PublishFailures      uint64       `json:"publish_failures"`
		PublishQueued        uint64       `json:"publish_queued"`
		AnsweredBy           string       `json:"answered_by"`
		Tenants              []tenantJSON `json:"tenants"`
	}
	linksJSON struct {
		Node      string     `json:"node"`
		Transport string     `json:"transport"`
		Links     []linkJSON `json:"links"`
	}
	linkJSON struct {
		Peer             string  `json:"peer"`
		BytesPerSecond   float64 `json:"bytes_per_second"`
		RTTSeconds       float64 `json:"rtt_seconds"`
		BandwidthSamples uint64  `json:"bandwidth_samples"`
		RTTSamples       uint64  `json:"rtt_samples"`
		Bytes            uint64  `json:"bytes"`
		IdleSeconds      float64 `json:"idle_seconds"`
	}
)

func clusterNodesCmd(e *env) *cobra.Command {
	var f clientFlags
	c := &cobra.Command{
		Use:   "nodes",
		Short: "List nodes with their state in etcd and in gossip, capacity, use and load",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withAdmin(cmd, func(ctx context.Context, a *api.Admin) error {
				nodes, answeredBy, err := a.Nodes(ctx)
				if err != nil {
					return err
				}
				if f.asJSON {
					out := nodesJSON{AnsweredBy: answeredBy, Nodes: []nodeStatusJSON{}}
					for _, n := range nodes {
						out.Nodes = append(out.Nodes, nodeStatusJSON{ID: n.ID, Addrs: n.Addrs, Zone: n.Zone, Version: n.Version,
							EtcdState: n.EtcdState, GossipState: n.GossipState, CapacityBytes: n.CapacityBytes, UsedBytes: n.UsedBytes,
							Blocks: n.Blocks, PublishedBlocks: n.PublishedBlocks, QueueSeconds: n.Queue.Seconds(),
							PrefillTokensPerSecond: n.PrefillTokensPerSecond, Epoch: n.Epoch})
					}
					return printJSON(e.stdout, out)
				}
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NODE\tADDRESS\tETCD\tGOSSIP\tCAPACITY\tUSED\tBLOCKS\tQUEUE\tPREFILL\tZONE")
				for _, n := range nodes {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", n.ID, n.Addrs["grpc"], n.EtcdState, n.GossipState,
						humanBytes(n.CapacityBytes), humanBytes(n.UsedBytes), n.Blocks, duration(n.Queue), tokensPerSecond(n.PrefillTokensPerSecond), dash(n.Zone))
				}
				return w.Flush()
			})
		},
	}
	adminFlags(c, &f)
	return c
}

func duration(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return d.Round(time.Millisecond).String()
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
node, how many leading blocks it holds, the deepest prefix and who holds it,
and how much of the chain the pool holds anywhere.`,
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
			return f.withAdmin(cmd, func(ctx context.Context, a *api.Admin) error {
				loc, err := a.Locate(ctx, f.tenant, f.namespace, chain)
				if err != nil {
					return err
				}
				if f.asJSON {
					out := clusterLocateJSON{ChainBlocks: loc.ChainBlocks, Nodes: []nodePrefixJSON{}, DeepestBlocks: loc.DeepestBlocks,
						DeepestNodes: loc.DeepestNodes, PoolPrefixBlocks: loc.PoolPrefixBlocks, AnsweredBy: loc.AnsweredBy}
					for _, n := range loc.Nodes {
						out.Nodes = append(out.Nodes, nodePrefixJSON{Node: n.Node, PrefixBlocks: n.Blocks})
					}
					return printJSON(e.stdout, out)
				}
				printLocate(e.stdout, &loc)
				return nil
			})
		},
	}
	adminFlags(c, &f)
	c.Flags().StringVar(&f.tenant, "tenant", "", "tenant (required)")
	c.Flags().StringVar(&f.namespace, "namespace", "", "namespace (required)")
	c.Flags().BoolVar(&f.hex, "hex", false, "--keys are hex")
	chf.register(c)
	return c
}

// printLocate prints the per-node prefix table of a cluster locate.
func printLocate(w io.Writer, loc *api.ClusterLocation) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "NODE\tPREFIX BLOCKS\tOF %d\n", loc.ChainBlocks)
	for _, n := range loc.Nodes {
		bar := strings.Repeat("#", n.Blocks*30/max(loc.ChainBlocks, 1))
		fmt.Fprintf(tw, "%s\t%d\t%s\n", n.Node, n.Blocks, bar)
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
			return f.withAdmin(cmd, func(ctx context.Context, a *api.Admin) error {
				blocks, total, err := a.Blocks(ctx, node, limit)
				if err != nil {
					return err
				}
				if f.asJSON {
					out := blocksJSON{Node: node, Total: total, Blocks: []blockRefJSON{}}
					for _, b := range blocks {
						out.Blocks = append(out.Blocks, blockRefJSON{Tenant: b.Tenant, Namespace: b.Namespace, Key: hex.EncodeToString(b.Key)})
					}
					return printJSON(e.stdout, out)
				}
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "TENANT\tNAMESPACE\tKEY")
				for _, b := range blocks {
					fmt.Fprintf(w, "%s\t%s\t%s\n", b.Tenant, b.Namespace, hex.EncodeToString(b.Key))
				}
				w.Flush()
				fmt.Fprintf(e.stderr, "%d of %d blocks on %s\n", len(blocks), total, node)
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
			return f.withAdmin(cmd, func(ctx context.Context, a *api.Admin) error {
				st, err := a.Stats(ctx)
				if err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(e.stdout, clusterStatsJSON{Nodes: st.Nodes, LiveNodes: st.LiveNodes, CapacityBytes: st.CapacityBytes,
						UsedBytes: st.UsedBytes, StoredBlocks: st.StoredBlocks, MirrorBlocks: st.MirrorBlocks, MirrorRevision: st.MirrorRevision,
						MirrorRecordsApplied: st.MirrorRecordsApplied, MirrorMalformed: st.MirrorMalformed, MirrorReloads: st.MirrorReloads,
						PublishedBatches: st.PublishedBatches, PublishedRecords: st.PublishedRecords, PublishedSnapshots: st.PublishedSnapshots,
						PublishFailures: st.PublishFailures, PublishQueued: st.PublishQueued, AnsweredBy: st.AnsweredBy, Tenants: tenantsJSON(st.Tenants)})
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

func printClusterStats(w io.Writer, st *api.ClusterStats) {
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
while the link is idle), or the seed when nothing was measured yet. The
fetch-or-recompute cost model reads these.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withAdmin(cmd, func(ctx context.Context, a *api.Admin) error {
				node, transport, links, err := a.Links(ctx)
				if err != nil {
					return err
				}
				if f.asJSON {
					out := linksJSON{Node: node, Transport: transport, Links: []linkJSON{}}
					for _, l := range links {
						out.Links = append(out.Links, linkJSON{Peer: l.Peer, BytesPerSecond: l.BytesPerSecond, RTTSeconds: l.RTT.Seconds(),
							BandwidthSamples: l.BandwidthSamples, RTTSamples: l.RTTSamples, Bytes: l.Bytes, IdleSeconds: l.Idle.Seconds()})
					}
					return printJSON(e.stdout, out)
				}
				fmt.Fprintf(e.stdout, "links from %s (transport %s)\n", node, transport)
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "PEER\tBANDWIDTH\tRTT\tSAMPLES\tMOVED\tIDLE")
				for _, l := range links {
					idle := "never measured (seed)"
					if l.Idle >= 0 {
						idle = duration(l.Idle)
					}
					fmt.Fprintf(w, "%s\t%.2f GB/s\t%s\t%d\t%s\t%s\n", l.Peer, l.BytesPerSecond/1e9, duration(l.RTT), l.BandwidthSamples, humanBytes(l.Bytes), idle)
				}
				return w.Flush()
			})
		},
	}
	adminFlags(c, &f)
	return c
}
