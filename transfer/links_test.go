package transfer

import (
	"math"
	"testing"
	"time"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestLinksExactNumbers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := NewLinks(LinkConfig{SeedBytesPerSecond: 1e9, SeedRTT: time.Millisecond, Alpha: 0.5, HalfLife: 10 * time.Second,
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
	// One half-life idle: halfway back to the seed: 1e9 + 0.25e9/2.
	if e := l.Estimate("a", t0.Add(10*time.Second)); !near(e.BytesPerSecond, 1.125e9) {
		t.Fatalf("after one half-life: %v, want 1.125e9", e.BytesPerSecond)
	}
	if e := l.Estimate("a", t0.Add(10*time.Second)); !near(float64(e.RTT), float64(1500*time.Microsecond)) {
		t.Fatalf("rtt after one half-life: %v, want 1.5ms", e.RTT)
	}
	// Fetch time: one round trip plus bytes at the bandwidth.
	e = Estimate{BytesPerSecond: 1e9, RTT: time.Millisecond}
	if got := e.FetchTime(5e6); got != 6*time.Millisecond {
		t.Fatalf("fetch time %v, want 6ms", got)
	}
	if all := l.All(t0); len(all) != 2 || all[0].Peer != "a" || all[1].Peer != "slow" {
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
