package test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/test/cluster"
)

// A block that node-0 holds only on its disk tier is still on the map,
// and a peer's Fetch gets it: node-0 promotes it into memory, then serves
// it. Plan prices node-0's own disk blocks at its disk's read rate.
func TestPeerFetchesAnotherNodesDiskBlocks(t *testing.T) {
	dir := t.TempDir()
	c := cluster.New(t, cluster.Config{Nodes: 2, CapacityBytes: 16 << 20, Mutate: func(i int, pc *pool.Config) {
		if i == 0 {
			pc.DiskDir, pc.DiskCapacityBytes = filepath.Join(dir, "disk"), 256<<20
			pc.DiskMaxPendingBytes = 64 << 20 // never declined: each block is offered once
		}
	}})
	ctx := context.Background()
	const size = 1 << 20
	src := c.Client(0, api.PathData)
	keys := chainKeys(t, 4, 8)
	putBlocks(t, src, keys, size)
	buf := make([]byte, size)
	for _, k := range keys {
		for range 2 { // the default admission: read twice
			if _, err := src.Get(ctx, api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k}, buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	tier := c.Nodes[0].Node.Disk()
	deadline := time.Now().Add(20 * time.Second)
	for tier.Stats().Spilled < uint64(len(keys)) {
		if time.Now().After(deadline) {
			t.Fatalf("disk after 20 s: %+v", tier.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Fill node-0's memory with other blocks until the chain is on disk
	// only.
	for i := 0; ; i++ {
		if held, memory, err := src.LocateTiers(ctx, "acme", "llama3-8b", keys); err != nil || held != len(keys) {
			t.Fatalf("node-0 holds %d of the chain (%v)", held, err)
		} else if memory == 0 {
			break
		}
		if i > 64 {
			t.Fatal("the chain is still in memory after 64 MiB of other puts")
		}
		if err := src.Put(ctx, api.BlockKey{Tenant: "acme", Namespace: "other", Key: fmt.Appendf(nil, "o%d", i)}, blockValue(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	// node-0's own plan: the chain is local, on disk, loaded at the
	// disk's measured rate.
	ans, err := c.Nodes[0].Node.Plan(pool.PlanQuery{Tenant: "acme", Namespace: "llama3-8b", Keys: keys, BlockTokens: 16, Candidates: []string{c.Nodes[0].ID}})
	if err != nil {
		t.Fatal(err)
	}
	if np := ans.Result.Nodes[0]; np.LocalBlocks != len(keys) || np.DiskBlocks != len(keys) || np.LocalLoad <= 0 {
		t.Fatalf("node-0's plan: %d local blocks, %d on disk, load %v; want all on disk, a load", np.LocalBlocks, np.DiskBlocks, np.LocalLoad)
	}
	c.Converged(10 * time.Second)
	eng := c.Client(1, api.PathData)
	res, err := eng.Fetch(ctx, "acme", "llama3-8b", keys, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.Source != "node-0" {
			t.Fatalf("block %d: %+v", i, r)
		}
		got, err := eng.GetValue(ctx, api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: keys[i]})
		if err != nil || !bytes.Equal(got, blockValue(i, size)) {
			t.Fatalf("block %d after the fetch: %v", i, err)
		}
	}
	if s := tier.Stats(); s.Read < uint64(len(keys)) {
		t.Fatalf("node-0 read %d blocks from disk, want %d", s.Read, len(keys))
	}
}
