package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/pool"
)

func demoCmd(e *env) *cobra.Command {
	var blocks, blockTokens int
	var bytesPerToken int64
	c := &cobra.Command{
		Use:   "demo",
		Short: "Start a node, store a prompt's prefix chain, find and fetch it, and exit",
		Long: `demo starts a node in this process on a free loopback port, plays an inference
engine that stores the KV blocks of one prompt as a prefix chain (vLLM's
sha256_cbor keys), then a second request that shares the prefix: it locates the
cached blocks, fetches them through shared memory and through the TCP data
channel, verifies every byte, and prints what happened. It exits 0 when all
of that worked.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), e, blocks, blockTokens, bytesPerToken)
		},
	}
	c.Flags().IntVar(&blocks, "blocks", 8, "blocks in the first prompt")
	c.Flags().IntVar(&blockTokens, "block-tokens", 16, "tokens per block")
	c.Flags().Int64Var(&bytesPerToken, "kv-bytes-per-token", 131072, "KV bytes per token (131072 is Llama-3-8B in bf16)")
	return c
}

func runDemo(ctx context.Context, e *env, blocks, blockTokens int, bytesPerToken int64) error {
	if blocks < 2 || blockTokens < 1 || bytesPerToken < 1 {
		return usageError{error: fmt.Errorf("want --blocks ≥ 2, --block-tokens ≥ 1, --kv-bytes-per-token ≥ 1")}
	}
	out := e.stdout
	blockBytes := int64(blockTokens) * bytesPerToken
	capacity := (int64(blocks)*blockBytes*2/(64<<20) + 1) * (64 << 20)
	dir, err := os.MkdirTemp("", "kvpool-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	cfg := pool.DefaultConfig("demo-node", capacity)
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.ShmSocket = filepath.Join(dir, "shm.sock")
	cfg.MaxBlockBytes = max(blockBytes, 1<<20)
	cfg.Logger = slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n, err := pool.New(cfg)
	if err != nil {
		return err
	}
	defer n.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- n.Run(runCtx) }()
	defer func() { stop(); <-done }()
	<-n.Ready()
	fmt.Fprintf(out, "node %q serving on %s: %s shared-memory arena, same-host socket %s\n\n", n.ID(), n.Addr(), humanBytes(uint64(capacity)), n.ShmSocket())

	engine, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String()})
	if err != nil {
		return err
	}
	defer engine.Close()
	remote, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathData})
	if err != nil {
		return err
	}
	defer remote.Close()

	// Request 1: a prompt of `blocks` full blocks plus a partial one.
	rng := rand.New(rand.NewPCG(1, 2))
	prompt := make([]uint32, blocks*blockTokens+blockTokens/2)
	for i := range prompt {
		prompt[i] = uint32(rng.IntN(128256))
	}
	chainCfg := api.ChainConfig{Scheme: api.ChainSHA256CBOR, BlockTokens: blockTokens, Seed: "0"}
	keys, err := api.ChainKeys(chainCfg, prompt)
	if err != nil {
		return err
	}
	const tenant, namespace = "demo", "llama3-8b.bf16.tp1"
	fmt.Fprintf(out, "request 1: %d tokens -> %d full blocks of %d tokens (%s of KV each), keys by vLLM sha256_cbor, seed \"0\"\n",
		len(prompt), len(keys), blockTokens, humanBytes(uint64(blockBytes)))
	kv := make([][]byte, len(keys))
	start := time.Now()
	for i, k := range keys {
		kv[i] = make([]byte, blockBytes)
		for j := range kv[i] {
			kv[i][j] = byte(rng.Uint32())
		}
		// Written in place: the engine reserves space in the node's
		// segment, fills it (a GPU would DMA here) and commits.
		r, err := engine.Reserve(ctx, api.BlockKey{Tenant: tenant, Namespace: namespace, Key: k}, len(kv[i]))
		if err != nil {
			return err
		}
		copy(r.Bytes(), kv[i])
		if _, err := r.Commit(ctx); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "  stored %d blocks via %s in %v (reserve, write in place, commit; the node checksums at commit)\n", len(keys), engine.Path(), time.Since(start).Round(time.Microsecond))
	for i := 0; i < min(3, len(keys)); i++ {
		fmt.Fprintf(out, "    block %d  key %x…\n", i, keys[i][:8])
	}

	// Request 2 shares the first half of the prompt, then diverges.
	shared := blocks / 2
	prompt2 := append([]uint32(nil), prompt[:shared*blockTokens]...)
	for range (blocks - shared + 1) * blockTokens {
		prompt2 = append(prompt2, uint32(rng.IntN(128256)))
	}
	keys2, err := api.ChainKeys(chainCfg, prompt2)
	if err != nil {
		return err
	}
	hit, err := remote.Locate(ctx, tenant, namespace, keys2)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nrequest 2: %d tokens sharing the first %d blocks -> Locate: node holds %d of its %d leading blocks\n", len(prompt2), shared, hit, len(keys2))
	if hit != shared {
		return fmt.Errorf("demo: expected a %d-block prefix hit, got %d", shared, hit)
	}

	buf := make([]byte, blockBytes)
	for _, cl := range []struct {
		name string
		c    *api.Client
	}{{"shared memory", engine}, {"tcp data channel", remote}} {
		start := time.Now()
		for i := range hit {
			k := api.BlockKey{Tenant: tenant, Namespace: namespace, Key: keys2[i]}
			m, err := cl.c.Get(ctx, k, buf)
			if err != nil {
				return err
			}
			if !bytes.Equal(buf[:m], kv[i]) {
				return fmt.Errorf("demo: block %d came back different", i)
			}
		}
		el := time.Since(start)
		fmt.Fprintf(out, "  fetched the %d cached blocks over %-16s in %9v (%.2f GB/s), every byte verified\n", hit, cl.name, el.Round(time.Microsecond), float64(int64(hit)*blockBytes)/el.Seconds()/1e9)
	}
	v, err := engine.View(ctx, api.BlockKey{Tenant: tenant, Namespace: namespace, Key: keys2[0]})
	if err != nil {
		return err
	}
	verr := v.Verify()
	v.Close()
	if verr != nil {
		return verr
	}
	fmt.Fprintf(out, "  zero-copy view of block 0: %s read in place from the segment, CRC-32C %08x ok\n", humanBytes(uint64(len(v.Bytes()))), v.CRC())
	fmt.Fprintf(out, "  the other %d blocks are missing: the engine recomputes them (later: or fetches them from a peer)\n", len(keys2)-hit)

	// Immutability and errors.
	k0 := api.BlockKey{Tenant: tenant, Namespace: namespace, Key: keys[0]}
	bad := bytes.Clone(kv[0])
	bad[0] ^= 1
	err = remote.Put(ctx, k0, bad)
	fmt.Fprintf(out, "\nput of different bytes under block 0's key: %v\n", err)
	if err == nil {
		return fmt.Errorf("demo: overwrite of an immutable block succeeded")
	}

	st, err := remote.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nnode stats: %d blocks, %s stored, %s of %s used, largest free run %s, fragmentation external %.3f internal %.3f\n",
		st.GetBlocks(), humanBytes(st.GetStoredBytes()), humanBytes(st.GetUsedBytes()), humanBytes(st.GetCapacityBytes()),
		humanBytes(st.GetLargestFreeBytes()), st.GetExternalFragmentation(), st.GetInternalFragmentation())
	fmt.Fprintln(out, "demo ok")
	return nil
}
