package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

func adminCmd(e *env) *cobra.Command {
	c := &cobra.Command{
		Use:   "admin",
		Short: "Ask a daemon about the cluster: nodes, block locality, blocks, stats, links, tenant policies",
		Long: `admin asks any daemon (--server) about the whole cluster. Answers come from the
daemon's mirror of etcd (where every block is) and from gossip (which nodes are
alive, and their load). Tables by default, --json for machines.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{error: fmt.Errorf("admin needs a subcommand: nodes, locate, blocks, stats, links or policy")}
		},
	}
	c.AddCommand(adminNodesCmd(e), adminLocateCmd(e), adminBlocksCmd(e), adminStatsCmd(e), adminLinksCmd(e), adminPolicyCmd(e))
	return c
}

// adminFlags are shared by the admin commands.
type adminFlags struct {
	server  string
	asJSON  bool
	timeout time.Duration
}

func (f *adminFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.server, "server", "127.0.0.1:7070", "daemon address (host:port)")
	c.Flags().BoolVar(&f.asJSON, "json", false, "print machine-readable JSON")
	c.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "give up after this long")
}

func (f *adminFlags) call(cmd *cobra.Command, fn func(ctx context.Context, a kvpoolv1.AdminServiceClient) error) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	defer cancel()
	c, err := api.Dial(ctx, api.ClientConfig{Server: f.server, Path: api.PathGRPC})
	if err != nil {
		return err
	}
	defer c.Close()
	if err := fn(ctx, kvpoolv1.NewAdminServiceClient(c.Conn())); err != nil {
		return api.FromStatus(err)
	}
	return nil
}

func adminNodesCmd(e *env) *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "nodes",
		Short: "List nodes with their state in etcd and in gossip, capacity, use and load",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.call(cmd, func(ctx context.Context, a kvpoolv1.AdminServiceClient) error {
				r, err := a.ListNodes(ctx, &kvpoolv1.ListNodesRequest{})
				if err != nil {
					return err
				}
				if f.asJSON {
					var out []map[string]any
					for _, n := range r.GetNodes() {
						out = append(out, map[string]any{
							"id": n.GetNodeId(), "addrs": n.GetAddrs(), "zone": n.GetZone(), "version": n.GetVersion(),
							"etcd_state": n.GetEtcdState(), "gossip_state": n.GetGossipState(),
							"capacity_bytes": n.GetCapacityBytes(), "used_bytes": n.GetUsedBytes(), "blocks": n.GetStoredBlocks(),
							"published_blocks": n.GetPublishedBlocks(), "queue_seconds": n.GetQueueSeconds(),
							"prefill_tokens_per_second": n.GetPrefillTokensPerSecond(), "epoch": n.GetEpoch(),
						})
					}
					return printJSON(e.stdout, map[string]any{"answered_by": r.GetAnsweredBy(), "nodes": out})
				}
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NODE\tADDRESS\tETCD\tGOSSIP\tCAPACITY\tUSED\tBLOCKS\tQUEUE\tPREFILL\tZONE")
				for _, n := range r.GetNodes() {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", n.GetNodeId(), n.GetAddrs()["grpc"], n.GetEtcdState(), n.GetGossipState(),
						humanBytes(n.GetCapacityBytes()), humanBytes(n.GetUsedBytes()), n.GetStoredBlocks(),
						seconds(n.GetQueueSeconds()), tokensPerSecond(n.GetPrefillTokensPerSecond()), dash(n.GetZone()))
				}
				return w.Flush()
			})
		},
	}
	f.register(c)
	return c
}

func seconds(s float64) string {
	if s == 0 {
		return "-"
	}
	return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
}

func tokensPerSecond(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f tok/s", v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// chainFlags name a prefix chain: its keys (--keys, text or --hex), or a
// prompt's tokens (--tokens-file) hashed as the engine hashes them.
type chainFlags struct {
	keys        []string
	tokensFile  string
	scheme      string
	seed        string
	blockTokens int
}

func (f *chainFlags) register(c *cobra.Command, cf *clientFlags) {
	fl := c.Flags()
	if fl.Lookup("hex") == nil {
		fl.BoolVar(&cf.hex, "hex", false, "--keys are hex")
	}
	fl.StringSliceVar(&f.keys, "keys", nil, "the chain's keys, block 0 first, comma-separated")
	fl.StringVar(&f.tokensFile, "tokens-file", "", "file of the prompt's token ids ('-' for stdin)")
	fl.IntVar(&f.blockTokens, "block-tokens", 16, "tokens per block")
	fl.StringVar(&f.scheme, "scheme", "sha256_cbor", "chain hash, with --tokens-file: sha256_cbor (vLLM) or sha256")
	fl.StringVar(&f.seed, "seed", "0", "chain seed, with --tokens-file (vLLM: PYTHONHASHSEED)")
}

// chain returns the chain and, with --tokens-file, the prompt's length in
// tokens (0 with --keys). Errors are usage errors.
func (f *chainFlags) chain(e *env, cf *clientFlags) ([][]byte, int, error) {
	if f.blockTokens <= 0 {
		return nil, 0, usageError{error: fmt.Errorf("--block-tokens %d: want a positive count", f.blockTokens)}
	}
	switch {
	case f.tokensFile != "" && len(f.keys) > 0:
		return nil, 0, usageError{error: fmt.Errorf("give --keys or --tokens-file, not both")}
	case f.tokensFile != "":
		s, err := api.ParseChainScheme(f.scheme)
		if err != nil {
			return nil, 0, usageError{error: err}
		}
		tokens, err := readTokensFile(e, f.tokensFile)
		if err != nil {
			return nil, 0, usageError{error: err}
		}
		chain, err := api.ChainKeys(api.ChainConfig{Scheme: s, BlockTokens: f.blockTokens, Seed: f.seed}, tokens)
		if err != nil {
			return nil, 0, err
		}
		if len(chain) == 0 {
			return nil, 0, usageError{error: fmt.Errorf("%d tokens make no full block of %d", len(tokens), f.blockTokens)}
		}
		return chain, len(tokens), nil
	}
	chain, err := cf.keys(f.keys)
	if err != nil {
		return nil, 0, usageError{error: err}
	}
	return chain, 0, nil
}

func adminLocateCmd(e *env) *cobra.Command {
	var f adminFlags
	var cf clientFlags
	var chf chainFlags
	c := &cobra.Command{
		Use:   "locate",
		Short: "Show how many leading blocks of a prefix chain each node holds",
		Long: `locate asks for one prefix chain: either its keys (--keys, block 0 first, text or
--hex), or the prompt's tokens (--tokens-file with --block-tokens, hashed with
--scheme and --seed as the engine hashes them). It prints, for every live
node, how many leading blocks it holds, the deepest prefix and who holds it,
and how much of the chain the pool holds anywhere.`,
		Example: `  kvpool admin locate --tenant acme --namespace llama3-8b --tokens-file prompt.txt --block-tokens 16
  kvpool admin locate --tenant acme --namespace llama3-8b --hex --keys 9f3a...,77c1...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cf.checkNames(); err != nil {
				return usageError{error: err}
			}
			chain, _, err := chf.chain(e, &cf)
			if err != nil {
				return err
			}
			return f.call(cmd, func(ctx context.Context, a kvpoolv1.AdminServiceClient) error {
				r, err := a.ClusterLocate(ctx, &kvpoolv1.ClusterLocateRequest{Tenant: cf.tenant, Namespace: cf.namespace, Keys: chain})
				if err != nil {
					return err
				}
				if f.asJSON {
					nodes := []map[string]any{}
					for _, n := range r.GetNodes() {
						nodes = append(nodes, map[string]any{"node": n.GetNodeId(), "prefix_blocks": n.GetPrefixBlocks()})
					}
					return printJSON(e.stdout, map[string]any{"chain_blocks": r.GetChainBlocks(), "nodes": nodes,
						"deepest_blocks": r.GetDeepestBlocks(), "deepest_nodes": r.GetDeepestNodes(),
						"pool_prefix_blocks": r.GetPoolPrefixBlocks(), "answered_by": r.GetAnsweredBy()})
				}
				printLocate(e.stdout, r)
				return nil
			})
		},
	}
	f.register(c)
	c.Flags().StringVar(&cf.tenant, "tenant", "", "tenant (required)")
	c.Flags().StringVar(&cf.namespace, "namespace", "", "namespace (required)")
	chf.register(c, &cf)
	return c
}

func readTokensFile(e *env, path string) ([]uint32, error) {
	var in io.Reader = e.stdin
	if path != "-" {
		fh, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer fh.Close()
		in = fh
	}
	return readTokens(in)
}

// printLocate prints the per-node prefix table of a ClusterLocate answer.
func printLocate(w io.Writer, r *kvpoolv1.ClusterLocateResponse) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "NODE\tPREFIX BLOCKS\tOF %d\n", r.GetChainBlocks())
	for _, n := range r.GetNodes() {
		bar := strings.Repeat("#", int(n.GetPrefixBlocks()*30/max(r.GetChainBlocks(), 1)))
		fmt.Fprintf(tw, "%s\t%d\t%s\n", n.GetNodeId(), n.GetPrefixBlocks(), bar)
	}
	tw.Flush()
	fmt.Fprintf(w, "deepest prefix: %d blocks on %s\n", r.GetDeepestBlocks(), dash(strings.Join(r.GetDeepestNodes(), ", ")))
	fmt.Fprintf(w, "held anywhere in the pool: %d leading blocks\n", r.GetPoolPrefixBlocks())
}

func adminBlocksCmd(e *env) *cobra.Command {
	var f adminFlags
	var node string
	var limit uint32
	c := &cobra.Command{
		Use:   "blocks",
		Short: "List the blocks a node has published",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := api.ValidateName("--node", node); err != nil {
				return usageError{error: err}
			}
			return f.call(cmd, func(ctx context.Context, a kvpoolv1.AdminServiceClient) error {
				r, err := a.ListBlocks(ctx, &kvpoolv1.ListBlocksRequest{NodeId: node, Limit: limit})
				if err != nil {
					return err
				}
				if f.asJSON {
					blocks := []map[string]any{}
					for _, b := range r.GetBlocks() {
						blocks = append(blocks, map[string]any{"tenant": b.GetTenant(), "namespace": b.GetNamespace(), "key": hex.EncodeToString(b.GetKey())})
					}
					return printJSON(e.stdout, map[string]any{"node": node, "total": r.GetTotal(), "blocks": blocks})
				}
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "TENANT\tNAMESPACE\tKEY")
				for _, b := range r.GetBlocks() {
					fmt.Fprintf(w, "%s\t%s\t%s\n", b.GetTenant(), b.GetNamespace(), hex.EncodeToString(b.GetKey()))
				}
				w.Flush()
				fmt.Fprintf(e.stderr, "%d of %d blocks on %s\n", len(r.GetBlocks()), r.GetTotal(), node)
				return nil
			})
		},
	}
	f.register(c)
	c.Flags().StringVar(&node, "node", "", "node id (required)")
	c.Flags().Uint32Var(&limit, "limit", 1000, "most blocks to list")
	return c
}

func adminStatsCmd(e *env) *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "stats",
		Short: "Summarize the cluster and the answering daemon's metadata work",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.call(cmd, func(ctx context.Context, a kvpoolv1.AdminServiceClient) error {
				r, err := a.ClusterStats(ctx, &kvpoolv1.ClusterStatsRequest{})
				if err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(e.stdout, map[string]any{
						"nodes": r.GetNodes(), "live_nodes": r.GetLiveNodes(), "capacity_bytes": r.GetCapacityBytes(),
						"used_bytes": r.GetUsedBytes(), "stored_blocks": r.GetStoredBlocks(), "mirror_blocks": r.GetMirrorBlocks(),
						"mirror_revision": r.GetMirrorRevision(), "mirror_records_applied": r.GetMirrorRecordsApplied(),
						"mirror_malformed": r.GetMirrorMalformed(), "mirror_reloads": r.GetMirrorReloads(),
						"published_batches": r.GetPublishedBatches(), "published_records": r.GetPublishedRecords(),
						"published_snapshots": r.GetPublishedSnapshots(), "publish_failures": r.GetPublishFailures(),
						"publish_queued": r.GetPublishQueued(), "answered_by": r.GetAnsweredBy(),
						"tenants": tenantsJSON(r.GetTenants()),
					})
				}
				printClusterStats(e.stdout, r)
				printTenants(e.stdout, r.GetAnsweredBy(), r.GetTenants())
				return nil
			})
		},
	}
	f.register(c)
	return c
}

func printClusterStats(w io.Writer, r *kvpoolv1.ClusterStatsResponse) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "nodes\t%d (%d alive in gossip)\n", r.GetNodes(), r.GetLiveNodes())
	fmt.Fprintf(tw, "capacity\t%s\n", humanBytes(r.GetCapacityBytes()))
	fmt.Fprintf(tw, "used\t%s in %d blocks\n", humanBytes(r.GetUsedBytes()), r.GetStoredBlocks())
	fmt.Fprintf(tw, "mirror on %s\t%d blocks at etcd revision %d, %d records applied, %d malformed skipped, %d reloads\n",
		r.GetAnsweredBy(), r.GetMirrorBlocks(), r.GetMirrorRevision(), r.GetMirrorRecordsApplied(), r.GetMirrorMalformed(), r.GetMirrorReloads())
	fmt.Fprintf(tw, "published by %s\t%d records in %d batches, %d snapshots, %d queued, %d etcd failures\n",
		r.GetAnsweredBy(), r.GetPublishedRecords(), r.GetPublishedBatches(), r.GetPublishedSnapshots(), r.GetPublishQueued(), r.GetPublishFailures())
	tw.Flush()
}

func adminLinksCmd(e *env) *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "links",
		Short: "Show the daemon's measured bandwidth and latency to each peer",
		Long: `links shows, for each peer, the bandwidth and round trip the daemon measured on
real transfers (a moving average that decays back toward the configured seed
while the link is idle), or the seed when nothing was measured yet. The
fetch-or-recompute cost model reads these.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.call(cmd, func(ctx context.Context, a kvpoolv1.AdminServiceClient) error {
				r, err := a.ListLinks(ctx, &kvpoolv1.ListLinksRequest{})
				if err != nil {
					return err
				}
				if f.asJSON {
					links := []map[string]any{}
					for _, l := range r.GetLinks() {
						links = append(links, map[string]any{"peer": l.GetPeer(), "bytes_per_second": l.GetBytesPerSecond(), "rtt_seconds": l.GetRttSeconds(),
							"bandwidth_samples": l.GetBandwidthSamples(), "rtt_samples": l.GetRttSamples(), "bytes": l.GetBytes(), "idle_seconds": l.GetIdleSeconds()})
					}
					return printJSON(e.stdout, map[string]any{"node": r.GetNodeId(), "transport": r.GetTransport(), "links": links})
				}
				fmt.Fprintf(e.stdout, "links from %s (transport %s)\n", r.GetNodeId(), r.GetTransport())
				w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "PEER\tBANDWIDTH\tRTT\tSAMPLES\tMOVED\tIDLE")
				for _, l := range r.GetLinks() {
					idle, samples := "never measured (seed)", fmt.Sprint(l.GetBandwidthSamples())
					if l.GetIdleSeconds() >= 0 {
						idle = seconds(l.GetIdleSeconds())
					}
					fmt.Fprintf(w, "%s\t%.2f GB/s\t%s\t%s\t%s\t%s\n", l.GetPeer(), l.GetBytesPerSecond()/1e9, seconds(l.GetRttSeconds()), samples, humanBytes(l.GetBytes()), idle)
				}
				return w.Flush()
			})
		},
	}
	f.register(c)
	return c
}
