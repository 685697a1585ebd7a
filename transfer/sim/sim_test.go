package sim

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/kvpool/kvpool/eviction"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestQueueOrdersByTimeThenPush(t *testing.T) {
	var q Queue
	for i, at := range []float64{3, 1, 2, 1, 3} {
		q.Push(Event{AtS: at, Arg: i})
	}
	var got []int
	for {
		e, ok := q.Pop()
		if !ok {
			break
		}
		got = append(got, e.Arg)
	}
	if want := []int{1, 3, 2, 0, 4}; !equalInts(got, want) {
		t.Fatalf("popped %v, want %v", got, want)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestLinkSharesBandwidth(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fixed  float64
		starts []struct{ at, bytes float64 }
		// done[i] is when transfer i finishes.
		done []float64
	}{
		{"one transfer pays its fixed cost, then moves at the full rate", 1, []struct{ at, bytes float64 }{{0, 1000}}, []float64{11}},
		{"two at once share the rate", 1, []struct{ at, bytes float64 }{{0, 1000}, {0, 1000}}, []float64{21, 21}},
		{"a later one halves the first's rate from when its bytes move", 0, []struct{ at, bytes float64 }{{0, 1000}, {5, 500}}, []float64{15, 15}},
		// 0 moves alone from 4 to 5 (100 bytes), both at 50 B/s until 1
		// is done at 7, then 0 alone: its last 800 bytes end at 15.
		{"the fixed cost takes no bandwidth", 4, []struct{ at, bytes float64 }{{0, 1000}, {1, 100}}, []float64{15, 7}},
		{"a short one leaves, the long one speeds up", 0, []struct{ at, bytes float64 }{{0, 1000}, {0, 200}}, []float64{12, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &Link{BytesPerSecond: 100, FixedS: tc.fixed}
			for i, s := range tc.starts {
				l.Start(s.at, i, s.bytes)
			}
			got := make([]float64, len(tc.starts))
			for l.Busy() > 0 {
				at, ok := l.NextDone()
				if !ok {
					t.Fatal("busy but nothing to finish")
				}
				l.Advance(at)
				ids := l.Done()
				if len(ids) == 0 {
					t.Fatalf("NextDone said %v, but nothing finished then", at)
				}
				for _, id := range ids {
					got[id] = at
				}
			}
			for i := range got {
				if !near(got[i], tc.done[i]) {
					t.Errorf("transfer %d done at %v, want %v", i, got[i], tc.done[i])
				}
			}
		})
	}
}

func TestLinkCancelFreesItsShare(t *testing.T) {
	l := &Link{BytesPerSecond: 100}
	l.Start(0, 0, 1000)
	l.Start(0, 1, 1000)
	l.Advance(4) // 200 bytes each moved
	l.Cancel(1)
	at, ok := l.NextDone()
	if !ok || !near(at, 12) {
		t.Fatalf("after the cancel the first finishes at %v (%v), want 12", at, ok)
	}
}

func TestRoofline(t *testing.T) {
	r := Roofline{HBMBytesPerSecond: 4.8e12, WeightsBytes: 16e9, StepOverheadS: 0.001}
	// 64 sequences of 2,000 tokens at Llama-3-8B's 131,072 bytes per token.
	if got, want := r.StepS(64*2000, 131072), (16e9+64*2000*131072.0)/4.8e12+0.001; !near(got, want) {
		t.Fatalf("step %v, want %v", got, want)
	}
	if got := r.StepS(0, 131072); !near(got, 16e9/4.8e12+0.001) {
		t.Fatalf("empty-batch step %v", got)
	}
}

func TestParseTrace(t *testing.T) {
	in := `{"timestamp": 1000, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]}
{"timestamp": 1000, "input_length": 512, "output_length": 0, "hash_ids": [0]}

{"timestamp": 3000, "input_length": 1025, "output_length": 5, "hash_ids": [0, 2, 3]}
`
	reqs, err := ParseTrace(strings.NewReader(in), TraceConfig{TimeScale: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 {
		t.Fatalf("%d requests", len(reqs))
	}
	// From the first request, at twice the rate: 0, 0, 1 s.
	for i, want := range []float64{0, 0, 1} {
		if !near(reqs[i].ArrivalS, want) || reqs[i].ID != i {
			t.Errorf("request %d: id %d at %v s, want %v", i, reqs[i].ID, reqs[i].ArrivalS, want)
		}
	}
	if r := reqs[2]; r.InputTokens != 1025 || r.OutputTokens != 5 || len(r.Blocks) != 3 || r.Blocks[2] != 3 {
		t.Errorf("request 2: %+v", r)
	}
}

func TestParseTraceReportsEveryProblem(t *testing.T) {
	in := strings.Join([]string{
		`{"timestamp": 10, "input_length": 512, "output_length": 1, "hash_ids": [0]}`,
		`{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1]}`,  // 2: goes back in time
		`{"timestamp": 20, "input_length": 513, "output_length": 1, "hash_ids": [1]}`, // 3: too few hash ids
		`{"timestamp": 30, "output_length": 1, "hash_ids": []}`,                       // 4: no input length
		`{"timestamp": 40, "input_length": 1, "output_length": -1, "hash_ids": [-2]}`, // 5: negative output, hash id
		`not json`, // 6
	}, "\n")
	_, err := ParseTrace(strings.NewReader(in), TraceConfig{})
	if err == nil {
		t.Fatal("accepted a bad trace")
	}
	for _, want := range []string{"line 2:", "line 3:", "line 4:", "line 5:", "output_length -1", "hash id -2", "line 6:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "line 1:") {
		t.Errorf("line 1 is fine: %v", err)
	}
	if _, err := ParseTrace(strings.NewReader(""), TraceConfig{}); err == nil {
		t.Error("accepted an empty trace")
	}
	if _, err := ParseTrace(strings.NewReader(in), TraceConfig{TimeScale: -1}); err == nil || errors.Is(err, nil) {
		t.Error("accepted a negative time scale")
	}
}

// The public Mooncake conversation trace parses whole.
func TestParseTheConversationTrace(t *testing.T) {
	f, err := os.Open("../../../shared/traces/conversation_trace.jsonl")
	if err != nil {
		t.Skipf("the shared trace is not here: %v", err)
	}
	defer f.Close()
	reqs, err := ParseTrace(f, TraceConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 12031 || reqs[0].ArrivalS != 0 {
		t.Fatalf("%d requests, the first at %v s", len(reqs), reqs[0].ArrivalS)
	}
	last := reqs[len(reqs)-1]
	t.Logf("%d requests over %.0f s", len(reqs), last.ArrivalS)
}

func FuzzParseTrace(f *testing.F) {
	f.Add(`{"timestamp": 1, "input_length": 600, "output_length": 2, "hash_ids": [0, 1]}`)
	f.Add(`{"timestamp": 1e9, "input_length": 1, "output_length": 0, "hash_ids": [7]}` + "\n" + `{}`)
	f.Fuzz(func(t *testing.T, s string) {
		reqs, err := ParseTrace(strings.NewReader(s), TraceConfig{BlockTokens: 512})
		if err != nil {
			return
		}
		prev := 0.0
		for _, r := range reqs {
			if r.ArrivalS < prev || r.InputTokens < 1 || r.OutputTokens < 0 || len(r.Blocks) != (r.InputTokens+511)/512 {
				t.Fatalf("accepted an invalid request %+v from %q", r, s)
			}
			prev = r.ArrivalS
		}
	})
}

func TestTierEvictsByPolicyAndKeepsPins(t *testing.T) {
	tr := NewTier(3, eviction.LRU)
	a := []uint64{10, 11, 12}
	if got := tr.Insert(a, 0, 0); got != 3 || tr.Len() != 3 {
		t.Fatalf("insert into an empty tier: %d held of 3, len %d", got, tr.Len())
	}
	if got := tr.Prefix([]uint64{10, 11, 99}, 1); got != 2 {
		t.Fatalf("prefix %d, want 2", got)
	}
	// 12 is the least recently used: a new block evicts it.
	tr.Insert([]uint64{20}, 0, 2)
	if tr.Has(12) || !tr.Has(10) || !tr.Has(11) || !tr.Has(20) || tr.Evictions != 1 {
		t.Fatalf("after one eviction: 10 %v 11 %v 12 %v 20 %v, %d evictions", tr.Has(10), tr.Has(11), tr.Has(12), tr.Has(20), tr.Evictions)
	}
	// Pinned blocks stay; with everything pinned nothing more fits.
	tr.Pin([]uint64{10, 11, 20}, 3)
	if got := tr.Insert([]uint64{30, 31}, 0, 3); got != 0 || tr.Has(30) {
		t.Fatalf("inserting into a fully pinned tier stored %d blocks", got)
	}
	tr.Unpin([]uint64{10, 11, 20}, 3)
	if got := tr.Insert([]uint64{30, 31}, 0, 4); got != 2 || tr.Len() != 3 {
		t.Fatalf("after unpinning: %d of 2 stored, len %d", got, tr.Len())
	}
}

func TestBatchStepsAndFrees(t *testing.T) {
	var b Batch[string]
	b.Add("a", 100, 2) // one more token after its first
	b.Add("b", 50, 4)
	if b.Len() != 2 || b.KVTokens() != 152 {
		t.Fatalf("len %d, kv %d; want 2 and 152", b.Len(), b.KVTokens())
	}
	if done := b.Step(nil); len(done) != 1 || done[0] != "a" || b.KVTokens() != 52 {
		t.Fatalf("first step: done %v, kv %d; want [a] and 52", done, b.KVTokens())
	}
	b.Step(nil)
	if done := b.Step(nil); len(done) != 1 || done[0] != "b" || b.Len() != 0 || b.KVTokens() != 0 {
		t.Fatalf("third step: done %v, len %d, kv %d", done, b.Len(), b.KVTokens())
	}
}
