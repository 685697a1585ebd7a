package transfer

import (
	"math"
	"sort"
	"sync"
	"time"
)

// LinkConfig configures link estimation.
type LinkConfig struct {
	// SeedBytesPerSecond is a link's bandwidth before anything was
	// measured, and what an idle link's estimate decays toward. Default
	// 1.25e9 (10 Gbit/s).
	SeedBytesPerSecond float64
	// SeedRTT is a link's round trip before anything was measured. Default
	// 200 µs.
	SeedRTT time.Duration
	// Alpha is the weight of a new sample in the moving average, in (0, 1].
	// Default 0.3.
	Alpha float64
	// DecayAfter is how long a link may go unmeasured before its estimate
	// starts moving back toward the seed. A link in use keeps exactly what
	// its transfers measured; one left idle (perhaps because it measured
	// slow) is eventually tried again. Default 30 s.
	DecayAfter time.Duration
	// HalfLife is how long, after DecayAfter, an idle link's estimate
	// takes to move halfway back to its seed. Default 60 s.
	HalfLife time.Duration
	// MinSampleBytes: transfers smaller than this measure latency only;
	// larger ones measure bandwidth. Default 256 KiB.
	MinSampleBytes int64
	// Seeds overrides the seed per peer (from the config file: a link
	// known to be slower or faster than the default).
	Seeds map[string]Seed
}

// Seed is a link's assumed bandwidth and round trip.
type Seed struct {
	BytesPerSecond float64
	RTT            time.Duration
}

func (c *LinkConfig) fill() {
	if c.SeedBytesPerSecond <= 0 {
		c.SeedBytesPerSecond = 1.25e9
	}
	if c.SeedRTT <= 0 {
		c.SeedRTT = 200 * time.Microsecond
	}
	if c.Alpha <= 0 || c.Alpha > 1 {
		c.Alpha = 0.3
	}
	if c.DecayAfter <= 0 {
		c.DecayAfter = 30 * time.Second
	}
	if c.HalfLife <= 0 {
		c.HalfLife = 60 * time.Second
	}
	if c.MinSampleBytes <= 0 {
		c.MinSampleBytes = 256 << 10
	}
}

// Links keeps a bandwidth and latency estimate per peer, from real
// transfers: an exponentially weighted moving average seeded from config,
// decaying toward the seed while the link is idle. It is pure: time comes
// in as an argument. Safe for concurrent use.
type Links struct {
	cfg   LinkConfig
	mu    sync.Mutex
	links map[string]*link
}

type link struct {
	seed       Seed
	bw, rtt    float64 // bytes/s, seconds
	updated    time.Time
	bwSamples  int64
	rttSamples int64
	bytes      int64
}

// NewLinks returns an empty set of estimates.
func NewLinks(cfg LinkConfig) *Links {
	cfg.fill()
	return &Links{cfg: cfg, links: map[string]*link{}}
}

func (l *Links) get(peer string) *link {
	k, ok := l.links[peer]
	if !ok {
		s, ok := l.cfg.Seeds[peer]
		if !ok || s.BytesPerSecond <= 0 {
			s = Seed{BytesPerSecond: l.cfg.SeedBytesPerSecond, RTT: l.cfg.SeedRTT}
		}
		if s.RTT <= 0 {
			s.RTT = l.cfg.SeedRTT
		}
		k = &link{seed: s, bw: s.BytesPerSecond, rtt: s.RTT.Seconds()}
		l.links[peer] = k
	}
	return k
}

// current returns k's bandwidth and round trip as of now: what was last
// measured, moved toward the seed for the idle time past DecayAfter. It
// does not change k, so reading an estimate never ages it.
func (l *Links) current(k *link, now time.Time) (bw, rtt float64) {
	idle := now.Sub(k.updated) - l.cfg.DecayAfter
	if k.updated.IsZero() || idle <= 0 {
		return k.bw, k.rtt
	}
	f := math.Exp2(-float64(idle) / float64(l.cfg.HalfLife))
	return k.seed.BytesPerSecond + (k.bw-k.seed.BytesPerSecond)*f, k.seed.RTT.Seconds() + (k.rtt-k.seed.RTT.Seconds())*f
}

// Observe records a transfer of n bytes from or to peer that took d,
// finishing at now. Transfers under MinSampleBytes update the round trip;
// larger ones the bandwidth, net of one round trip.
func (l *Links) Observe(peer string, n int64, d time.Duration, now time.Time) {
	if d <= 0 {
		return
	}
	if n < l.cfg.MinSampleBytes {
		l.record(peer, n, now, d.Seconds(), nil)
		return
	}
	l.record(peer, n, now, 0, func(rtt float64) float64 {
		return float64(n) / max(d.Seconds()-rtt, d.Seconds()/2)
	})
}

// ObserveRead records a read of n bytes from peer, requested at start,
// whose first response arrived at first carrying firstBytes of payload
// (Batch.FirstResponse), and which finished at end. Bandwidth comes from
// the bytes after the first response over the time after it, measured on
// the data path: a slow round trip or a busy peer does not inflate it the
// way subtracting an averaged round trip would. The stream is credited
// with at least half the total time, so a response that sat in a socket
// buffer cannot make a link look faster than twice its plain rate. A zero
// first falls back to Observe.
func (l *Links) ObserveRead(peer string, n int64, start, first time.Time, firstBytes int64, end time.Time) {
	total := end.Sub(start)
	if first.IsZero() || first.Before(start) || first.After(end) || firstBytes > n {
		l.Observe(peer, n, total, end)
		return
	}
	if total <= 0 {
		return
	}
	if n < l.cfg.MinSampleBytes {
		l.record(peer, n, end, 0, nil)
		return
	}
	stream := max(end.Sub(first).Seconds(), total.Seconds()/2)
	l.record(peer, n, end, 0, func(float64) float64 { return float64(n-firstBytes) / stream })
}

// record applies one transfer of n bytes with peer that finished at now:
// a round-trip sample when rtt is positive, and a bandwidth sample when
// bandwidth is set (given the link's current round trip, in seconds).
func (l *Links) record(peer string, n int64, now time.Time, rtt float64, bandwidth func(rtt float64) float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.get(peer)
	k.bw, k.rtt = l.current(k, now)
	a := l.cfg.Alpha
	if rtt > 0 {
		k.rtt = (1-a)*k.rtt + a*rtt
		k.rttSamples++
	}
	if bandwidth != nil {
		k.bw = (1-a)*k.bw + a*bandwidth(k.rtt)
		k.bwSamples++
	}
	k.bytes += n
	if now.After(k.updated) {
		k.updated = now
	}
}

// Estimate is what Links knows of one link.
type Estimate struct {
	Peer           string
	BytesPerSecond float64
	RTT            time.Duration
	// Samples is how many transfers measured bandwidth; 0 means the
	// estimate is the seed.
	Samples    int64
	RTTSamples int64
	Bytes      int64
	// Updated is the last measurement's time (zero if none).
	Updated time.Time
}

// Estimate returns peer's estimate as of now.
func (l *Links) Estimate(peer string, now time.Time) Estimate {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.get(peer)
	bw, rtt := l.current(k, now)
	return Estimate{Peer: peer, BytesPerSecond: bw, RTT: time.Duration(rtt * float64(time.Second)),
		Samples: k.bwSamples, RTTSamples: k.rttSamples, Bytes: k.bytes, Updated: k.updated}
}

// All returns every known link's estimate, by peer.
func (l *Links) All(now time.Time) []Estimate {
	l.mu.Lock()
	peers := make([]string, 0, len(l.links))
	for p := range l.links {
		peers = append(peers, p)
	}
	l.mu.Unlock()
	sort.Strings(peers)
	out := make([]Estimate, len(peers))
	for i, p := range peers {
		out[i] = l.Estimate(p, now)
	}
	return out
}

// FetchTime is the estimated time to move n bytes from peer: one round
// trip plus n at the link's bandwidth.
func (e Estimate) FetchTime(n int64) time.Duration {
	return e.RTT + time.Duration(float64(n)/e.BytesPerSecond*float64(time.Second))
}

// Seed is what a link to peer is assumed to be before it is measured:
// its entry in LinkConfig.Seeds, or the default seed. An empty peer gives
// the default.
func (l *Links) Seed(peer string) Seed {
	if s, ok := l.cfg.Seeds[peer]; ok && peer != "" {
		return s
	}
	return Seed{BytesPerSecond: l.cfg.SeedBytesPerSecond, RTT: l.cfg.SeedRTT}
}
