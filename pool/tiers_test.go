package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
)

// diskNode is a node with a 16 MiB arena and a disk tier of diskBytes in
// a directory of its own, which outlives stops.
func diskNode(t *testing.T, diskBytes int64, mutate ...func(*Config)) *persistentNode {
	dir := filepath.Join(t.TempDir(), "disk")
	return newPersistentNode(t, append([]func(*Config){func(c *Config) {
		c.DataDir = ""
		c.DiskDir, c.DiskCapacityBytes = dir, diskBytes
		c.DiskMaxPendingBytes = 64 << 20 // never declined: each block is offered once
	}}, mutate...)...)
}

// metricValue is the node's metric name (a gauge or a counter) with the
// label pair given, or without labels; -1 when it has none.
func metricValue(t *testing.T, n *Node, name string, label ...string) float64 {
	t.Helper()
	mfs, err := n.cfg.Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := len(label) == 0
			for _, l := range m.GetLabel() {
				match = match || (len(label) == 2 && l.GetName() == label[0] && l.GetValue() == label[1])
			}
			if !match {
				continue
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// waitFor polls cond until it holds, or fails the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const tierBlock = 1 << 20

func tierKey(ns string, i int) api.BlockKey {
	return api.BlockKey{Tenant: "t", Namespace: ns, Key: fmt.Appendf(nil, "k%03d", i)}
}

// spillHot puts count blocks in namespace "hot", reads each twice (the
// default admission) and waits until the disk has written them all.
func spillHot(t *testing.T, n *Node, c *api.Client, count int) map[int][]byte {
	t.Helper()
	ctx := context.Background()
	hot := map[int][]byte{}
	buf := make([]byte, tierBlock)
	for i := range count {
		v := value(uint64(i), tierBlock)
		if err := c.Put(ctx, tierKey("hot", i), v); err != nil {
			t.Fatal(err)
		}
		hot[i] = v
		for range 2 {
			if _, err := c.Get(ctx, tierKey("hot", i), buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor(t, "the hot blocks on disk", func() bool {
		s := n.disk.Stats()
		return s.Spilled+s.WriteFailures["no_space"]+s.WriteFailures["io"] >= uint64(count) && s.PendingBytes == 0
	})
	return hot
}

// evictHot puts blocks in namespace "cold" until the arena has evicted
// every hot block, and returns the cold ones that are still in memory.
func evictHot(t *testing.T, n *Node, c *api.Client, hot map[int][]byte) map[int][]byte {
	t.Helper()
	cold := map[int][]byte{}
	for i := 0; ; i++ {
		inMemory := 0
		for k := range hot {
			if ex, _ := n.Store().Exists([]byte("t"), []byte("hot"), [][]byte{tierKey("hot", k).Key}); ex[0] {
				inMemory++
			}
		}
		if inMemory == 0 {
			break
		}
		if i > 64 {
			t.Fatalf("%d hot blocks still in memory after %d cold puts", inMemory, i)
		}
		v := value(uint64(1000+i), tierBlock)
		if err := c.Put(context.Background(), tierKey("cold", i), v); err != nil {
			t.Fatal(err)
		}
		cold[i] = v
	}
	for k := range cold {
		if ex, _ := n.Store().Exists([]byte("t"), []byte("cold"), [][]byte{tierKey("cold", k).Key}); !ex[0] {
			delete(cold, k)
		}
	}
	return cold
}

func getEqual(t *testing.T, c *api.Client, k api.BlockKey, want []byte) {
	t.Helper()
	buf := make([]byte, tierBlock)
	m, err := c.Get(context.Background(), k, buf)
	if err != nil {
		t.Fatalf("get %s: %v", k.Key, err)
	}
	if !bytes.Equal(buf[:m], want) {
		t.Fatalf("get %s: bytes differ from the put's", k.Key)
	}
}

// Blocks read twice are copied to disk; once memory has evicted them a
// Get, over gRPC, the data channel or shared memory, promotes them, and
// Locate reports which part of a chain is on disk. A restart over the
// same disk directory serves them again.
func TestDiskTierPromotesEvictedBlocks(t *testing.T) {
	p := diskNode(t, 256<<20)
	n := p.mustStart()
	c := dial(t, n, api.PathData)
	hot := spillHot(t, n, c, 6)
	if s := n.disk.Stats(); s.Spilled != 6 || s.Blocks != 6 {
		t.Fatalf("disk after the reads: %+v, want 6 blocks written", s)
	}
	evictHot(t, n, c, hot)

	chain := make([][]byte, 6)
	for i := range chain {
		chain[i] = tierKey("hot", i).Key
	}
	total, memory, err := c.LocateTiers(context.Background(), "t", "hot", chain)
	if err != nil || total != 6 || memory != 0 {
		t.Fatalf("locate of the evicted chain: %d held, %d in memory, %v; want 6, 0", total, memory, err)
	}
	paths := []api.Path{api.PathGRPC, api.PathData, api.PathShm}
	for i, v := range hot {
		getEqual(t, dial(t, n, paths[i%len(paths)]), tierKey("hot", i), v)
	}
	if got := metricValue(t, n, "kvpool_disk_promotions_total", "outcome", "ok"); got != 6 {
		t.Fatalf("promotions: %v, want 6", got)
	}
	if total, memory, _ = c.LocateTiers(context.Background(), "t", "hot", chain); total != 6 || memory != 6 {
		t.Fatalf("locate after the promotions: %d held, %d in memory; want 6, 6", total, memory)
	}

	// A lease promotes: evict again, then Locate with a lease.
	evictHot(t, n, c, hot)
	if held, _, err := c.LocateLease(context.Background(), "t", "hot", chain, time.Minute); err != nil || held != 6 {
		t.Fatalf("locate with a lease: %d, %v", held, err)
	}
	if ex, _ := n.Store().Exists([]byte("t"), []byte("hot"), chain); !ex[0] || !ex[5] {
		t.Fatalf("after a lease the blocks are not in memory: %v", ex)
	}
	p.stop()

	// The disk outlives the daemon (the arena, without a data directory,
	// does not).
	n = p.mustStart()
	if r := n.disk.Opened(); r.Blocks != 6 || r.Dropped != 0 {
		t.Fatalf("disk at restart: %+v, want 6 blocks", r)
	}
	c = dial(t, n, api.PathData)
	for i, v := range hot {
		getEqual(t, c, tierKey("hot", i), v)
	}
	// Remove reaches both tiers.
	if err := c.Remove(context.Background(), tierKey("hot", 0)); err != nil {
		t.Fatal(err)
	}
	if _, ok := n.disk.Size([]byte("t"), []byte("hot"), tierKey("hot", 0).Key); ok {
		t.Fatal("a removed block is still on disk")
	}
}

// A disk that fails turns into misses: a flipped bit, a truncated file
// and a file that cannot be read each fail the Get once with DataLoss,
// counted by reason, and then miss; the memory tier keeps serving.
func TestDiskFaultsAreMisses(t *testing.T) {
	p := diskNode(t, 256<<20)
	n := p.mustStart()
	c := dial(t, n, api.PathData)
	hot := spillHot(t, n, c, 4)
	cold := evictHot(t, n, c, hot)
	file := func(i int) string {
		path, ok := n.disk.Path([]byte("t"), []byte("hot"), tierKey("hot", i).Key)
		if !ok {
			t.Fatalf("block %d is not on disk", i)
		}
		return path
	}
	// 0: a bit flipped in the block's bytes.
	f, err := os.OpenFile(file(0), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	f.ReadAt(b, 4096+12345)
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, 4096+12345); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// 1: truncated.
	if err := os.Truncate(file(1), 4096+tierBlock/2); err != nil {
		t.Fatal(err)
	}
	// 2: unreadable (a directory in its place: root reads any file).
	if err := os.Remove(file(2)); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(file(2), 0o700); err != nil {
		t.Fatal(err)
	}
	// 3: a bit flipped in the header.
	f, _ = os.OpenFile(file(3), os.O_RDWR, 0)
	f.WriteAt([]byte{'X'}, 1)
	f.Close()

	buf := make([]byte, tierBlock)
	for i, reason := range []string{"checksum", "truncated", "io", "header"} {
		k := tierKey("hot", i)
		if _, err := c.Get(context.Background(), k, buf); !errors.Is(err, api.ErrDataLoss) {
			t.Fatalf("block %d (%s): %v, want DataLoss", i, reason, err)
		}
		if _, err := c.Get(context.Background(), k, buf); !errors.Is(err, api.ErrNotFound) {
			t.Fatalf("block %d (%s) the second time: %v, want NotFound", i, reason, err)
		}
		if got := metricValue(t, n, "kvpool_disk_read_errors_total", "reason", reason); got != 1 {
			t.Fatalf("read errors %s: %v, want 1", reason, got)
		}
	}
	if got := metricValue(t, n, "kvpool_disk_promotions_total", "outcome", "failed"); got != 4 {
		t.Fatalf("failed promotions: %v, want 4", got)
	}
	for i, v := range cold {
		getEqual(t, c, tierKey("cold", i), v)
	}
	// The engine recomputes and puts again: served.
	if err := c.Put(context.Background(), tierKey("hot", 0), hot[0]); err != nil {
		t.Fatal(err)
	}
	getEqual(t, c, tierKey("hot", 0), hot[0])
}

// A full file system fails the disk's writes, counted as no_space; the
// blocks stay in memory and the node serves them.
func TestDiskFullKeepsServingMemory(t *testing.T) {
	var dir string
	p := diskNode(t, 256<<20, func(c *Config) { dir = c.DiskDir })
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The marker, lock, 256 directories and the 4 MiB read probe fit;
	// about two blocks more do not all.
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=7m"); err != nil {
		t.Skipf("cannot mount a small tmpfs here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	n := p.mustStart()
	c := dial(t, n, api.PathData)
	hot := spillHot(t, n, c, 8)
	if got := metricValue(t, n, "kvpool_disk_write_errors_total", "reason", "no_space"); got < 1 {
		t.Fatalf("no_space write errors: %v, want some", got)
	}
	s := n.disk.Stats()
	if s.Spilled+s.WriteFailures["no_space"] != 8 || s.Blocks != int64(s.Spilled) {
		t.Fatalf("disk: %+v", s)
	}
	for i, v := range hot {
		getEqual(t, c, tierKey("hot", i), v)
	}
	p.stop()
}
