package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/admin"
	"github.com/kvpool/kvpool/api/chain"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/metadata/embedded"
	"github.com/kvpool/kvpool/pool"
)

func clusterDemoCmd(e *env) *cobra.Command {
	var blocks, blockTokens int
	var bytesPerToken int64
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run a 3-node cluster on loopback, store prefix chains, show where they are, and stop",
		Long: `demo starts an embedded etcd and three daemons on loopback, in this process. Engines
on different nodes store the KV blocks of prompts as prefix chains (vLLM's
sha256_cbor keys): one writes in place through shared memory, the others over
the TCP data channel. Then a new request that shares a prefix asks any daemon
where its blocks are: the per-node locality table, the deepest holder, and what
the pool holds anywhere. It fetches the blocks, verifies every byte, prints the
cluster stats, stops everything and exits 0.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if blocks < 4 || blockTokens < 1 || bytesPerToken < 1 {
				return usagef("want --blocks ≥ 4, --block-tokens ≥ 1, --kv-bytes-per-token ≥ 1")
			}
			return runDemo(cmd.Context(), e, blocks, blockTokens, bytesPerToken)
		},
	}
	c.Flags().IntVar(&blocks, "blocks", 12, "blocks in the longest chain")
	c.Flags().IntVar(&blockTokens, "block-tokens", 16, "tokens per block")
	c.Flags().Int64Var(&bytesPerToken, "kv-bytes-per-token", 131072, "KV bytes per token of the stored blocks (131072 is Llama-3-8B in bf16, the model the plan assumes)")
	return c
}

// demoCluster is what runDemo starts and must stop.
type demoCluster struct {
	etcd  *embedded.Etcd
	nodes []*pool.Node
	stops []func()
}

func (d *demoCluster) close() {
	for i := len(d.stops) - 1; i >= 0; i-- {
		d.stops[i]()
	}
}

// startDemoCluster starts an embedded etcd and n daemons on loopback, in
// this process, each holding capacity bytes; close stops them all.
func startDemoCluster(ctx context.Context, dir string, n int, capacity, maxBlock int64, log *slog.Logger) (*demoCluster, error) {
	d := &demoCluster{}
	e, err := embedded.Start(embedded.Config{Dir: filepath.Join(dir, "etcd"), ClientURL: "http://127.0.0.1:0", Fast: true})
	if err != nil {
		return nil, err
	}
	d.etcd = e
	d.stops = append(d.stops, func() { e.Close() })
	for i := range n {
		cli, err := metadata.NewClient([]string{e.ClientURL()})
		if err != nil {
			d.close()
			return nil, err
		}
		d.stops = append(d.stops, func() { cli.Close() })
		cfg := pool.DefaultConfig(fmt.Sprintf("node-%d", i), capacity)
		cfg.ListenAddr = "127.0.0.1:0"
		cfg.ShmSocket = filepath.Join(dir, fmt.Sprintf("node-%d.sock", i))
		cfg.MaxBlockBytes = maxBlock
		cfg.Etcd, cfg.LeaseTTL = cli, 2*time.Second
		cfg.Zone = []string{"rack-a", "rack-a", "rack-b"}[i%3]
		cfg.Logger = log
		n, err := pool.New(cfg)
		if err != nil {
			d.close()
			return nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- n.Run(rctx) }()
		d.stops = append(d.stops, func() { cancel(); <-done; n.Close() })
		<-n.Ready()
		d.nodes = append(d.nodes, n)
	}
	return d, nil
}

func runDemo(ctx context.Context, e *env, blocks, blockTokens int, bytesPerToken int64) error {
	out := e.stdout
	blockBytes := int64(blockTokens) * bytesPerToken
	capacity := (int64(blocks)*blockBytes*3/(64<<20) + 1) * (64 << 20)
	dir, err := os.MkdirTemp("", "kvpool-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	log := slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	start := time.Now()
	cl, err := startDemoCluster(ctx, dir, 3, capacity, max(blockBytes, 1<<20), log)
	if err != nil {
		return err
	}
	defer cl.close()
	fmt.Fprintf(out, "embedded etcd at %s; 3 daemons up in %v:\n", cl.etcd.ClientURL(), time.Since(start).Round(time.Millisecond))
	for _, n := range cl.nodes {
		fmt.Fprintf(out, "  %s  %s  %s arena  shm %s\n", n.ID(), n.Addr(), humanBytes(uint64(capacity)), filepath.Base(n.ShmSocket()))
	}

	clients := make([]*api.Client, 3)
	for i, n := range cl.nodes {
		path := api.PathData
		if i == 0 {
			path = api.PathShm // node-0's engine is on its host: in place
		}
		if clients[i], err = api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: path}); err != nil {
			return err
		}
		defer clients[i].Close()
	}

	// Three prompts share a system prompt; each engine computed some.
	rng := rand.New(rand.NewPCG(1, 2))
	token := func() uint32 { return uint32(rng.IntN(128256)) }
	system := make([]uint32, blocks*blockTokens)
	for i := range system {
		system[i] = token()
	}
	chainCfg := chain.Config{Scheme: chain.SHA256CBOR, BlockTokens: blockTokens, Seed: "0"}
	keys, err := chain.Keys(chainCfg, system)
	if err != nil {
		return err
	}
	const tenant, namespace = "demo", "llama3-8b.bf16.tp1"
	kv := make([][]byte, len(keys))
	for i := range kv {
		kv[i] = make([]byte, blockBytes)
		for j := 0; j+8 <= len(kv[i]); j += 8 {
			x := rng.Uint64()
			for b := range 8 {
				kv[i][j+b] = byte(x >> (8 * b))
			}
		}
	}
	stored := []struct {
		node, from, to int
		how            string
	}{
		{0, 0, blocks, "written in place through shared memory"},
		{1, 0, blocks / 2, "sent over the TCP data channel"},
		{2, 0, blocks / 4, "sent over the TCP data channel"},
	}
	fmt.Fprintf(out, "\nprefix chain: %d blocks of %d tokens, %s of KV each (vLLM sha256_cbor keys, seed \"0\")\n", blocks, blockTokens, humanBytes(uint64(blockBytes)))
	for _, s := range stored {
		t0 := time.Now()
		for i := s.from; i < s.to; i++ {
			k := api.BlockKey{Tenant: tenant, Namespace: namespace, Key: keys[i]}
			if s.node == 0 {
				r, err := clients[0].Reserve(ctx, k, len(kv[i]))
				if err != nil {
					return err
				}
				copy(r.Bytes(), kv[i]) // an engine's DMA would land here
				if _, err := r.Commit(ctx); err != nil {
					return err
				}
			} else if err := clients[s.node].Put(ctx, k, kv[i]); err != nil {
				return err
			}
		}
		fmt.Fprintf(out, "  node-%d stores blocks %d..%d  (%s, %v)\n", s.node, s.from, s.to-1, s.how, time.Since(t0).Round(time.Microsecond))
	}

	// A new request: the system prompt plus a question nobody has seen.
	request := append(append([]uint32(nil), system...), make([]uint32, 2*blockTokens)...)
	for i := len(system); i < len(request); i++ {
		request[i] = token()
	}
	rkeys, err := chain.Keys(chainCfg, request)
	if err != nil {
		return err
	}
	adm := admin.New(clients[2])
	// Locations reach every mirror, and gossip every daemon, within
	// milliseconds of a put: wait for the cluster to settle.
	want := map[string]int{"node-0": blocks, "node-1": blocks / 2, "node-2": blocks / 4}
	var loc admin.Location
	settled := func() (bool, error) {
		if loc, err = adm.Locate(ctx, tenant, namespace, rkeys); err != nil {
			return false, err
		}
		for _, np := range loc.Nodes {
			if want[np.Node] != np.Blocks {
				return false, nil
			}
		}
		nodes, err := adm.Nodes(ctx)
		if err != nil {
			return false, err
		}
		for _, n := range nodes.Nodes {
			if n.GossipState != "alive" || n.Blocks != uint64(want[n.ID]) {
				return false, nil
			}
		}
		return len(loc.Nodes) == 3, nil
	}
	waitStart := time.Now()
	if err := await("every mirror and gossip to agree", settled); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nevery mirror and gossip agree %v after the last put\n", time.Since(waitStart).Round(time.Millisecond))
	fmt.Fprintf(out, "\nnew request: %d tokens = %d blocks; asked node-2 where they are (kvpool cluster locate):\n", len(request), len(rkeys))
	printLocate(out, &loc)

	// Where should the request run, and should that node fetch or
	// recompute? The engines report their queues (node-0 holds the most
	// and is busiest); node-2 plans against the live cluster, with every
	// link at a fast and at a slow what-if bandwidth: the decision flips.
	queues := []time.Duration{300 * time.Millisecond, 40 * time.Millisecond, 0}
	for i, q := range queues {
		if err := clients[i].ReportLoad(ctx, api.Load{Queue: q}); err != nil {
			return err
		}
	}
	planReq := api.PlanRequest{Tenant: tenant, Namespace: namespace, Keys: rkeys, Model: "llama3-8b",
		BlockTokens: blockTokens, PromptTokens: len(request)}
	if err := await("the engines' load to reach node-2", func() (bool, error) {
		plan, err := clients[2].Plan(ctx, planReq)
		seen := 0
		for _, np := range plan.Nodes {
			for i, q := range queues {
				if np.Node == cl.nodes[i].ID() && np.Queue == q {
					seen++
				}
			}
		}
		return seen == len(queues), err
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nthe engines report their queues (node-0 %v, node-1 %v, node-2 idle); node-2 plans the request as Llama-3-8B on H200s (kvpool chain plan --server):\n", queues[0], queues[1])
	for _, whatIf := range []struct {
		gbps float64
		what string
	}{{25, "fast links, 25 GB/s (200 Gbit/s RDMA)"}, {0.25, "slow links, 0.25 GB/s (2 Gbit/s)"}} {
		planReq.LinkBytesPerSecond = whatIf.gbps * 1e9
		plan, err := clients[2].Plan(ctx, planReq)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\n%s:\n", whatIf.what)
		printPlan(out, &plan)
		win := plan.Nodes[0]
		if win.Plan == "recompute" {
			fmt.Fprintf(out, "=> recompute wins: %s recomputes in %.2f ms; fetching from %s would take %.2f ms\n",
				win.Node, ms(win.Recompute), dash(win.Source), ms(win.FetchTotal))
		} else {
			fmt.Fprintf(out, "=> fetch wins: %s loads blocks %d..%d from %s (%s), %.2f ms against %.2f ms recomputing\n",
				win.Node, max(win.SplitBlocks, win.LocalBlocks), win.PoolBlocks-1, win.Source, win.Plan,
				ms(win.Total), ms(win.RecomputeTotal))
		}
	}

	// The request goes to node-2, which holds a quarter: it fetches the
	// rest from node-0 over the tcp transport (a measured transfer) and
	// verifies every byte.
	t0 := time.Now()
	have := blocks / 4
	res, err := clients[2].Fetch(ctx, tenant, namespace, rkeys[:blocks], 0)
	if err != nil {
		return err
	}
	sources := map[string][]int{}
	for i, r := range res {
		if r.Err != nil {
			return fmt.Errorf("demo: fetch block %d: %w", i, r.Err)
		}
		if r.Source != "" {
			sources[r.Source] = append(sources[r.Source], i)
		}
	}
	took := time.Since(t0)
	buf := make([]byte, blockBytes)
	for i := range blocks {
		m, err := clients[2].Get(ctx, api.BlockKey{Tenant: tenant, Namespace: namespace, Key: rkeys[i]}, buf)
		if err != nil {
			return err
		}
		if !bytes.Equal(buf[:m], kv[i]) {
			return fmt.Errorf("demo: block %d came back different", i)
		}
	}
	fmt.Fprintf(out, "\nnode-2 holds blocks 0..%d and fetches %d..%d in %v, every byte checked:\n", have-1, have, blocks-1, took.Round(time.Microsecond))
	for _, n := range cl.nodes {
		if got := sources[n.ID()]; len(got) > 0 {
			link := cl.nodes[2].Links().Estimate(n.ID(), time.Now())
			fmt.Fprintf(out, "  %d blocks from %s; that link's estimate is now %.2f GB/s, rtt %v (kvpool cluster links)\n",
				len(got), n.ID(), link.BytesPerSecond/1e9, link.RTT.Round(time.Microsecond))
		}
	}

	// Blocks are immutable.
	bad := bytes.Clone(kv[0])
	bad[0] ^= 1
	err = clients[1].Put(ctx, api.BlockKey{Tenant: tenant, Namespace: namespace, Key: keys[0]}, bad)
	fmt.Fprintf(out, "\noverwriting block 0 on node-1 with other bytes: %v\n", err)
	if err == nil {
		return errors.New("demo: an immutable block was overwritten")
	}

	st, err := adm.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\ncluster stats (kvpool cluster stats):")
	printClusterStats(out, &st)
	nodes, err := adm.Nodes(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\nnodes (kvpool cluster nodes):")
	for _, n := range nodes.Nodes {
		fmt.Fprintf(out, "  %s  etcd %s, gossip %s, %s, %d blocks published\n", n.ID, n.EtcdState, n.GossipState, dash(n.Zone), n.PublishedBlocks)
	}
	fmt.Fprintln(out, "\nstopping the daemons and etcd")
	for _, c := range clients {
		c.Close()
	}
	cl.close()
	cl.stops = nil
	fmt.Fprintln(out, "demo ok")
	return nil
}

// await polls cond until it holds or fails, for up to 15 s: through etcd
// and gossip the cluster converges within milliseconds.
func await(what string, cond func() (bool, error)) error {
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if ok, err := cond(); ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: waited 15 s for %s", what)
		}
	}
}
