package transfer

import (
	"math"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestLinksExactNumbers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := NewLinks(LinkConfig{SeedBytesPerSecond: 1e9, SeedRTT: time.Millisecond, Alpha: 0.5, DecayAfter: 5 * time.Second, HalfLife: 10 * time.Second,
		MinSampleBytes: 1000, Seeds: map[string]Seed{"slow": {BytesPerSecond: 1e6}}})

	e := l.Estimate("a", t0)
	if e.BytesPerSecond != 1e9 || e.RTT != time.Millisecond || e.Samples != 0 {
		t.Fatalf("unmeasured link: %+v, want the seed", e)
	}
	if e := l.Estimate("slow", t0); e.BytesPerSecond != 1e6 || e.RTT != time.Millisecond {
		t.Fatalf("per-peer seed: %+v", e)
	}
	// A small transfer measures the round trip: 0.5·1ms + 0.5·3ms = 2ms.
	l.Observe("a", 100, 3*time.Millisecond, t0)
	if e := l.Estimate("a", t0); e.RTT != 2*time.Millisecond || e.BytesPerSecond != 1e9 {
		t.Fatalf("after a latency sample: %+v", e)
	}
	// 3e6 bytes in 2ms + 2ms (one round trip): 3e6/2ms = 1.5e9 B/s; the
	// average is 0.5·1e9 + 0.5·1.5e9 = 1.25e9.
	l.Observe("a", 3e6, 4*time.Millisecond, t0)
	if e := l.Estimate("a", t0); !near(e.BytesPerSecond, 1.25e9) || e.Samples != 1 {
		t.Fatalf("after a bandwidth sample: %+v", e)
	}
	// A read measured on the data path: first response (1e5 bytes) 3ms
	// in, 2.1e6 bytes by 4ms: 2e6 bytes in 2ms = 1e9 B/s, whatever the
	// round trip estimate; 0.5·1.25e9 + 0.5·1e9 = 1.125e9.
	l.ObserveRead("b", 2.1e6, t0.Add(-4*time.Millisecond), t0.Add(-2*time.Millisecond), 1e5, t0)
	l.ObserveRead("a", 2.1e6, t0.Add(-4*time.Millisecond), t0.Add(-2*time.Millisecond), 1e5, t0)
	if e := l.Estimate("a", t0); !near(e.BytesPerSecond, 1.125e9) || e.Samples != 2 || e.RTT != 2*time.Millisecond {
		t.Fatalf("after a data-path read: %+v", e)
	}
	if e := l.Estimate("b", t0); !near(e.BytesPerSecond, 1e9) || e.Samples != 1 {
		t.Fatalf("data-path read on a fresh link: %+v, want 0.5·1e9 + 0.5·1e9", e)
	}
	// A first response that came 0.5ms before a 10ms read's end counts the
	// stream as half the total: 2e6 bytes / 5ms = 4e8 B/s, not 4e9.
	l.ObserveRead("c", 2e6, t0.Add(-10*time.Millisecond), t0.Add(-500*time.Microsecond), 0, t0)
	if e := l.Estimate("c", t0); !near(e.BytesPerSecond, 0.5*1e9+0.5*4e8) {
		t.Fatalf("buffered response: %+v, want the sample capped at 4e8", e)
	}
	// Without a first response it is Observe: 3e6 bytes in 4ms - 1ms seed
	// round trip = 1e9 B/s.
	l.ObserveRead("d", 3e6, t0.Add(-4*time.Millisecond), time.Time{}, 0, t0)
	if e := l.Estimate("d", t0); !near(e.BytesPerSecond, 1e9) || e.Samples != 1 {
		t.Fatalf("no first response: %+v", e)
	}
	// Every byte there by the first response (a reader that woke late):
	// no stream to time, so it is Observe too, not a sample of 0 B/s.
	// 3e6 bytes in 2.5ms - 1ms = 2e9 B/s; 0.5·1e9 + 0.5·2e9.
	l.ObserveRead("e", 3e6, t0.Add(-2500*time.Microsecond), t0.Add(-time.Millisecond), 3e6, t0)
	if e := l.Estimate("e", t0); !near(e.BytesPerSecond, 1.5e9) || e.Samples != 1 {
		t.Fatalf("all of it at the first response: %+v, want 1.5e9", e)
	}
	// Idle for less than DecayAfter: unchanged.
	if e := l.Estimate("a", t0.Add(5*time.Second)); !near(e.BytesPerSecond, 1.125e9) || !e.Updated.Equal(t0) {
		t.Fatalf("within DecayAfter: %+v", e)
	}
	// DecayAfter plus one half-life idle: halfway back to the seed:
	// 1e9 + 0.125e9/2.
	if e := l.Estimate("a", t0.Add(15*time.Second)); !near(e.BytesPerSecond, 1.0625e9) {
		t.Fatalf("after one half-life: %v, want 1.0625e9", e.BytesPerSecond)
	}
	if e := l.Estimate("a", t0.Add(15*time.Second)); !near(float64(e.RTT), float64(1500*time.Microsecond)) {
		t.Fatalf("rtt after one half-life: %v, want 1.5ms", e.RTT)
	}
	// Fetch time: one round trip plus bytes at the bandwidth.
	e = Estimate{BytesPerSecond: 1e9, RTT: time.Millisecond}
	if got := e.FetchTime(5e6, 4); got != 6*time.Millisecond {
		t.Fatalf("fetch time %v, want 6ms", got)
	}
	e.Fixed, e.PerBlock = 500*time.Microsecond, 100*time.Microsecond
	if got := e.FetchTime(5e6, 4); got != 6900*time.Microsecond {
		t.Fatalf("fetch time with fixed and per-block costs %v, want 6.9ms", got)
	}
	if all := l.All(t0); len(all) != 6 || all[0].Peer != "a" || all[5].Peer != "slow" {
		t.Fatalf("all: %+v", all)
	}
}

func TestLinksConvergeToTheMeasuredRate(t *testing.T) {
	l := NewLinks(LinkConfig{})
	now := time.Unix(0, 0)
	for range 30 {
		now = now.Add(time.Millisecond)
		l.Observe("p", 64<<20, 500*time.Millisecond, now) // 134 MB/s
	}
	got := l.Estimate("p", now).BytesPerSecond
	if want := float64(64<<20) / (0.5 - 200e-6); math.Abs(got-want)/want > 0.01 {
		t.Fatalf("estimate %v after 30 equal samples, want within 1%% of %v", got, want)
	}
}

// A link sampled once a second, far slower than its seed, must settle on
// what it measures: idle time within DecayAfter must not pull it back.
func TestLinksSlowLinkInUseKeepsItsRate(t *testing.T) {
	l := NewLinks(LinkConfig{SeedBytesPerSecond: 1.25e9})
	now := time.Unix(0, 0)
	for range 24 {
		now = now.Add(time.Second)
		l.ObserveRead("p", 2e6, now.Add(-40*time.Millisecond), now.Add(-40*time.Millisecond), 0, now) // 50 MB/s
	}
	if got := l.Estimate("p", now.Add(time.Second)).BytesPerSecond; math.Abs(got-50e6)/50e6 > 0.01 {
		t.Fatalf("estimate %v after 24 samples of 50 MB/s a second apart, want within 1%%", got)
	}
}

// The fit of what fetches cost recovers the fixed and per-block costs and
// the rate from whole fetches of mixed chain lengths and block sizes; with
// one block size it predicts as well (the prior splits the collinear
// terms); with one chain length too; a stalled fetch moves it a bounded
// step; an idle link's fit decays to the seed.
func TestLinksFitFixedAndPerBlockCosts(t *testing.T) {
	const bw, rtt = 2e9, 100 * time.Microsecond
	const fixed, perBlock = 400 * time.Microsecond, 30 * time.Microsecond
	fetch := func(blocks int, blockBytes int64) (int64, time.Duration) {
		n := int64(blocks) * blockBytes
		return n, rtt + fixed + time.Duration(blocks)*perBlock + time.Duration(float64(n)/bw*1e9)
	}
	t0 := time.Unix(1000, 0)
	newLinks := func() *Links {
		// A stream estimate 10 % off: the fit finds the rate fetches run at.
		return NewLinks(LinkConfig{Seeds: map[string]Seed{"a": {BytesPerSecond: 0.9 * bw, RTT: rtt}}})
	}
	l := newLinks()
	if e := l.Estimate("a", t0); e.Fixed != 530*time.Microsecond || e.PerBlock != 0 || e.FitSamples != 0 || e.FetchBytesPerSecond != 0.9*bw {
		t.Fatalf("seed: %+v", e)
	}
	check := func(what string, e Estimate, sizes []int64) {
		t.Helper()
		for _, blocks := range []int{1, 4, 16, 64} {
			for _, size := range sizes {
				n, d := fetch(blocks, size)
				if got := e.FetchTime(n, blocks); math.Abs(float64(got-d)) > 0.01*float64(d) {
					t.Errorf("%s: %d blocks of %d bytes: predicted %v, took %v", what, blocks, size, got, d)
				}
			}
		}
	}
	sizes := []int64{1 << 20, 4 << 20}
	for i := range 64 {
		blocks := []int{1, 4, 16, 64}[i%4]
		n, d := fetch(blocks, sizes[i/4%2])
		l.ObserveFetch("a", blocks, n, d, t0)
	}
	e := l.Estimate("a", t0)
	if math.Abs(float64(e.Fixed-fixed)) > float64(5*time.Microsecond) || math.Abs(float64(e.PerBlock-perBlock)) > float64(3*time.Microsecond) ||
		math.Abs(e.FetchBytesPerSecond-bw) > 0.01*bw {
		t.Fatalf("fit over mixed chains and sizes: fixed %v, per block %v, %.3g B/s; want %v, %v, %.3g", e.Fixed, e.PerBlock, e.FetchBytesPerSecond, fixed, perBlock, bw)
	}
	check("mixed sizes", e, sizes)

	// One block size: per-block and per-byte costs are one term.
	l = newLinks()
	for i := range 64 {
		blocks := []int{1, 4, 16, 64}[i%4]
		n, d := fetch(blocks, 2<<20)
		l.ObserveFetch("a", blocks, n, d, t0)
	}
	if e := l.Estimate("a", t0); math.Abs(float64(e.Fixed-fixed)) > float64(10*time.Microsecond) {
		t.Fatalf("fit over mixed chains: fixed %v, want %v", e.Fixed, fixed)
	}
	check("2 MiB blocks", l.Estimate("a", t0), []int64{2 << 20})

	// One chain length: the prediction for it is right.
	l = newLinks()
	for range 100 {
		n, d := fetch(16, 2<<20)
		l.ObserveFetch("a", 16, n, d, t0)
	}
	n, d := fetch(16, 2<<20)
	if got := l.Estimate("a", t0).FetchTime(n, 16); math.Abs(float64(got-d)) > 0.01*float64(d) {
		t.Fatalf("one chain length: predicted %v, took %v", got, d)
	}

	// A fetch that stalled for a second moves the fit a bounded step.
	before := l.Estimate("a", t0).FetchTime(n, 16)
	l.ObserveFetch("a", 16, n, d+time.Second, t0)
	if jump := l.Estimate("a", t0).FetchTime(n, 16) - before; jump <= 0 || jump > 15*time.Millisecond {
		t.Fatalf("a stalled fetch moved the prediction by %v", jump)
	}

	// Idle past DecayAfter and a half-life: halfway back to the seed.
	l = newLinks()
	l.Observe("a", 0, rtt, t0) // a round-trip sample dates the link
	for range 100 {
		n, d := fetch(4, 2<<20)
		l.ObserveFetch("a", 4, n, d, t0)
	}
	fit := l.Estimate("a", t0).Fixed
	half := l.Estimate("a", t0.Add(90*time.Second)).Fixed
	if want := (fit + 530*time.Microsecond) / 2; math.Abs(float64(half-want)) > float64(time.Microsecond) {
		t.Fatalf("fixed cost after a half-life idle: %v, want %v (fit %v)", half, want, fit)
	}
}

// Fetches whose cost per block falls as chains grow (their blocks share
// pins, the connections' start, commits), as measured on loopback: the
// fit finds the cost per doubling and predicts every chain length, where
// a line through them is off by a quarter at 4 blocks.
func TestLinksFitACostPerDoubling(t *testing.T) {
	const bw, rtt, size = 4e9, 100 * time.Microsecond, 2 << 20
	const fixed, perDoubling = 250 * time.Microsecond, 150 * time.Microsecond
	fetch := func(blocks int) (int64, time.Duration) {
		n := int64(blocks) * size
		return n, rtt + fixed + time.Duration(math.Log2(float64(blocks))*float64(perDoubling)) + time.Duration(float64(n)/bw*1e9)
	}
	t0 := time.Unix(1000, 0)
	l := NewLinks(LinkConfig{Seeds: map[string]Seed{"a": {BytesPerSecond: bw, RTT: rtt}}})
	for i := range 64 {
		blocks := []int{1, 4, 16, 64}[i%4]
		n, d := fetch(blocks)
		l.ObserveFetch("a", blocks, n, d, t0)
	}
	e := l.Estimate("a", t0)
	if math.Abs(float64(e.PerDoubling-perDoubling)) > float64(15*time.Microsecond) {
		t.Errorf("per doubling %v, want %v (fixed %v, per block %v, %.3g B/s)", e.PerDoubling, perDoubling, e.Fixed, e.PerBlock, e.FetchBytesPerSecond)
	}
	for _, blocks := range []int{1, 2, 4, 8, 16, 32, 64} {
		n, d := fetch(blocks)
		if got := e.FetchTime(n, blocks); math.Abs(float64(got-d)) > 0.02*float64(d) {
			t.Errorf("%d blocks: predicted %v, took %v", blocks, got, d)
		}
	}
	// Idle, the cost per doubling decays away with the rest of the fit.
	l.Observe("a", 0, rtt, t0) // the link's last measurement
	if e := l.Estimate("a", t0.Add(time.Hour)); e.PerDoubling > time.Microsecond {
		t.Errorf("an hour idle: per doubling %v, want about 0", e.PerDoubling)
	}
}

// TestLinksFetchRateStaysFinite: fetches whose time does not grow with
// their bytes (a fixed cost swamping a fast link, as 64 KiB blocks on
// loopback) may fit a per-byte cost below 0; it is then held at the
// link's bandwidth, so the fetch rate stays finite and the estimate can
// be published (an infinite one made every node drop the link from its
// record).
func TestLinksFetchRateStaysFinite(t *testing.T) {
	const bw, rtt, size = 4e9, 50 * time.Microsecond, 64 << 10
	t0 := time.Unix(1000, 0)
	l := NewLinks(LinkConfig{Seeds: map[string]Seed{"a": {BytesPerSecond: bw, RTT: rtt}}})
	for i := range 64 {
		blocks := []int{1, 4, 16, 64}[i%4]
		// Longer chains a little faster in all: the noise of a busy host.
		d := rtt + 2*time.Millisecond - time.Duration(blocks)*10*time.Microsecond
		l.ObserveFetch("a", blocks, int64(blocks)*size, d, t0)
	}
	e := l.Estimate("a", t0)
	if math.IsInf(e.FetchBytesPerSecond, 0) || math.IsNaN(e.FetchBytesPerSecond) || e.FetchBytesPerSecond <= 0 {
		t.Fatalf("fetch rate %v", e.FetchBytesPerSecond)
	}
	for _, v := range []time.Duration{e.Fixed, e.PerBlock, e.PerDoubling} {
		if v < 0 {
			t.Errorf("a negative term: fixed %v, per block %v, per doubling %v", e.Fixed, e.PerBlock, e.PerDoubling)
		}
	}
	// What a plan would take from it: about the 2 ms each fetch took.
	if got := e.FetchTime(16*size, 16); got < time.Millisecond || got > 3*time.Millisecond {
		t.Errorf("16 blocks predicted in %v", got)
	}
}

// TestLinksFitFollowsTypicalFetches: fetch times on a busy host are
// skewed, most near the typical time, some faster and a few much slower.
// The fit predicts the typical fetch of every chain length within 5 %:
// weighing each error by what that fetch took would trust the fast ones
// most and predicted 10 % fast here (short chains 10-15 % fast on
// loopback).
func TestLinksFitFollowsTypicalFetches(t *testing.T) {
	const bw, rtt, size = 4e9, 100 * time.Microsecond, 2 << 20
	const fixed = 250 * time.Microsecond
	typical := func(blocks int) (int64, time.Duration) {
		n := int64(blocks) * size
		return n, rtt + fixed + time.Duration(float64(n)/bw*1e9)
	}
	// The spread of one chain's fetches around its typical time: one in
	// four 30 % fast, one in eight twice as slow.
	spread := []float64{1, 0.7, 1, 1, 2, 1, 0.7, 1}
	t0 := time.Unix(1000, 0)
	l := NewLinks(LinkConfig{Seeds: map[string]Seed{"a": {BytesPerSecond: bw, RTT: rtt}}})
	for i := range 256 {
		blocks := []int{1, 4, 16, 64}[i%4]
		n, d := typical(blocks)
		l.ObserveFetch("a", blocks, n, time.Duration(float64(d)*spread[(i/4)%len(spread)]), t0)
	}
	e := l.Estimate("a", t0)
	for _, blocks := range []int{1, 4, 16, 64} {
		n, d := typical(blocks)
		if got := e.FetchTime(n, blocks); math.Abs(float64(got-d)) > 0.05*float64(d) {
			t.Errorf("%d blocks: predicted %v, typically %v (%+.1f %%)", blocks, got, d, 100*(got.Seconds()-d.Seconds())/d.Seconds())
		}
	}
}

// BenchmarkObserveFetch is the bookkeeping after every fetch: the fit
// solved over a full window (to clip the new fetch), then the fetch added.
func BenchmarkObserveFetch(b *testing.B) {
	l := NewLinks(LinkConfig{Seeds: map[string]Seed{"a": {BytesPerSecond: 5e9, RTT: 100 * time.Microsecond}}})
	t0 := time.Unix(1000, 0)
	chains := []int{1, 4, 16, 64}
	for i := range fitWindow {
		blocks := chains[i%len(chains)]
		l.ObserveFetch("a", blocks, int64(blocks)<<21, time.Duration(blocks)*450*time.Microsecond, t0)
	}
	i := 0
	for b.Loop() {
		blocks := chains[i%len(chains)]
		l.ObserveFetch("a", blocks, int64(blocks)<<21, time.Duration(blocks)*(400+time.Duration(i%7)*20)*time.Microsecond, t0)
		i++
	}
}
