package store

import (
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	rtmetrics "runtime/metrics"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
)

// TestIndexAgainstMap drives the index and a Go map with the same random
// inserts and deletes, across growth, and checks they always agree.
func TestIndexAgainstMap(t *testing.T) {
	x := newIndex()
	want := map[string]uint32{}
	rng := rand.New(rand.NewPCG(1, 2))
	keyOf := func(i int) (uint32, []byte) {
		k := make([]byte, 4+i%(api.MaxKeyBytes-3))
		binary.LittleEndian.PutUint32(k, uint32(i))
		return uint32(i % 3), k
	}
	for step := 0; step < 200_000; step++ {
		i := rng.IntN(20_000)
		ns, k := keyOf(i)
		id := string(rune(ns)) + string(k)
		idx, ok := x.lookup(ns, k)
		if _, present := want[id]; ok != present || (ok && want[id] != idx) {
			t.Fatalf("step %d: lookup(%d, %x) = %d,%v; map says %v", step, ns, k, idx, ok, present)
		}
		if ok && rng.IntN(2) == 0 {
			x.unlink(idx)
			x.releaseEntry(idx)
			delete(want, id)
		} else if !ok {
			want[id] = x.insert(ns, k)
		}
		if x.count != len(want) {
			t.Fatalf("step %d: count %d, map %d", step, x.count, len(want))
		}
	}
	for id, idx := range want {
		ns, k := uint32(id[0]), []byte(id[1:])
		if got, ok := x.lookup(ns, k); !ok || got != idx {
			t.Fatalf("final lookup of %x: %d %v, want %d", k, got, ok, idx)
		}
	}
}

// BenchmarkMetadataPerBlock stores 1M blocks of 4 KiB (32-byte keys, as
// SHA-256 chain keys are) and reports the Go heap the node spends per
// block, block bytes excluded, and the GC pause p99 seen while it did.
// Run: go test -run x -bench MetadataPerBlock -benchtime 1x ./pool
func BenchmarkMetadataPerBlock(b *testing.B) {
	const blocks = 1 << 20
	const blockBytes = 4 << 10
	for b.Loop() {
		perBlock, pauseP99, pauses := metadataRun(b, blocks, blockBytes)
		b.ReportMetric(perBlock, "heap-B/block")
		b.ReportMetric(float64(pauseP99.Microseconds()), "gc-pause-p99-µs")
		b.ReportMetric(float64(pauses), "gc-pauses")
	}
}

func metadataRun(b *testing.B, blocks, blockBytes int) (float64, time.Duration, uint64) {
	cfg := Config{CapacityBytes: int64(blocks * blockBytes)}
	cfg.HighWatermark, cfg.LowWatermark = 1, 1 // the arena is sized exactly for the blocks: no eviction
	arena, free := testArena(b, cfg.CapacityBytes)
	defer free()
	pausesBefore := gcPauses()
	runtime.GC()
	before := heapBytes()
	s := New(cfg, time.Now, arena, nil)
	tenant, ns := []byte("acme"), []byte("llama3-8b")
	for i := range blocks {
		key := sha256.Sum256(binary.LittleEndian.AppendUint64(nil, uint64(i)))
		r, err := s.Reserve(tenant, ns, key[:], int64(blockBytes), true)
		if err != nil {
			b.Fatal(err)
		}
		// The bytes are never touched: the arena stays sparse, and the
		// checksum a writer would have computed is given.
		if _, err := s.Commit(r, uint32(i), true, 0, false); err != nil {
			b.Fatal(err)
		}
	}
	runtime.GC()
	after := heapBytes()
	if st := s.Stats(); st.Blocks != uint64(blocks) {
		b.Fatalf("stored %d blocks", st.Blocks)
	}
	p99, n := pauseQuantile(gcPauses(), pausesBefore, 0.99)
	runtime.KeepAlive(s)
	return float64(after-before) / float64(blocks), p99, n
}

func heapBytes() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

func gcPauses() *rtmetrics.Float64Histogram {
	s := []rtmetrics.Sample{{Name: "/sched/pauses/total/gc:seconds"}}
	rtmetrics.Read(s)
	return s[0].Value.Float64Histogram()
}

// pauseQuantile returns the upper bound of the bucket holding quantile q of
// the pauses recorded between two histogram snapshots, and their count.
func pauseQuantile(after, before *rtmetrics.Float64Histogram, q float64) (time.Duration, uint64) {
	var total uint64
	counts := make([]uint64, len(after.Counts))
	for i := range counts {
		counts[i] = after.Counts[i] - before.Counts[i]
		total += counts[i]
	}
	if total == 0 {
		return 0, 0
	}
	rank := uint64(q * float64(total))
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen > rank {
			return time.Duration(after.Buckets[i+1] * float64(time.Second)), total
		}
	}
	return time.Duration(after.Buckets[len(after.Buckets)-1] * float64(time.Second)), total
}
