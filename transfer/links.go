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
	// SeedFixed is what a fetch costs beyond its round trip and its
	// bytes before any fetch was measured (the call, pins, reserve,
	// commit, publish).
	// Default 530 µs: the intercept of `kvpool node bench --remote`'s
	// p50 per Fetch against its bytes, over chains of 4, 16 and 64
	// 2-MiB blocks, on a 2-vCPU machine. Negative: 0. A link left idle
	// decays toward the seeds as its bandwidth does.
	SeedFixed time.Duration
	// SeedPerBlock is what each block of a fetch adds beyond its bytes,
	// before anything was measured. Default 0.
	SeedPerBlock time.Duration
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
	if c.SeedFixed == 0 {
		c.SeedFixed = 530 * time.Microsecond
	}
	c.SeedFixed, c.SeedPerBlock = max(c.SeedFixed, 0), max(c.SeedPerBlock, 0)
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
	fit        fetchFit
}

// fetchFit models a whole fetch from the link as
//
//	d = rtt + fixed + perBlock·blocks + perDoubling·log2(blocks) + perByte·bytes
//
// by least squares of the relative error over the last fitWindow
// fetches (a 1-block fetch counts as much as a 64-block one),
// regularized toward a prior with the weight of a quarter of a fetch: the
// seeds for fixed and perBlock, 0 for perDoubling, the link's streaming
// bandwidth for perByte. perDoubling is what a fetch pays each time its
// chain doubles: a chain's blocks share the pins, the connections'
// start and the commits, so each block of a long chain costs less than
// one of a short chain (measured: 0.7 ms a block from 1 to 4 blocks, 0.45
// from 16 to 64), a concave curve a line cannot follow. With blocks of
// one size, blocks and bytes say the same, and the prior splits the cost
// between them; the prediction is as good. No term goes negative: one
// that would is held at 0 and the others refitted. The round trip is
// subtracted with its estimate at fit time, so a fit always agrees with
// the round trip it is added to.
type fetchFit struct {
	seed    [2]float64 // fixed, perBlock, seconds
	obs     [fitWindow]fetchObs
	n, next int
	samples int64
	// solved caches the last solve: planning asks for a link's estimate
	// far more often than fetches change it.
	solved      bool
	solvedFor   [2]float64 // rtt, bw
	solvedTheta fitTerms
}

// fitTerms are the fit's terms, in seconds per unit of fetchShape's:
// fixed, perBlock, perDoubling, perByte.
type fitTerms [4]float64

// fetchShape is what each term of a fetch of blocks blocks and n bytes
// is multiplied by.
func fetchShape(blocks float64, n float64) fitTerms {
	return fitTerms{1, blocks, math.Log2(max(blocks, 1)), n}
}

// predict is the fit's duration, beyond the round trip, of a fetch of
// blocks blocks and n bytes.
func (t fitTerms) predict(blocks float64, n float64) float64 {
	return t.predictShape(fetchShape(blocks, n))
}

// predictShape is predict of a fetch of shape x.
func (t fitTerms) predictShape(x fitTerms) float64 {
	d := 0.0
	for i := range t {
		d += t[i] * x[i]
	}
	return d
}

// fitWindow is how many recent fetches the fit weighs. More fetches steady
// the terms: on a 2-vCPU host whose fetches scatter by 8-15 % around
// their median, the prediction's median error exceeded that scatter by 0.6
// to 3.4 points with 32 and by -0.5 to 2.3 with 96, nine runs of each
// interleaved (FetchPrediction). Fewer follow a change sooner: after a
// link slows by half, chains of 1 to 64 blocks in rotation are predicted
// within 10 % after 24 fetches with 32, 60 with 96.
const fitWindow = 96

// fitScale puts the fit's terms on one scale: a fetch of 16 blocks of
// 2 MiB.
var fitScale = fetchShape(16, 32<<20)

func newFit(fixed, perBlock time.Duration) fetchFit {
	return fetchFit{seed: [2]float64{fixed.Seconds(), perBlock.Seconds()}}
}

// fetchObs is one fetch the fit weighs: its shape (fetchShape), also
// divided by fitScale, kept so that each solve takes no logarithm or
// division per fetch again, and the seconds it took.
type fetchObs struct {
	shape, scaled fitTerms
	took          float64
}

// observe adds one fetch of blocks blocks and n bytes that took d seconds
// in all.
func (f *fetchFit) observe(blocks int, n int64, d float64) {
	o := fetchObs{shape: fetchShape(float64(blocks), float64(n)), took: d}
	for i := range o.scaled {
		o.scaled[i] = o.shape[i] / fitScale[i]
	}
	f.obs[f.next] = o
	f.next = (f.next + 1) % fitWindow
	f.n = min(f.n+1, fitWindow)
	f.samples++
	f.solved = false
}

// solve returns the terms given the link's round trip and streaming
// bandwidth now.
//
// REQUIRES: the Links' mutex (it caches its answer).
func (f *fetchFit) solve(rtt, bw float64) fitTerms {
	prior := fitTerms{f.seed[0], f.seed[1], 0, 1 / bw}
	if f.n == 0 {
		return prior
	}
	if f.solved && f.solvedFor == [2]float64{rtt, bw} {
		return f.solvedTheta
	}
	// The last fit weighs this one's fetches; before the first, the
	// prior does (a fit's per-byte term is never 0).
	last := f.solvedTheta
	if last[bytesTerm] == 0 {
		last = prior
	}
	f.solved, f.solvedFor = true, [2]float64{rtt, bw}
	f.solvedTheta = f.solveFree(rtt, prior, last)
	return f.solvedTheta
}

// bytesTerm is the fit's per-byte term: the inverse of the rate whole
// fetches move bytes at.
const bytesTerm = 3

// solveFree fits the terms, holding each that would go negative at 0,
// but the per-byte term at its prior (the link's measured bandwidth): a
// fetch costs time per byte, and 0 would be an infinite rate (fetches
// of equal blocks, whose bytes follow their block count, can fit any
// split between the two).
func (f *fetchFit) solveFree(rtt float64, prior, last fitTerms) fitTerms {
	var free [len(fitTerms{})]bool
	for i := range free {
		free[i] = true
	}
	var hold fitTerms
	for {
		theta := f.fit(rtt, prior, last, free, hold)
		worst := -1
		for i, v := range theta {
			if free[i] && v < 0 && (worst < 0 || v < theta[worst]) {
				worst = i
			}
		}
		if worst < 0 {
			return theta
		}
		free[worst] = false // held, then refit
		if worst == bytesTerm {
			hold[bytesTerm] = prior[bytesTerm]
		}
	}
}

// huberCut is the relative error up to which a fetch counts fully in the
// fit; beyond it, a fetch's weight falls as 1/|error|.
const huberCut = 0.1

func huberWeight(relErr float64) float64 {
	if a := math.Abs(relErr); a > huberCut {
		return huberCut / a
	}
	return 1
}

// fit solves the weighted, regularized normal equations for the free
// terms, the others held at their values in hold. Terms are scaled by
// fitScale so the regularization weighs each alike.
func (f *fetchFit) fit(rtt float64, prior, last fitTerms, free [len(fitTerms{})]bool, hold fitTerms) fitTerms {
	const terms = len(fitTerms{})
	// Errors count relative to each fetch's duration, so short fetches
	// weigh as much as long ones; the prior's, relative to the duration
	// of the fitScale fetch it predicts.
	const w = 0.25
	ref := prior.predict(fitScale[1], fitScale[3])
	var m [terms][terms]float64
	var r fitTerms
	for i := range terms {
		m[i][i] = w / (ref * ref)
		r[i] = w * prior[i] * fitScale[i] / (ref * ref)
	}
	for k := range f.n {
		o := &f.obs[k]
		x := &o.scaled
		y := o.took - rtt
		// Each error counts relative to what the last fit expected of
		// the fetch, and fetches far from that (a stall, a lucky run)
		// count less the farther they are (Huber's weights, iterated as
		// fetches come): the fit follows the typical fetch, not the mean
		// of a skewed spread. Weighing by what each fetch took instead
		// trusted the fast ones most and predicted short chains 10-15 %
		// fast.
		expect := max(rtt+last.predictShape(o.shape), 1e-9)
		wk := huberWeight((o.took-expect)/expect) / (expect * expect)
		for i := range terms {
			wx := wk * x[i]
			for j := i; j < terms; j++ {
				m[i][j] += wx * x[j]
			}
			r[i] += wx * y
		}
	}
	// Only the upper triangle was summed; the matrix is symmetric.
	for i := range terms {
		for j := range i {
			m[i][j] = m[j][i]
		}
	}
	for i := range terms {
		if !free[i] {
			// The held term's share of each fetch moves to the right.
			v := hold[i] * fitScale[i]
			for j := range terms {
				if j != i {
					r[j] -= m[j][i] * v
				}
			}
			for j := range terms {
				m[i][j], m[j][i] = 0, 0
			}
			m[i][i], r[i] = 1, v
		}
	}
	z := solveLinear(m, r)
	for i := range z {
		z[i] /= fitScale[i]
	}
	return z
}

// solveLinear solves m·z = r by Gaussian elimination with partial
// pivoting; m is symmetric positive definite here (the regularization
// sees to it).
func solveLinear(m [len(fitTerms{})][len(fitTerms{})]float64, r fitTerms) fitTerms {
	const n = len(fitTerms{})
	for c := range n {
		p := c
		for i := c + 1; i < n; i++ {
			if math.Abs(m[i][c]) > math.Abs(m[p][c]) {
				p = i
			}
		}
		m[c], m[p] = m[p], m[c]
		r[c], r[p] = r[p], r[c]
		for i := c + 1; i < n; i++ {
			f := m[i][c] / m[c][c]
			for j := c; j < n; j++ {
				m[i][j] -= f * m[c][j]
			}
			r[i] -= f * r[c]
		}
	}
	var z fitTerms
	for i := n - 1; i >= 0; i-- {
		v := r[i]
		for j := i + 1; j < n; j++ {
			v -= m[i][j] * z[j]
		}
		z[i] = v / m[i][i]
	}
	return z
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
		k = &link{seed: s, bw: s.BytesPerSecond, rtt: s.RTT.Seconds(), fit: newFit(l.cfg.SeedFixed, l.cfg.SeedPerBlock)}
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
// first, or a first response by which all n bytes had arrived, falls back
// to Observe.
func (l *Links) ObserveRead(peer string, n int64, start, first time.Time, firstBytes int64, end time.Time) {
	total := end.Sub(start)
	if first.IsZero() || first.Before(start) || first.After(end) || firstBytes >= n {
		// (All of it there at the first response, or more, counting what
		// the peer's other connections held: no stream to time.)
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

// ObserveFetch records a whole fetch from peer of blocks blocks and n
// bytes that took d (the call, pins, reserve, the transfer, checksums,
// commits and the answer to the caller) and finished at now, for the fit
// of what fetches over the link cost (Estimate's Fixed, PerBlock,
// PerDoubling and FetchBytesPerSecond).
func (l *Links) ObserveFetch(peer string, blocks int, n int64, d time.Duration, now time.Time) {
	if d <= 0 || blocks <= 0 || n < 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.get(peer)
	// One fetch stalled far beyond the model (a GC pause, a preempted
	// peer) counts as at most ten times what the fit predicts.
	bw, rtt := l.current(k, now)
	t := k.fit.solve(rtt, bw)
	limit := 10 * (rtt + t.predict(float64(blocks), float64(n)) + 1e-3)
	k.fit.observe(blocks, n, min(d.Seconds(), limit))
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
	// Fixed and PerBlock are what one fetch costs beyond its round trip
	// and bytes, and what each block adds; PerDoubling what each doubling
	// of the chain adds (log2 of its blocks: the share of a fetch's work
	// that grows slower than its chain); FetchBytesPerSecond the rate
	// whole fetches moved bytes at: the fit of the last fetches
	// (ObserveFetch), the seeds (PerDoubling 0) and BytesPerSecond before
	// any. FitSamples is how many fetches the fit saw.
	Fixed, PerBlock, PerDoubling time.Duration
	FetchBytesPerSecond          float64
	FitSamples                   int64
}

// Estimate returns peer's estimate as of now.
func (l *Links) Estimate(peer string, now time.Time) Estimate {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.get(peer)
	bw, rtt := l.current(k, now)
	t := k.fit.solve(rtt, bw)
	fixed, perBlock, perDoubling, fetchBW := t[0], t[1], t[2], 1/t[3]
	if idle := now.Sub(k.updated) - l.cfg.DecayAfter; !k.updated.IsZero() && idle > 0 {
		// Idle: back toward the seeds, as the bandwidth goes.
		f := math.Exp2(-float64(idle) / float64(l.cfg.HalfLife))
		fixed = l.cfg.SeedFixed.Seconds() + (fixed-l.cfg.SeedFixed.Seconds())*f
		perBlock = l.cfg.SeedPerBlock.Seconds() + (perBlock-l.cfg.SeedPerBlock.Seconds())*f
		perDoubling *= f
		fetchBW = bw + (fetchBW-bw)*f
	}
	return Estimate{Peer: peer, BytesPerSecond: bw, RTT: time.Duration(rtt * float64(time.Second)),
		Samples: k.bwSamples, RTTSamples: k.rttSamples, Bytes: k.bytes, Updated: k.updated,
		Fixed: time.Duration(fixed * float64(time.Second)), PerBlock: time.Duration(perBlock * float64(time.Second)),
		PerDoubling:         time.Duration(perDoubling * float64(time.Second)),
		FetchBytesPerSecond: fetchBW, FitSamples: k.fit.samples}
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

// FetchTime is the estimated time to fetch blocks blocks of n bytes in
// all from peer: one round trip, the fixed, per-block and per-doubling
// costs, and n at the rate fetches move bytes (BytesPerSecond when that
// is unset).
func (e Estimate) FetchTime(n int64, blocks int) time.Duration {
	bw := e.FetchBytesPerSecond
	if !(bw > 0) {
		bw = e.BytesPerSecond
	}
	return e.RTT + e.Fixed + time.Duration(blocks)*e.PerBlock + time.Duration(math.Log2(float64(max(blocks, 1)))*float64(e.PerDoubling)) +
		time.Duration(float64(n)/bw*float64(time.Second))
}

// SeedCosts are a fetch's fixed and per-block costs before any fetch was
// measured.
func (l *Links) SeedCosts() (fixed, perBlock time.Duration) {
	return l.cfg.SeedFixed, l.cfg.SeedPerBlock
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
