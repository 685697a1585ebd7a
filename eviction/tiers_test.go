package eviction

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

// singles returns a trace of one-block requests, one a second.
func singles(ids ...ID) []Request {
	reqs := make([]Request, len(ids))
	for i, id := range ids {
		reqs[i] = Request{At: time.Duration(i) * time.Second, Blocks: []ID{id}}
	}
	return reqs
}

// memoryOnly returns r as Replay counts a memory-only cache.
func (r TiersResult) memoryOnly() ReplayResult {
	return ReplayResult{Requests: r.Requests, Blocks: r.Blocks, PrefixHits: r.MemoryPrefixHits, BlockHits: r.MemoryBlockHits,
		Evictions: r.MemoryEvictions, Rejected: r.Rejected}
}

// TestReplayTiers checks ReplayTiers' exact counts on hand-made traces,
// with a memory of 2 blocks. In singles traces A..F are blocks 1..6.
func TestReplayTiers(t *testing.T) {
	const A, B, C, D, E, F = 1, 2, 3, 4, 5, 6
	chains := []Request{
		{Blocks: []ID{1, 2}},
		{Blocks: []ID{1, 2}},    // memory hits 1, 2 (admitted at 1 read)
		{Blocks: []ID{3, 4}},    // evicts 1, 2 from memory
		{Blocks: []ID{1, 2, 5}}, // 1, 2 promoted; no room for 5: all pinned
		{Blocks: []ID{6, 1}},    // 1 a memory hit after a miss: no prefix
		{Blocks: []ID{2, 6}},    // prefix hits: 2 from disk, 6 from memory
		{Blocks: []ID{7, 1}},    // 1 a disk hit after a miss
	}
	for _, tc := range []struct {
		name string
		reqs []Request
		cfg  TiersConfig
		want TiersResult
	}{{
		// A is copied at its second read, evicted from memory by B and C,
		// and read back from disk, evicting B.
		name: "read twice comes back from disk",
		reqs: singles(A, A, A, B, C, A),
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 4, AdmitReads: 2},
		want: TiersResult{Requests: 6, Blocks: 6, MemoryPrefixHits: 2, MemoryBlockHits: 2, DiskPrefixHits: 1, DiskBlockHits: 1,
			MemoryEvictions: 2, DiskWrites: 1},
	}, {
		// Copied at its first read; the second is no second copy.
		name: "read twice admit 1 copies once",
		reqs: singles(A, A, A, B, C, A),
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 4, AdmitReads: 1},
		want: TiersResult{Requests: 6, Blocks: 6, MemoryPrefixHits: 2, MemoryBlockHits: 2, DiskPrefixHits: 1, DiskBlockHits: 1,
			MemoryEvictions: 2, DiskWrites: 1},
	}, {
		name: "read once admit 1 comes back from disk",
		reqs: singles(A, A, B, C, A),
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 4, AdmitReads: 1},
		want: TiersResult{Requests: 5, Blocks: 5, MemoryPrefixHits: 1, MemoryBlockHits: 1, DiskPrefixHits: 1, DiskBlockHits: 1,
			MemoryEvictions: 2, DiskWrites: 1},
	}, {
		name: "read once admit 2 is lost",
		reqs: singles(A, A, B, C, A),
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 4, AdmitReads: 2},
		want: TiersResult{Requests: 5, Blocks: 5, MemoryPrefixHits: 1, MemoryBlockHits: 1, MemoryEvictions: 2},
	}, {
		name: "read once memory only",
		reqs: singles(A, A, B, C, A),
		cfg:  TiersConfig{MemoryBlocks: 2},
		want: TiersResult{Requests: 5, Blocks: 5, MemoryPrefixHits: 1, MemoryBlockHits: 1, MemoryEvictions: 2},
	}, {
		// A is read once in each of two stays in memory: never twice in
		// one, so never copied.
		name: "reads reset when a block leaves memory",
		reqs: singles(A, A, B, C, A, A, B, C, A),
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 4, AdmitReads: 2},
		want: TiersResult{Requests: 9, Blocks: 9, MemoryPrefixHits: 2, MemoryBlockHits: 2, MemoryEvictions: 5},
	}, {
		// A and B are copied; A's disk hit makes B the disk's LRU, so
		// copying E evicts B, and A comes back from disk again.
		name: "disk lru evicts the least recently read",
		reqs: singles(A, A, B, B, C, D, A, A, E, E, F, A),
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 2, AdmitReads: 1, DiskKind: LRU},
		want: TiersResult{Requests: 12, Blocks: 12, MemoryPrefixHits: 4, MemoryBlockHits: 4, DiskPrefixHits: 2, DiskBlockHits: 2,
			MemoryEvictions: 6, DiskWrites: 3, DiskEvictions: 1},
	}, {
		// FIFO ignores A's disk hit: copying E evicts A, so the last A
		// misses.
		name: "disk fifo evicts the first copied",
		reqs: singles(A, A, B, B, C, D, A, A, E, E, F, A),
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 2, AdmitReads: 1, DiskKind: FIFO},
		want: TiersResult{Requests: 12, Blocks: 12, MemoryPrefixHits: 4, MemoryBlockHits: 4, DiskPrefixHits: 1, DiskBlockHits: 1,
			MemoryEvictions: 6, DiskWrites: 3, DiskEvictions: 1},
	}, {
		// A is promoted, so its next read is declined (already on disk).
		// C's copy then evicts A from the one-block disk, and A's next
		// read copies it again.
		name: "declined copy is offered again",
		reqs: singles(A, A, B, C, A, A, C, A),
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 1, AdmitReads: 1},
		want: TiersResult{Requests: 8, Blocks: 8, MemoryPrefixHits: 4, MemoryBlockHits: 4, DiskPrefixHits: 1, DiskBlockHits: 1,
			MemoryEvictions: 2, DiskWrites: 3, DiskEvictions: 2},
	}, {
		name: "chains admit 1",
		reqs: chains,
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 4, AdmitReads: 1},
		want: TiersResult{Requests: 7, Blocks: 15, MemoryPrefixHits: 3, MemoryBlockHits: 4, DiskPrefixHits: 3, DiskBlockHits: 4,
			MemoryEvictions: 8, Rejected: 1, DiskWrites: 3},
	}, {
		name: "chains admit 2",
		reqs: chains,
		cfg:  TiersConfig{MemoryBlocks: 2, DiskBlocks: 4, AdmitReads: 2},
		want: TiersResult{Requests: 7, Blocks: 15, MemoryPrefixHits: 2, MemoryBlockHits: 4, MemoryEvictions: 8, Rejected: 1},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ReplayTiers(tc.reqs, tc.cfg); got != tc.want {
				t.Errorf("ReplayTiers(%+v):\n got %+v\nwant %+v", tc.cfg, got, tc.want)
			}
		})
	}
}

// TestReplayTiersMemoryOnly checks that without a disk ReplayTiers counts
// what Replay does, for every policy, on seeded random traces of chains,
// and that with one its counts add up.
func TestReplayTiersMemoryOnly(t *testing.T) {
	iters := 200
	if raceEnabled {
		iters = 50
	}
	rng := rand.New(rand.NewPCG(17, 17))
	for iter := range iters {
		var reqs []Request
		for i := range 60 {
			root, n := ID(rng.IntN(10)), 1+rng.IntN(6)
			bs := make([]ID, n)
			for j := range bs {
				bs[j] = root*16 + ID(j) + 1
			}
			reqs = append(reqs, Request{At: time.Duration(i) * time.Second, Blocks: bs})
		}
		for _, k := range kinds {
			size := 1 + rng.IntN(20)
			want := Replay(reqs, k, size, 0)
			if got := ReplayTiers(reqs, TiersConfig{Memory: k, MemoryBlocks: size}).memoryOnly(); got != want {
				t.Fatalf("iter %d: %v, %d blocks, no disk: %+v, Replay %+v", iter, k, size, got, want)
			}
			cfg := TiersConfig{Memory: k, MemoryBlocks: size, DiskBlocks: 1 + rng.IntN(40), DiskKind: kinds[rng.IntN(len(kinds))], AdmitReads: 1 + rng.IntN(3)}
			r := ReplayTiers(reqs, cfg)
			if r.Requests != want.Requests || r.Blocks != want.Blocks || r.MemoryPrefixHits > r.MemoryBlockHits ||
				r.DiskPrefixHits > r.DiskBlockHits || r.BlockHits() > r.Blocks || r.DiskEvictions > r.DiskWrites ||
				r.DiskWrites-r.DiskEvictions > int64(cfg.DiskBlocks) || (r.DiskWrites == 0 && r.DiskBlockHits > 0) {
				t.Fatalf("iter %d: %+v: inconsistent %+v", iter, cfg, r)
			}
		}
	}
}

// TestTiersConfig checks defaults and validation.
func TestTiersConfig(t *testing.T) {
	got := TiersConfig{MemoryBlocks: 1}.WithDefaults()
	if want := (TiersConfig{Memory: LRU, MemoryBlocks: 1, DiskKind: LRU, AdmitReads: DefaultDiskAdmitReads}); got != want {
		t.Errorf("defaults: %+v, want %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	bad := TiersConfig{Memory: 99, DiskKind: 99, MemoryBlocks: 0, DiskBlocks: -1, AdmitReads: MaxDiskAdmitReads + 1}
	err := bad.WithDefaults().Validate()
	if err == nil {
		t.Fatal("invalid config validated")
	}
	for _, s := range []string{"memory policy", "disk policy", "memory of 0", "disk of -1", "128 reads"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	if err := (TiersConfig{MemoryBlocks: 1, AdmitReads: -1}).WithDefaults().Validate(); err == nil {
		t.Error("AdmitReads -1 validated")
	}
	defer func() {
		if recover() == nil {
			t.Error("ReplayTiers with an invalid config did not panic")
		}
	}()
	ReplayTiers(nil, bad)
}

// TestReplayTiersTable replays the conversation trace (or -trace) with
// memory at 10% and 25% of its unique blocks, LRU or prefix-LRU, and a
// disk 4 times the memory (LRU), copying blocks to disk at their first or
// second read. It checks that the disk never lowers the prefix hits, and
// logs the table (run with -v to see it):
//
//	go test ./eviction -run TestReplayTiersTable -v -count=1 [-args -trace=PATH]
func TestReplayTiersTable(t *testing.T) {
	reqs := loadTrace(t, *traceFlag)
	if raceEnabled && len(reqs) > raceRequests {
		t.Logf("race detector on: replaying the first %d of %d requests", raceRequests, len(reqs))
		reqs = reqs[:raceRequests]
	}
	unique := uniqueBlocks(reqs)
	var lookups int64
	for _, r := range reqs {
		lookups += int64(len(r.Blocks))
	}
	const diskTimes = 4
	start := time.Now()
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests, %d block lookups, %d unique blocks; disk %d× memory, LRU; prefix hit ratio\n\n",
		len(reqs), lookups, unique, diskTimes)
	tw := tabwriter.NewWriter(&b, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprint(tw, "| memory\t blocks\t disk blocks\t admit reads\t memory only\t memory + disk\t from disk\t disk writes\t disk evictions\t\n")
	fmt.Fprint(tw, "|---\t---\t---\t---\t---\t---\t---\t---\t---\t\n")
	for _, k := range []Kind{LRU, PrefixLRU} {
		for _, pct := range []int{10, 25} {
			size := unique * pct / 100
			mem := Replay(reqs, k, size, 0)
			if got := ReplayTiers(reqs, TiersConfig{Memory: k, MemoryBlocks: size}).memoryOnly(); got != mem {
				t.Errorf("%v, %d blocks, no disk: %+v, Replay %+v", k, size, got, mem)
			}
			for _, admit := range []int{1, 2} {
				cfg := TiersConfig{Memory: k, MemoryBlocks: size, DiskBlocks: diskTimes * size, DiskKind: LRU, AdmitReads: admit}
				r := ReplayTiers(reqs, cfg)
				fmt.Fprintf(tw, "| %v\t %d (%d%%)\t %d\t %d\t %.4f\t %.4f\t %.4f\t %d\t %d\t\n", k, size, pct, cfg.DiskBlocks, admit,
					mem.PrefixHitRatio(), r.PrefixHitRatio(), r.DiskPrefixHitRatio(), r.DiskWrites, r.DiskEvictions)
				if r.PrefixHits() < mem.PrefixHits {
					t.Errorf("%+v: %d prefix hits with the disk < %d without", cfg, r.PrefixHits(), mem.PrefixHits)
				}
				if r.Requests != len(reqs) || r.Blocks != lookups {
					t.Errorf("%+v: counted %d requests, %d blocks", cfg, r.Requests, r.Blocks)
				}
				// First uses are misses in any cache.
				if ceiling := lookups - int64(unique); r.BlockHits() > ceiling {
					t.Errorf("%+v: %d block hits > %d reuses", cfg, r.BlockHits(), ceiling)
				}
			}
		}
	}
	tw.Flush()
	// tabwriter.Debug separates columns with '|'; close the markdown rows.
	t.Logf("replayed in %v\n%s", time.Since(start).Round(time.Millisecond), strings.ReplaceAll(b.String(), "\t\n", "|\n"))
}
