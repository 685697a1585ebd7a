package eviction

import (
	"runtime"
	"testing"
	"time"
)

// memoryBlocks is how many blocks BenchmarkPolicyMemory adds.
const memoryBlocks = 1_000_000

// BenchmarkPolicyMemory reports the Go heap each policy takes per block,
// holding memoryBlocks blocks with IDs 1, 2, …, memoryBlocks: the pool's
// metadata budget is 128 bytes a block in all, so a policy gets 16 to 32.
// PrefixLRU's blocks form chains of 16 (Parent = the previous ID of the
// chain); TTL's all expire. LFU's figure includes its sketch and doorkeeper
// at the default Config.Counters. Run it with
//
//	go test -run x -bench PolicyMemory -benchtime 1x ./eviction
func BenchmarkPolicyMemory(b *testing.B) {
	for _, k := range kinds {
		b.Run(k.String(), func(b *testing.B) {
			var perBlock float64
			for range b.N {
				perBlock = policyMemory(k, memoryBlocks)
			}
			b.ReportMetric(perBlock, "heap-B/block")
		})
	}
}

// policyMemory returns the heap bytes per block that a policy of kind k
// holding n blocks takes.
func policyMemory(k Kind, n int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p := New(k, Config{})
	for i := 1; i <= n; i++ {
		bl := Block{ID: ID(i), Bytes: 4096}
		if k == PrefixLRU && (i-1)%16 != 0 {
			bl.Parent = ID(i - 1)
		}
		if k == TTL {
			bl.Expires = t0.Add(time.Duration(i) * time.Second)
		}
		p.Add(bl, t0)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if p.Len() != n {
		panic("lost blocks")
	}
	runtime.KeepAlive(p)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}
