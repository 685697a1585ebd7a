package metadata

import (
	"context"
	"fmt"
	"runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvpool/kvpool/metadata/embedded"
)

// BenchmarkPublish pushes location records through a Member into one
// embedded etcd (default ticks) with a Mirror following. "burst" adds 1M
// records at once and reports records/s from the first Added to the last
// record applied in the mirror. "steady-100k" and "steady-200k" offer that
// many records/s for 5 s, in steps every 10 ms, and report the mirror's
// lag, from the moment a change is queued on the node to the moment the
// mirror applies it (p50 and p99 over records).
//
//	go test -run x -bench Publish -benchtime 1x ./metadata
func BenchmarkPublish(b *testing.B) {
	for _, mode := range []string{"burst", "steady-100k", "steady-200k"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				publishRun(b, mode)
			}
		})
	}
}

func publishRun(b *testing.B, mode string) {
	e, err := embedded.Start(embedded.Config{Dir: b.TempDir(), ClientURL: "http://127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	cli := newClient(b, e.ClientURL())
	var mu sync.Mutex
	var lags []time.Duration // one per record
	mm := startMirror(b, newClient(b, e.ClientURL()), func(c *MirrorConfig) {
		c.OnApply = func(lag time.Duration, n int) {
			mu.Lock()
			for range n {
				lags = append(lags, lag)
			}
			mu.Unlock()
		}
	})
	m := startMember(b, cli, "node-a")
	records, step := 1_000_000, 0
	switch mode {
	case "steady-100k":
		records, step = 500_000, 1000
	case "steady-200k":
		records, step = 1_000_000, 2000
	}
	keys := make([][]byte, records)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%032x", i)
	}
	mu.Lock()
	lags = lags[:0] // drop the registration snapshot
	mu.Unlock()
	start := time.Now()
	if mode == "burst" {
		for _, k := range keys {
			m.Added([]byte("acme"), []byte("llama3-8b"), k)
		}
	} else {
		tick := time.NewTicker(10 * time.Millisecond)
		for i := 0; i < records; i += step {
			<-tick.C
			for _, k := range keys[i:min(i+step, records)] {
				m.Added([]byte("acme"), []byte("llama3-8b"), k)
			}
		}
		tick.Stop()
	}
	for mm.Stats().Blocks < records {
		time.Sleep(time.Millisecond)
	}
	el := time.Since(start)
	mu.Lock()
	slices.Sort(lags)
	p50, p99 := lags[len(lags)/2], lags[len(lags)*99/100]
	mu.Unlock()
	b.ReportMetric(float64(records)/el.Seconds(), "records/s")
	b.ReportMetric(float64(p50.Microseconds())/1000, "lag-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "lag-p99-ms")
	b.ReportMetric(float64(m.Stats().Batches), "batches")
}

// buildState fills a state with n records of one node, 32-byte keys.
func buildState(n int) (*state, [][]byte) {
	s := newState()
	s.upsertNode(NodeRecord{ID: "node-a", Epoch: 1})
	s.upsertNode(NodeRecord{ID: "node-b", Epoch: 1})
	keys := make([][]byte, n)
	var recs []Record
	for i := range n {
		keys[i] = fmt.Appendf(nil, "%032x", i)
		recs = append(recs, Record{Op: OpAdd, Tenant: "acme", Namespace: "llama3-8b", Key: string(keys[i])})
	}
	s.applyBatch("node-a", 1, 0, &Batch{Records: recs})
	// node-b holds the first half of every 128-block chain.
	var half []Record
	for i := 0; i < n; i += 128 {
		for j := i; j < min(i+64, n); j++ {
			half = append(half, recs[j])
		}
	}
	s.applyBatch("node-b", 1, 0, &Batch{Records: half})
	return s, keys
}

// BenchmarkLocate answers Locate for a 128-key chain against a mirror of
// 1M blocks (1.5M records: two nodes).
//
//	go test -run x -bench Locate ./metadata
func BenchmarkLocate(b *testing.B) {
	s, keys := buildState(1_000_000)
	chain := keys[500_000 : 500_000+128]
	b.ResetTimer()
	var r LocateResult
	for b.Loop() {
		r = s.locate("acme", "llama3-8b", chain, nil)
	}
	if r.Deepest != 128 || r.PoolPrefix != 128 {
		b.Fatalf("locate: %+v", r)
	}
}

// BenchmarkMirrorMemory reports the Go heap a mirror spends per location
// record, with 1M blocks held by one node and half of them by another.
//
//	go test -run x -bench MirrorMemory -benchtime 1x ./metadata
func BenchmarkMirrorMemory(b *testing.B) {
	for b.Loop() {
		runtime.GC()
		before := heapObjects()
		s, keys := buildState(1_000_000)
		keys = nil
		runtime.GC()
		after := heapObjects()
		records := 0
		for _, set := range s.blocks {
			records += len(s.sets.members(set))
		}
		b.ReportMetric(float64(after-before)/float64(records), "B/record")
		b.ReportMetric(float64(after-before)/float64(len(s.blocks)), "B/block")
		runtime.KeepAlive(s)
		runtime.KeepAlive(keys)
	}
}

func heapObjects() uint64 {
	sm := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(sm)
	return sm[0].Value.Uint64()
}

var _ = context.Background
