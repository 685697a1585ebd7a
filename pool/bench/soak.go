package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpool/kvpool/api"
)

// SoakConfig configures Soak: a long mixed workload against one node, every
// byte read back checked, with the node's memory, goroutines and
// descriptors sampled throughout.
type SoakConfig struct {
	// Server is the node's address. Required.
	Server string
	// Metrics is the node's metrics address (host:port): heap and
	// goroutines come from its /metrics. Required.
	Metrics string
	// PID is the node's process id, for RSS, anonymous memory and open
	// descriptors from /proc; 0 takes RSS and descriptors from /metrics and
	// reports no anonymous memory.
	PID int
	// Duration is how long the workload runs. Required.
	Duration time.Duration
	// Paths are the paths the workers use, one worker per path and per
	// WorkersPerPath. Default shm, data and grpc.
	Paths []api.Path
	// WorkersPerPath is how many workers use each path. Default 1.
	WorkersPerPath int
	// Keys is how many key slots each worker cycles through. Default 1024.
	Keys int
	// MaxValueBytes bounds a value; sizes are log-uniform from 1 byte to
	// this. Default 1 MiB.
	MaxValueBytes int
	// SampleEvery is the sampling interval. Default Duration/30, from 1 s
	// to 1 min.
	SampleEvery time.Duration
	// Seed makes the workload repeatable. Default 1.
	Seed uint64
	// Progress, when set, receives one line per sample.
	Progress io.Writer
}

func (c *SoakConfig) fill() error {
	var errs []error
	if c.Server == "" || c.Metrics == "" {
		errs = append(errs, errors.New("soak: a server and its metrics address are required"))
	}
	if c.Duration <= 0 {
		errs = append(errs, errors.New("soak: the duration must be positive"))
	}
	if len(c.Paths) == 0 {
		c.Paths = []api.Path{api.PathShm, api.PathData, api.PathGRPC}
	}
	if c.WorkersPerPath == 0 {
		c.WorkersPerPath = 1
	}
	if c.Keys == 0 {
		c.Keys = 1024
	}
	if c.MaxValueBytes == 0 {
		c.MaxValueBytes = 1 << 20
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = min(max(c.Duration/30, time.Second), time.Minute)
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.WorkersPerPath < 0 || c.Keys < 1 || c.MaxValueBytes < 1 {
		errs = append(errs, errors.New("soak: workers, keys and value size must be positive"))
	}
	return errors.Join(errs...)
}

// SoakSample is the node's state at one moment. Byte counts are -1 where
// they could not be read.
type SoakSample struct {
	// Phase is "idle-before", "load" or "idle-after".
	Phase string  `json:"phase"`
	AtS   float64 `json:"at_s"` // since the workload began
	Ops   uint64  `json:"ops"`  // operations done so far
	// RSSBytes is the resident set, the arena's touched pages included.
	RSSBytes int64 `json:"rss_bytes"`
	// ShmemBytes is the resident part of shared mappings (the arena).
	ShmemBytes int64 `json:"shmem_bytes"`
	// AnonBytes is private anonymous memory: heap, stacks, buffers.
	AnonBytes  int64 `json:"anon_bytes"`
	HeapBytes  int64 `json:"heap_inuse_bytes"`
	Goroutines int   `json:"goroutines"`
	FDs        int   `json:"fds"`
}

// SoakBounds are how much a soak lets the node grow. Memory is compared
// between the median sample of the second quarter of the load (warm: the
// arena is full and evicting) and the median of the last quarter; counts
// also between the idle node before and after.
type SoakBounds struct {
	RSSRatio, RSSSlackBytes   float64 // end ≤ warm × ratio + slack
	AnonRatio, AnonSlackBytes float64
	HeapRatio, HeapSlackBytes float64
	GoroutineSlack            int // end ≤ warm + slack, and idle after ≤ idle before + slack
	FDSlack                   int
}

// DefaultSoakBounds are the bounds Soak applies.
var DefaultSoakBounds = SoakBounds{
	RSSRatio: 1.10, RSSSlackBytes: 48 << 20,
	AnonRatio: 1.25, AnonSlackBytes: 32 << 20,
	HeapRatio: 1.50, HeapSlackBytes: 32 << 20,
	GoroutineSlack: 20, FDSlack: 10,
}

// SoakPathStats counts one path's operations.
type SoakPathStats struct {
	Puts        uint64 `json:"puts"`
	Gets        uint64 `json:"gets"`
	Views       uint64 `json:"views"`
	Removes     uint64 `json:"removes"`
	Reserved    uint64 `json:"reserved_puts"`
	CheckedB    uint64 `json:"checked_bytes"`
	Evicted     uint64 `json:"evicted"`      // gets of a block the node had evicted
	Refused     uint64 `json:"refused_puts"` // ResourceExhausted
	NotFoundOKs uint64 `json:"removed_not_found"`
	Reconnects  uint64 `json:"reconnects"`
}

// SoakResult is what a soak did and saw.
type SoakResult struct {
	Server    string                   `json:"server"`
	DurationS float64                  `json:"duration_s"`
	Paths     map[string]SoakPathStats `json:"paths"`
	Samples   []SoakSample             `json:"samples"`
	// Warm and End are the medians Bounds compare; Failures says what
	// broke a bound or a check. Empty Failures is a pass.
	Warm     SoakSample `json:"warm"`
	End      SoakSample `json:"end"`
	Failures []string   `json:"failures"`
}

// Soak runs the workload for cfg.Duration and reports. A mismatched byte,
// a removed block served, or an error other than NotFound (after
// eviction) and ResourceExhausted is a failure, as is growth past
// DefaultSoakBounds. It returns an error only when it cannot run.
func Soak(ctx context.Context, cfg SoakConfig) (*SoakResult, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	res := &SoakResult{Server: cfg.Server, Paths: map[string]SoakPathStats{}}
	sampler := soakSampler{cfg: &cfg}
	before, err := sampler.settled(ctx, "idle-before", -1)
	if err != nil {
		return nil, err
	}
	res.Samples = append(res.Samples, before)

	var workers []*soakWorker
	for _, p := range cfg.Paths {
		for i := range cfg.WorkersPerPath {
			c, err := api.Dial(ctx, api.ClientConfig{Server: cfg.Server, Path: p})
			if err != nil {
				for _, w := range workers {
					w.client.Close()
				}
				return nil, fmt.Errorf("soak: dial %s over %v: %w", cfg.Server, p, err)
			}
			workers = append(workers, newSoakWorker(&cfg, c, p, i))
		}
	}
	var ops atomic.Uint64
	// NB: a cancel, not a deadline: the client turns a context deadline
	// into a socket deadline, which can fail a call an instant before
	// ctx.Err() says why; a cancel sets ctx.Err() first.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	timer := time.AfterFunc(cfg.Duration, stop)
	defer timer.Stop()
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() { w.run(runCtx, &ops) })
	}
	start := time.Now()
	tick := time.NewTicker(cfg.SampleEvery)
sampling:
	for {
		select {
		case <-runCtx.Done():
			break sampling
		case <-tick.C:
			s, err := sampler.sample("load", time.Since(start), ops.Load())
			if err != nil {
				res.Failures = append(res.Failures, fmt.Sprintf("sample at %v: %v", time.Since(start).Round(time.Second), err))
				continue
			}
			res.Samples = append(res.Samples, s)
			sampler.progress(s)
		}
	}
	tick.Stop()
	wg.Wait()
	res.DurationS = time.Since(start).Seconds()
	for _, w := range workers {
		w.client.Close()
		st := res.Paths[w.path.String()]
		st.add(w.stats)
		res.Paths[w.path.String()] = st
		res.Failures = append(res.Failures, w.failures...)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	// The node lets go of the clients' connections and sessions
	// asynchronously: wait (within 10 s) for its goroutines to settle.
	after, err := sampler.settled(ctx, "idle-after", before.Goroutines+DefaultSoakBounds.GoroutineSlack)
	if err != nil {
		return nil, err
	}
	after.AtS, after.Ops = res.DurationS, ops.Load()
	res.Samples = append(res.Samples, after)
	sampler.progress(after)
	res.Warm, res.End = soakWindows(res.Samples)
	res.Failures = append(res.Failures, CheckSoak(res.Samples, DefaultSoakBounds)...)
	return res, nil
}

func (s *SoakPathStats) add(o SoakPathStats) {
	s.Puts += o.Puts
	s.Gets += o.Gets
	s.Views += o.Views
	s.Removes += o.Removes
	s.Reserved += o.Reserved
	s.CheckedB += o.CheckedB
	s.Evicted += o.Evicted
	s.Refused += o.Refused
	s.NotFoundOKs += o.NotFoundOKs
	s.Reconnects += o.Reconnects
}

// soakWindows returns the medians of the load samples in the second
// quarter (warm) and in the last quarter (end) of the load, field by
// field.
func soakWindows(samples []SoakSample) (warm, end SoakSample) {
	var load []SoakSample
	for _, s := range samples {
		if s.Phase == "load" {
			load = append(load, s)
		}
	}
	if len(load) == 0 {
		return SoakSample{}, SoakSample{}
	}
	n := len(load)
	warmW := load[n/4 : max(n/2, n/4+1)]
	endW := load[min(n*3/4, n-1):]
	return medianSample("warm", warmW), medianSample("end", endW)
}

func medianSample(phase string, w []SoakSample) SoakSample {
	med := func(f func(SoakSample) int64) int64 {
		v := make([]int64, len(w))
		for i, s := range w {
			v[i] = f(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return SoakSample{
		Phase:      phase,
		AtS:        w[len(w)/2].AtS,
		Ops:        w[len(w)/2].Ops,
		RSSBytes:   med(func(s SoakSample) int64 { return s.RSSBytes }),
		ShmemBytes: med(func(s SoakSample) int64 { return s.ShmemBytes }),
		AnonBytes:  med(func(s SoakSample) int64 { return s.AnonBytes }),
		HeapBytes:  med(func(s SoakSample) int64 { return s.HeapBytes }),
		Goroutines: int(med(func(s SoakSample) int64 { return int64(s.Goroutines) })),
		FDs:        int(med(func(s SoakSample) int64 { return int64(s.FDs) })),
	}
}

// CheckSoak judges samples (idle-before first, idle-after last, load
// between) against b, and says what grew past a bound. Pure: exact in,
// exact out.
func CheckSoak(samples []SoakSample, b SoakBounds) []string {
	var fails []string
	var before, after *SoakSample
	for i := range samples {
		switch samples[i].Phase {
		case "idle-before":
			before = &samples[i]
		case "idle-after":
			after = &samples[i]
		}
	}
	warm, end := soakWindows(samples)
	if warm.Phase == "" {
		return []string{"no samples were taken under load (the soak is shorter than its sampling interval)"}
	}
	bytesBound := func(what string, w, e int64, ratio, slack float64) {
		if w < 0 || e < 0 {
			return
		}
		if limit := float64(w)*ratio + slack; float64(e) > limit {
			fails = append(fails, fmt.Sprintf("%s grew from %s (warm) to %s (end), past the bound of %s (×%.2f + %s)",
				what, mib(w), mib(e), mib(int64(limit)), ratio, mib(int64(slack))))
		}
	}
	bytesBound("RSS", warm.RSSBytes, end.RSSBytes, b.RSSRatio, b.RSSSlackBytes)
	bytesBound("anonymous memory", warm.AnonBytes, end.AnonBytes, b.AnonRatio, b.AnonSlackBytes)
	bytesBound("heap in use", warm.HeapBytes, end.HeapBytes, b.HeapRatio, b.HeapSlackBytes)
	countBound := func(what, from string, w, e, slack int) {
		if w < 0 || e < 0 {
			return
		}
		if e > w+slack {
			fails = append(fails, fmt.Sprintf("%s grew from %d (%s) to %d, past the bound of %d (+%d)", what, w, from, e, w+slack, slack))
		}
	}
	countBound("goroutines", "warm", warm.Goroutines, end.Goroutines, b.GoroutineSlack)
	countBound("open descriptors", "warm", warm.FDs, end.FDs, b.FDSlack)
	if before != nil && after != nil {
		countBound("idle goroutines", "before the load", before.Goroutines, after.Goroutines, b.GoroutineSlack)
		countBound("idle open descriptors", "before the load", before.FDs, after.FDs, b.FDSlack)
	}
	return fails
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// soakSampler reads the node's state from /proc and /metrics.
type soakSampler struct {
	cfg *SoakConfig
}

// settled samples the idle node until its goroutines are at most
// goroutines (or 10 s pass); goroutines < 0 takes the first sample.
func (s *soakSampler) settled(ctx context.Context, phase string, goroutines int) (SoakSample, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		smp, err := s.sample(phase, 0, 0)
		if err != nil {
			return SoakSample{}, err
		}
		if goroutines < 0 || smp.Goroutines <= goroutines || time.Now().After(deadline) {
			return smp, nil
		}
		select {
		case <-ctx.Done():
			return SoakSample{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *soakSampler) sample(phase string, at time.Duration, ops uint64) (SoakSample, error) {
	m, err := scrapeMetrics(s.cfg.Metrics)
	if err != nil {
		return SoakSample{}, err
	}
	smp := SoakSample{Phase: phase, AtS: at.Seconds(), Ops: ops, RSSBytes: -1, ShmemBytes: -1, AnonBytes: -1,
		HeapBytes: int64(m["go_memstats_heap_inuse_bytes"]), Goroutines: int(m["go_goroutines"]), FDs: -1}
	if v, ok := m["process_resident_memory_bytes"]; ok {
		smp.RSSBytes = int64(v)
	}
	if v, ok := m["process_open_fds"]; ok {
		smp.FDs = int(v)
	}
	if s.cfg.PID > 0 {
		st, err := procKB(fmt.Sprintf("/proc/%d/status", s.cfg.PID), "VmRSS", "RssShmem", "RssAnon")
		if err != nil {
			return SoakSample{}, err
		}
		smp.RSSBytes, smp.ShmemBytes, smp.AnonBytes = st[0], st[1], st[2]
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.cfg.PID))
		if err != nil {
			return SoakSample{}, err
		}
		smp.FDs = len(fds)
	}
	return smp, nil
}

func (s *soakSampler) progress(smp SoakSample) {
	if s.cfg.Progress == nil {
		return
	}
	fmt.Fprintf(s.cfg.Progress, "soak %6.0fs %-11s %10d ops  rss %s  anon %s  heap %s  goroutines %d  fds %d\n",
		smp.AtS, smp.Phase, smp.Ops, mib(smp.RSSBytes), mib(smp.AnonBytes), mib(smp.HeapBytes), smp.Goroutines, smp.FDs)
}

// procKB reads the kB fields named from a /proc status file, in bytes.
func procKB(path string, fields ...string) ([]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(fields))
	for i := range out {
		out[i] = -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		if i := slices.Index(fields, name); i >= 0 {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err == nil {
				out[i] = kb << 10
			}
		}
	}
	return out, nil
}

// scrapeMetrics reads the unlabelled series of a node's /metrics.
func scrapeMetrics(addr string) (map[string]float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("soak: scrape: %w", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = v
		}
	}
	return out, sc.Err()
}

// soakWorker owns one tenant's key slots on one path, so what it expects
// of each block is exact: no other worker touches its keys.
type soakWorker struct {
	cfg      *SoakConfig
	client   *api.Client
	path     api.Path
	tenant   string
	rng      *rand.Rand
	slots    []soakSlot
	buf, val []byte
	stats    SoakPathStats
	failures []string
}

// soakSlot is a key slot: its block is key "<slot>.<gen>", value
// soakValue(slot, gen, size).
type soakSlot struct {
	gen     uint64
	size    int
	present bool // put and not removed; eviction may still have taken it
}

func newSoakWorker(cfg *SoakConfig, c *api.Client, p api.Path, i int) *soakWorker {
	return &soakWorker{cfg: cfg, client: c, path: p, tenant: fmt.Sprintf("soak-%v-%d", p, i),
		rng:   rand.New(rand.NewPCG(cfg.Seed, uint64(p)<<16|uint64(i))),
		slots: make([]soakSlot, cfg.Keys), buf: make([]byte, cfg.MaxValueBytes), val: make([]byte, cfg.MaxValueBytes)}
}

func (w *soakWorker) key(slot int, gen uint64) api.BlockKey {
	return api.BlockKey{Tenant: w.tenant, Namespace: "soak", Key: fmt.Appendf(nil, "%d.%d", slot, gen)}
}

// value fills w.val with the bytes of (slot, gen) and returns them.
func (w *soakWorker) value(slot int, gen uint64, size int) []byte {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/%d", w.tenant, slot, gen)
	v := w.val[:size]
	fillValue(v, h.Sum64())
	for i := size &^ 7; i < size; i++ { // fillValue leaves a ragged tail
		v[i] = byte(gen + uint64(i))
	}
	return v
}

func (w *soakWorker) fail(format string, args ...any) {
	if len(w.failures) < 10 {
		w.failures = append(w.failures, fmt.Sprintf("%v worker %s: ", w.path, w.tenant)+fmt.Sprintf(format, args...))
	}
}

func (w *soakWorker) run(ctx context.Context, ops *atomic.Uint64) {
	for ctx.Err() == nil && len(w.failures) == 0 {
		slot := w.rng.IntN(len(w.slots))
		switch r := w.rng.IntN(1000); {
		case r < 450:
			w.put(ctx, slot)
		case r < 899:
			w.get(ctx, slot)
		case r < 999:
			w.remove(ctx, slot)
		default:
			w.reconnect(ctx)
		}
		ops.Add(1)
	}
}

// reconnect closes the worker's client and dials a new one, so the soak
// also churns connections, sessions and (on shm) mappings.
func (w *soakWorker) reconnect(ctx context.Context) {
	w.client.Close()
	c, err := api.Dial(ctx, api.ClientConfig{Server: w.cfg.Server, Path: w.path})
	if err != nil {
		if ctx.Err() == nil {
			w.fail("redial: %v", err)
		}
		// Leave a closed client: its calls fail and the loop ends.
		return
	}
	w.client = c
	w.stats.Reconnects++
}

// size draws a log-uniform size from 1 byte to MaxValueBytes.
func (w *soakWorker) size() int {
	return max(1, int(math.Exp(w.rng.Float64()*math.Log(float64(w.cfg.MaxValueBytes)))))
}

// put writes the slot's next generation, then removes the one before.
func (w *soakWorker) put(ctx context.Context, slot int) {
	s := &w.slots[slot]
	gen, size := s.gen+1, w.size()
	v := w.value(slot, gen, size)
	var err error
	if w.path == api.PathShm && gen%2 == 0 {
		var r *api.Reservation
		if r, err = w.client.Reserve(ctx, w.key(slot, gen), size); err == nil {
			copy(r.Bytes(), v)
			_, err = r.Commit(ctx)
			w.stats.Reserved++
		}
	} else {
		err = w.client.Put(ctx, w.key(slot, gen), v)
	}
	switch {
	case err == nil:
		w.stats.Puts++
	case errors.Is(err, api.ErrResourceExhausted):
		w.stats.Refused++
		return
	case ctx.Err() != nil:
		return
	default:
		w.fail("put %d.%d (%d bytes): %v", slot, gen, size, err)
		return
	}
	old := *s
	*s = soakSlot{gen: gen, size: size, present: true}
	if old.present {
		if err := w.client.Remove(ctx, w.key(slot, old.gen)); err != nil && !errors.Is(err, api.ErrNotFound) && ctx.Err() == nil {
			w.fail("remove %d.%d after its successor: %v", slot, old.gen, err)
		}
		w.stats.Removes++
	}
}

// get reads the slot's block and checks every byte: either they are the
// value put, or the block was evicted (NotFound). A removed block must be
// NotFound.
func (w *soakWorker) get(ctx context.Context, slot int) {
	s := &w.slots[slot]
	if s.gen == 0 {
		return
	}
	k := w.key(slot, s.gen)
	var got []byte
	var view *api.View
	var err error
	if w.path == api.PathShm && w.rng.IntN(2) == 0 {
		w.stats.Views++
		if view, err = w.client.View(ctx, k); err == nil {
			got = view.Bytes()
			defer view.Close()
		}
	} else {
		var n int
		n, err = w.client.Get(ctx, k, w.buf)
		got = w.buf[:n]
		w.stats.Gets++
	}
	switch {
	case errors.Is(err, api.ErrNotFound):
		if s.present {
			w.stats.Evicted++
			s.present = false
		} else {
			w.stats.NotFoundOKs++
		}
		return
	case err != nil:
		if ctx.Err() == nil {
			w.fail("get %d.%d: %v", slot, s.gen, err)
		}
		return
	}
	if !s.present {
		w.fail("get %d.%d returned %d bytes of a block removed or evicted before", slot, s.gen, len(got))
		return
	}
	if want := w.value(slot, s.gen, s.size); !bytes.Equal(got, want) {
		w.fail("get %d.%d: %d bytes differ from the %d put", slot, s.gen, len(got), len(want))
		return
	}
	w.stats.CheckedB += uint64(len(got))
}

// remove deletes the slot's block; a later get must not find it.
func (w *soakWorker) remove(ctx context.Context, slot int) {
	s := &w.slots[slot]
	if s.gen == 0 {
		return
	}
	err := w.client.Remove(ctx, w.key(slot, s.gen))
	switch {
	case err == nil, errors.Is(err, api.ErrNotFound):
		w.stats.Removes++
		s.present = false
	case ctx.Err() == nil:
		w.fail("remove %d.%d: %v", slot, s.gen, err)
	}
}
