package eviction

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

var traceFlag = flag.String("trace", "testdata/conversation_trace.jsonl.gz",
	"Mooncake trace for TestReplayTable: JSON lines, gzipped if the name ends in .gz")

// replayTTL is the block lifetime the TTL policy gets in TestReplayTable:
// the 5 minutes hosted prompt caches commonly keep a prefix, about 8.5% of
// the conversation trace's 59 minutes.
const replayTTL = 5 * time.Minute

// raceRequests is how much of the trace TestReplayTable replays under the
// race detector, which slows the full trace down tenfold.
const raceRequests = 2000

// readTrace parses a Mooncake trace: one JSON object a line, with timestamp
// (ms) and hash_ids (512-token blocks, each id a hash of its whole prefix).
// IDs are hash_id+1, since a hash_id may be 0 and an ID may not.
func readTrace(r io.Reader) ([]Request, error) {
	var reqs []Request
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<24)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var line struct {
			Timestamp int64    `json:"timestamp"`
			HashIDs   []uint64 `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		req := Request{At: time.Duration(line.Timestamp) * time.Millisecond, Blocks: make([]ID, len(line.HashIDs))}
		for i, h := range line.HashIDs {
			req.Blocks[i] = ID(h + 1)
		}
		reqs = append(reqs, req)
	}
	return reqs, sc.Err()
}

func loadTrace(t testing.TB, path string) []Request {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		defer gz.Close()
		r = gz
	}
	reqs, err := readTrace(r)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return reqs
}

func uniqueBlocks(reqs []Request) int {
	seen := make(map[ID]struct{})
	for _, r := range reqs {
		for _, id := range r.Blocks {
			seen[id] = struct{}{}
		}
	}
	return len(seen)
}

// replayRow is one line of the table: a policy (or Belady) at each size.
type replayRow struct {
	name    string
	results []ReplayResult
}

// replayTable replays reqs at each fraction (in percent) of the unique
// blocks with every policy and Belady.
func replayTable(reqs []Request, percents []int) (sizes []int, rows []replayRow) {
	unique := uniqueBlocks(reqs)
	for _, pct := range percents {
		sizes = append(sizes, unique*pct/100)
	}
	for _, k := range kinds {
		row := replayRow{name: k.String()}
		for _, size := range sizes {
			var ttl time.Duration
			if k == TTL {
				ttl = replayTTL
			}
			row.results = append(row.results, Replay(reqs, k, size, ttl))
		}
		rows = append(rows, row)
	}
	row := replayRow{name: "belady"}
	for _, size := range sizes {
		row.results = append(row.results, Belady(reqs, size))
	}
	return sizes, append(rows, row)
}

// TestReplayTable replays the conversation trace (or -trace) at 10%, 25% and
// 50% of its unique blocks with every policy and Belady, checks that
// prefix-LRU beats LRU on prefix hits and that no policy beats Belady on
// block hits, and logs the table (run with -v to see it):
//
//	go test ./eviction -run TestReplayTable -v [-args -trace=PATH]
func TestReplayTable(t *testing.T) {
	reqs := loadTrace(t, *traceFlag)
	if raceEnabled && len(reqs) > raceRequests {
		t.Logf("race detector on: replaying the first %d of %d requests", raceRequests, len(reqs))
		reqs = reqs[:raceRequests]
	}
	percents := []int{10, 25, 50}
	start := time.Now()
	sizes, rows := replayTable(reqs, percents)
	elapsed := time.Since(start)

	var lookups int64
	for _, r := range reqs {
		lookups += int64(len(r.Blocks))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d requests, %d block lookups, %d unique blocks; TTL %v; prefix / block hit ratio\n\n",
		len(reqs), lookups, uniqueBlocks(reqs), replayTTL)
	tw := tabwriter.NewWriter(&b, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprint(tw, "| policy\t")
	for i, pct := range percents {
		fmt.Fprintf(tw, " %d%% (%d blocks)\t", pct, sizes[i])
	}
	fmt.Fprint(tw, "\n|---\t")
	for range percents {
		fmt.Fprint(tw, "---\t")
	}
	fmt.Fprintln(tw)
	for _, row := range rows {
		fmt.Fprintf(tw, "| %s\t", row.name)
		for _, r := range row.results {
			fmt.Fprintf(tw, " %.4f / %.4f\t", r.PrefixHitRatio(), r.BlockHitRatio())
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	// tabwriter.Debug separates columns with '|'; close the markdown rows.
	t.Logf("replayed in %v\n%s", elapsed.Round(time.Millisecond), strings.ReplaceAll(b.String(), "\t\n", "|\n"))

	byName := make(map[string][]ReplayResult)
	for _, row := range rows {
		byName[row.name] = row.results
	}
	for i, size := range sizes {
		lru, plru := byName["lru"][i], byName["prefix-lru"][i]
		if plru.PrefixHits < lru.PrefixHits {
			t.Errorf("%d blocks: prefix-lru prefix hits %d < lru %d", size, plru.PrefixHits, lru.PrefixHits)
		}
		opt := byName["belady"][i]
		for _, row := range rows {
			r := row.results[i]
			if r.BlockHits > opt.BlockHits {
				t.Errorf("%d blocks: %s block hits %d > belady %d", size, row.name, r.BlockHits, opt.BlockHits)
			}
			if r.Blocks != lookups || r.Requests != len(reqs) {
				t.Errorf("%d blocks: %s counted %d requests, %d blocks", size, row.name, r.Requests, r.Blocks)
			}
			if r.PrefixHits > r.BlockHits {
				t.Errorf("%d blocks: %s prefix hits %d > block hits %d", size, row.name, r.PrefixHits, r.BlockHits)
			}
		}
	}
}

// TestReplayZipf compares the policies with Belady on a seeded Zipf
// workload of single-block requests, where frequency matters and prefixes
// don't.
func TestReplayZipf(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	zipf := rand.NewZipf(rng, 1.1, 2, 1<<14)
	reqs := make([]Request, 100000)
	for i := range reqs {
		reqs[i] = Request{At: time.Duration(i) * time.Millisecond, Blocks: []ID{ID(zipf.Uint64() + 1)}}
	}
	const size = 500
	opt := Belady(reqs, size)
	results := make(map[Kind]ReplayResult)
	for _, k := range kinds {
		r := Replay(reqs, k, size, 0)
		results[k] = r
		t.Logf("%-10s %.4f", k, r.BlockHitRatio())
		if r.BlockHits > opt.BlockHits {
			t.Errorf("%v: %d block hits > belady %d", k, r.BlockHits, opt.BlockHits)
		}
	}
	t.Logf("%-10s %.4f", "belady", opt.BlockHitRatio())
	if results[LFU].BlockHits <= results[LRU].BlockHits {
		t.Errorf("on Zipf, LFU (%d hits) should beat LRU (%d)", results[LFU].BlockHits, results[LRU].BlockHits)
	}
}

// TestBeladyOptimal checks Belady against an exhaustive search over every
// caching decision on small random traces.
func TestBeladyOptimal(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	for iter := range 300 {
		n, ids, size := 4+rng.IntN(12), 2+rng.IntN(5), 1+rng.IntN(3)
		var reqs []Request
		var seq []ID
		for range n {
			id := ID(rng.IntN(ids) + 1)
			reqs = append(reqs, Request{Blocks: []ID{id}})
			seq = append(seq, id)
		}
		if got, want := Belady(reqs, size).BlockHits, bestHits(seq, size, 0, 0); got != want {
			t.Fatalf("iter %d: %v at size %d: belady %d hits, optimum %d", iter, seq, size, got, want)
		}
	}
}

// bestHits returns the most hits from seq with a cache of size blocks
// holding the set in (a bitmask of IDs), trying every decision on a miss:
// bypass, or store evicting any block if full.
func bestHits(seq []ID, size int, in uint64, _ int) int64 {
	if len(seq) == 0 {
		return 0
	}
	bit := uint64(1) << seq[0]
	if in&bit != 0 {
		return 1 + bestHits(seq[1:], size, in, 0)
	}
	best := bestHits(seq[1:], size, in, 0) // bypass
	if countBits(in) < size {
		best = max(best, bestHits(seq[1:], size, in|bit, 0))
	} else {
		for v := uint64(1); v <= in; v <<= 1 {
			if in&v != 0 {
				best = max(best, bestHits(seq[1:], size, in&^v|bit, 0))
			}
		}
	}
	return best
}

func countBits(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// TestReplayPrefix checks the prefix metric on a hand-made trace.
func TestReplayPrefix(t *testing.T) {
	reqs := []Request{
		{Blocks: []ID{1, 2, 3}},
		{Blocks: []ID{1, 2, 4}}, // prefix hits 1, 2
		{Blocks: []ID{5, 2, 3}}, // block hits 2, 3; no prefix hit
	}
	for _, k := range kinds {
		r := Replay(reqs, k, 10, 0)
		want := ReplayResult{Requests: 3, Blocks: 9, PrefixHits: 2, BlockHits: 4}
		if r != want {
			t.Errorf("%v: %+v, want %+v", k, r, want)
		}
	}
	if r := Belady(reqs, 10); r.PrefixHits != 2 || r.BlockHits != 4 {
		t.Errorf("belady: %+v", r)
	}
	// TTL: a block expired by the next request is a miss.
	reqs[1].At = 2 * time.Second
	if r := Replay(reqs, TTL, 10, time.Second); r.PrefixHits != 0 || r.BlockHits != 2 {
		t.Errorf("ttl 1s: %+v, want 0 prefix hits and 2 block hits (2, 3 in the last request)", r)
	}
}
