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
	if got := e.FetchTime(5e6); got != 6*time.Millisecond {
		t.Fatalf("fetch time %v, want 6ms", got)
	}
	if all := l.All(t0); len(all) != 5 || all[0].Peer != "a" || all[4].Peer != "slow" {
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
