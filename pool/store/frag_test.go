package store

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkFragmentation measures how much of the arena is usable under
// churn. Each workload fills a 1 GiB arena, then for 20k steps puts a
// block of a random size, and whenever a put fails for lack of a long
// enough free run it records how full the arena was and removes random
// blocks until the put fits (random eviction, the worst case for
// fragmentation). It reports the mean stored fraction of the arena at
// those failures (1.0 would be perfect packing), the external
// fragmentation there, and the internal (page rounding) fragmentation.
//
//	go test -run x -bench Fragmentation -benchtime 1x ./pool
func BenchmarkFragmentation(b *testing.B) {
	workloads := []struct {
		name string
		size func(r *rand.Rand) int64
	}{
		{"uniform-2MiB", func(*rand.Rand) int64 { return 2 << 20 }},
		{"three-models-128KiB-2MiB-5MiB", func(r *rand.Rand) int64 {
			return []int64{128 << 10, 2 << 20, 5 << 20}[r.IntN(3)]
		}},
		{"pages-4KiB-to-4MiB", func(r *rand.Rand) int64 { return int64(1+r.IntN(1024)) * 4 << 10 }},
		{"bytes-1B-to-4MiB", func(r *rand.Rand) int64 { return 1 + r.Int64N(4<<20) }},
	}
	for _, w := range workloads {
		b.Run(w.name, func(b *testing.B) {
			for b.Loop() {
				occ, ext, internal := churn(b, w.size)
				b.ReportMetric(occ, "stored/capacity-at-failure")
				b.ReportMetric(ext, "ext-frag-at-failure")
				b.ReportMetric(internal, "int-frag")
			}
		})
	}
}

func churn(b *testing.B, size func(*rand.Rand) int64) (occupancy, ext, internal float64) {
	cfg := Config{CapacityBytes: 1 << 30, MaxBlockBytes: 8 << 20}
	cfg.DisableEviction = true // this measures the allocator: the churn evicts
	arena, free := testArena(b, cfg.CapacityBytes)
	defer free()
	s := New(cfg, time.Now, arena, nil)
	r := rand.New(rand.NewPCG(7, 7))
	var keys [][]byte
	next := 0
	put := func(n int64) bool {
		k := fmt.Appendf(nil, "k%d", next)
		res, err := s.Reserve([]byte("t"), []byte("n"), k, n, true)
		if err != nil {
			return false
		}
		if _, err := s.Commit(res, 0, true, 0, false); err != nil {
			b.Fatal(err)
		}
		next++
		keys = append(keys, k)
		return true
	}
	removeRandom := func() {
		i := r.IntN(len(keys))
		if err := s.Remove([]byte("t"), []byte("n"), keys[i]); err != nil {
			b.Fatal(err)
		}
		keys[i] = keys[len(keys)-1]
		keys = keys[:len(keys)-1]
	}
	for put(size(r)) {
	}
	var failures int
	var occSum, extSum float64
	for range 20000 {
		n := size(r)
		for !put(n) {
			st := s.Stats()
			occSum += float64(st.StoredBytes) / float64(st.CapacityBytes)
			extSum += st.ExternalFragmentation
			failures++
			removeRandom()
		}
		if r.IntN(4) == 0 {
			removeRandom()
		}
	}
	if err := s.Check(); err != nil {
		b.Fatal(err)
	}
	return occSum / float64(failures), extSum / float64(failures), s.Stats().InternalFragmentation
}
