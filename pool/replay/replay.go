// Package replay drives live kvpool daemons with a trace. Engines are
// emulated, one per daemon, by timers at a model's prefill and decode
// speeds (there is no GPU here), with the same scheduling as the
// simulator's engines (transfer/sim): prefill first, continuous batching,
// KV memory reserved up front. Everything else is real: each request is
// planned by a daemon's Plan (its location mirror, the engines' reported
// queues, the cost model), the engine looks its prefix up in its own
// daemon, fetches what the plan says with the daemon's Fetch (the
// transfer engine, another daemon's pins, real eviction), and puts the
// blocks it computed.
//
// The emulated link: the daemons' blocks are small (a machine cannot hold
// a trace's KV), so a fetch waits for the real transfer and for the
// time the model's blocks would take on the modeled link, whichever is
// longer; plans are asked with that link as their what-if bandwidth.
//
// Goroutines: one dispatcher, one per engine, one per request being
// planned, and the puts in flight; Run returns when every request has
// finished or ctx ends, having stopped them all.
package replay

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/transfer/sim"
)

// Config is one replay.
type Config struct {
	// Clients are one per node, in a fixed order: the node's engine talks
	// to its own daemon through it. Required.
	Clients []*api.Client
	// Trace is the requests, as sim.ParseTrace reads them. Required.
	Trace []sim.Request
	// Engine gives the emulated engines: Prefill, Decode, MaxBatch,
	// GPUBlocks, BlockTokens and KVBytesPerToken, as for the simulator.
	// The rest is ignored.
	Engine sim.Config
	// Model is the profile the daemons plan with ("llama3-8b").
	Model string
	// LinkBytesPerSecond is the modeled network: plans use it as their
	// what-if bandwidth and fetches take at least as long as it would.
	LinkBytesPerSecond float64
	// FetchFixed is what a modeled fetch costs beyond its bytes.
	FetchFixed time.Duration
	// BlockBytes is how many bytes each stored block holds. Default
	// 16 KiB.
	BlockBytes int
	// Tenant and Namespace hold the replay's blocks. Namespace should be
	// fresh per replay so that an earlier one's blocks are not found.
	Tenant, Namespace string
	// OneDaemonPlans routes with one daemon's Plan for all nodes (the
	// daemons take turns), which knows the other engines' queues as
	// gossip last carried them (within about a second). Without it the
	// router asks each daemon for its own node's plan (Estimate, one call
	// per node, concurrently) and takes the cheapest: every queue is then
	// its engine's latest report, as the simulator's router knows it.
	OneDaemonPlans bool
	// Timeout bounds each call to a daemon. Default 10 s.
	Timeout time.Duration
	// Logger receives problems. Default: discard.
	Logger *slog.Logger
	// Progress, when set, is called as requests finish.
	Progress func(done, total int)
}

// Result is the replay's report: what the simulator reports, from the
// emulated engines' clocks, and the daemons' own latencies.
type Result struct {
	sim.Result
	// Latencies of the calls, in seconds, as the engines and the router
	// saw them.
	Plan, Locate, Fetch, Put sim.Stats
	// PlanCalls and the rest count them; FetchErrors counts fetches that
	// did not bring every block.
	PlanCalls, FetchCalls, PutCalls, FetchErrors int
	// LateS is how far behind the trace's schedule requests were planned
	// (p99): the router keeping up.
	LateP99S float64
	// Plans counts the router's choices by kind.
	Plans map[string]int
}

func (c *Config) validate() error {
	var errs []error
	if len(c.Clients) == 0 {
		errs = append(errs, errors.New("no daemons"))
	}
	if len(c.Trace) == 0 {
		errs = append(errs, errors.New("no requests"))
	}
	e := &c.Engine
	if e.Prefill == nil || !(e.KVBytesPerToken > 0) || e.BlockTokens < 1 || e.MaxBatch < 1 || e.GPUBlocks < 1 || !(e.Decode.HBMBytesPerSecond > 0) {
		errs = append(errs, fmt.Errorf("engine %+v: want a prefill curve, KV bytes per token, block tokens, max batch, GPU blocks and a decode roofline", *e))
	}
	if !(c.LinkBytesPerSecond > 0) || math.IsInf(c.LinkBytesPerSecond, 0) {
		errs = append(errs, fmt.Errorf("link %v B/s: want a positive rate", c.LinkBytesPerSecond))
	}
	if c.Model == "" || c.Tenant == "" || c.Namespace == "" {
		errs = append(errs, errors.New("model, tenant and namespace are required"))
	}
	if c.BlockBytes == 0 {
		c.BlockBytes = 16 << 10
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}

// job is one request on its way.
type job struct {
	req   *sim.Request
	keys  [][]byte // the prompt's full blocks' chain keys
	total int      // blocks of KV it reserves
	plan  api.NodePlan
	estS  float64
	out   sim.Outcome
	first time.Time
}

// replay is one run's shared state.
type replay struct {
	cfg     Config
	rng     *rand.Rand // the router's; only dispatch uses it
	start   time.Time
	engines []*engine
	byNode  map[string]*engine
	value   []byte

	mu        sync.Mutex
	outcomes  []sim.Outcome
	done      int
	lat       map[string][]float64
	late      []float64
	plans     map[string]int
	fetchErrs int
	allDone   chan struct{}
	puts      sync.WaitGroup
}

// Run replays cfg.Trace against the daemons and reports how it went.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &replay{cfg: cfg, byNode: map[string]*engine{}, outcomes: make([]sim.Outcome, len(cfg.Trace)),
		lat: map[string][]float64{}, plans: map[string]int{}, allDone: make(chan struct{})}
	r.rng = rand.New(rand.NewPCG(cfg.Engine.Seed, 0x7265706c))
	r.value = make([]byte, cfg.BlockBytes)
	for i := range r.value {
		r.value[i] = byte(i * 7)
	}
	for i, c := range cfg.Clients {
		id := c.Info().GetNodeId()
		if _, dup := r.byNode[id]; dup || id == "" {
			return nil, fmt.Errorf("replay: daemon %d: node id %q is empty or repeated", i, id)
		}
		e := &engine{r: r, idx: i, id: id, cli: c, arrivals: make(chan *job, len(cfg.Trace)), loads: make(chan int, 1)}
		r.engines = append(r.engines, e)
		r.byNode[id] = e
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, e := range r.engines {
		wg.Add(2)
		go func() { defer wg.Done(); e.run(ctx) }()
		go func() { defer wg.Done(); e.reportLoads(ctx) }()
	}
	r.start = time.Now()
	wg.Add(1)
	go func() { defer wg.Done(); r.dispatch(ctx) }()
	var err error
	select {
	case <-r.allDone:
	case <-ctx.Done():
		err = ctx.Err()
	}
	cancel()
	wg.Wait()
	r.puts.Wait()
	if err != nil {
		return nil, fmt.Errorf("replay: %d of %d requests finished: %w", r.done, len(cfg.Trace), err)
	}
	return r.result(), nil
}

// key is block b's chain key: the trace's ids already hash a block with
// its predecessors.
func key(b uint64) []byte { return binary.BigEndian.AppendUint64([]byte("blk"), b) }

func (r *replay) since(t time.Time) float64 { return t.Sub(r.start).Seconds() }

func (r *replay) at(s float64) time.Time { return r.start.Add(time.Duration(s * float64(time.Second))) }

func (r *replay) record(what string, d time.Duration) {
	r.mu.Lock()
	r.lat[what] = append(r.lat[what], d.Seconds())
	r.mu.Unlock()
}

// dispatch plans each request when the trace says it arrives, one at a
// time: a request is planned once the one before it is counted in its
// engine's queue, as one router would.
func (r *replay) dispatch(ctx context.Context) {
	B := r.cfg.Engine.BlockTokens
	for i := range r.cfg.Trace {
		q := &r.cfg.Trace[i]
		t := time.NewTimer(time.Until(r.at(q.ArrivalS)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		j := &job{req: q, total: (q.InputTokens + max(q.OutputTokens, 1) + B - 1) / B}
		for _, b := range q.Blocks[:q.InputTokens/B] {
			j.keys = append(j.keys, key(b))
		}
		r.plan(ctx, j, r.cfg.Clients[i%len(r.cfg.Clients)])
	}
}

// plan asks a daemon where j runs and hands it to that node's engine.
func (r *replay) plan(ctx context.Context, j *job, router *api.Client) {
	cfg := &r.cfg
	r.mu.Lock()
	r.late = append(r.late, time.Since(r.at(j.req.ArrivalS)).Seconds())
	r.mu.Unlock()
	preq := api.PlanRequest{Tenant: cfg.Tenant, Namespace: cfg.Namespace, Keys: j.keys, Model: cfg.Model,
		BlockTokens: cfg.Engine.BlockTokens, PromptTokens: j.req.InputTokens, LinkBytesPerSecond: cfg.LinkBytesPerSecond}
	var p api.Plan
	var err error
	if !cfg.OneDaemonPlans {
		p, err = r.estimateAll(ctx, preq)
	} else {
		pctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		t0 := time.Now()
		preq.Place = true // the request goes where the plan says
		p, err = router.Plan(pctx, preq)
		cancel()
		r.record("plan", time.Since(t0))
	}
	e := r.engines[j.req.ID%len(r.engines)]
	if err != nil || len(p.Nodes) == 0 {
		// No plan: the request still runs, recomputing, where a
		// round-robin router would send it.
		cfg.Logger.Warn("replay: plan failed; recomputing", "request", j.req.ID, "err", err)
		j.plan = api.NodePlan{Node: e.id, Plan: "recompute"}
	} else {
		j.plan = p.Nodes[0]
		if pe, ok := r.byNode[j.plan.Node]; ok {
			e = pe
		} else {
			cfg.Logger.Warn("replay: plan chose a node without an engine; recomputing", "request", j.req.ID, "node", j.plan.Node)
			j.plan = api.NodePlan{Node: e.id, Plan: "recompute"}
		}
	}
	cfg.Logger.Debug("replay: planned", "request", j.req.ID, "node", j.plan.Node, "plan", j.plan.Plan,
		"queue_s", j.plan.Queue.Seconds(), "total_s", j.plan.Total.Seconds())
	j.estS = (j.plan.Total - j.plan.Queue).Seconds()
	if j.estS <= 0 {
		j.estS = cfg.Engine.Prefill.Seconds(float64(j.req.InputTokens))
	}
	r.mu.Lock()
	r.plans[j.plan.Plan]++
	r.mu.Unlock()
	j.out.Plan = j.plan.Plan
	e.enqueue(ctx, j)
	select {
	case e.arrivals <- j:
	case <-ctx.Done():
	}
}

// estimateAll asks every daemon for its own node's plan and returns them
// cheapest first.
func (r *replay) estimateAll(ctx context.Context, preq api.PlanRequest) (api.Plan, error) {
	plans := make([]api.Plan, len(r.engines))
	errs := make([]error, len(r.engines))
	var wg sync.WaitGroup
	for i, e := range r.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
			defer cancel()
			t0 := time.Now()
			plans[i], errs[i] = e.cli.Estimate(pctx, preq, "")
			r.record("plan", time.Since(t0))
		}()
	}
	wg.Wait()
	var out api.Plan
	for i := range plans {
		if errs[i] == nil && len(plans[i].Nodes) == 1 {
			out.Nodes = append(out.Nodes, plans[i].Nodes[0])
		}
	}
	if len(out.Nodes) == 0 {
		return out, errors.Join(errs...)
	}
	slices.SortStableFunc(out.Nodes, func(a, b api.NodePlan) int { return cmp.Compare(a.Total, b.Total) })
	// Equally good nodes: the seed picks, as in the simulator.
	ties := 1
	for ties < len(out.Nodes) && out.Nodes[ties].Total == out.Nodes[0].Total {
		ties++
	}
	if ties > 1 {
		k := r.rng.IntN(ties)
		out.Nodes[0], out.Nodes[k] = out.Nodes[k], out.Nodes[0]
	}
	return out, nil
}

// finished records j's outcome.
func (r *replay) finished(j *job, e *engine, doneAt time.Time) {
	o := &j.out
	o.ID, o.Node = j.req.ID, e.idx
	o.TTFTS = r.since(j.first) - j.req.ArrivalS
	o.DoneS = r.since(doneAt)
	if j.req.OutputTokens > 1 {
		o.TPOTS = doneAt.Sub(j.first).Seconds() / float64(j.req.OutputTokens-1)
	}
	r.mu.Lock()
	r.outcomes[j.req.ID] = *o
	r.done++
	done := r.done
	r.mu.Unlock()
	if r.cfg.Progress != nil {
		r.cfg.Progress(done, len(r.cfg.Trace))
	}
	if done == len(r.cfg.Trace) {
		close(r.allDone)
	}
}

func (r *replay) result() *Result {
	cfg := &r.cfg
	res := &Result{Result: sim.Summarize("daemons (pool-split)", cfg.Trace, r.outcomes), Plans: r.plans}
	for _, o := range r.outcomes {
		if o.Fetched > 0 {
			res.Fetches++
		}
		res.NetworkBytes += float64(o.Fetched) * cfg.Engine.KVBytesPerToken
	}
	res.Plan, res.PlanCalls = sim.Distribution(r.lat["plan"]), len(r.lat["plan"])
	res.Locate = sim.Distribution(r.lat["locate"])
	res.Fetch, res.FetchCalls = sim.Distribution(r.lat["fetch"]), len(r.lat["fetch"])
	res.Put, res.PutCalls = sim.Distribution(r.lat["put"]), len(r.lat["put"])
	res.FetchErrors = r.fetchErrs
	late := slices.Clone(r.late)
	slices.Sort(late)
	res.LateP99S = sim.Percentile(late, 0.99)
	return res
}

// engine emulates one node's engine.
type engine struct {
	r        *replay
	idx      int
	id       string
	cli      *api.Client
	arrivals chan *job
	loads    chan int // asks reportLoads to report

	// mu guards the router's view: the estimates of the requests routed
	// here and not started, and when the current item ends.
	mu      sync.Mutex
	queuedS float64
	busyTil time.Time

	// Owned by run.
	waiting []*job
	batch   sim.Batch[*job]
	used    int // blocks of KV the running requests reserved
	// reported is the clock at the last report.
	reported time.Time
	// clock is when the engine's last item ended, as the model times it.
	// Items start there while the engine is busy, so timer lateness does
	// not add up over thousands of decode steps; a real call that takes
	// longer than its modeled time moves it on.
	clock time.Time
}

// reportLoads sends the engine's queue estimate to its daemon whenever
// report asks, computing it when it sends, so a report is never older
// than one the router sent meanwhile.
func (e *engine) reportLoads(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.loads:
			if err := e.sendLoad(ctx); err != nil && ctx.Err() == nil {
				e.r.cfg.Logger.Warn("replay: report load", "node", e.id, "err", err)
			}
		}
	}
}

// sendLoad reports the engine's queue now: when its current item ends
// and the estimates of what waits.
func (e *engine) sendLoad(ctx context.Context) error {
	e.mu.Lock()
	q := max(0, time.Until(e.busyTil).Seconds()) + e.queuedS
	e.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, e.r.cfg.Timeout)
	defer cancel()
	return e.cli.ReportLoad(cctx, api.Load{Queue: time.Duration(q * float64(time.Second)), Model: e.r.cfg.Model})
}

// report asks reportLoads to report. Only run calls it.
func (e *engine) report() {
	e.reported = e.clock
	select {
	case e.loads <- 0:
	default: // one is pending; it will read the state when it goes
	}
}

// enqueue counts j in the engine's queue as the router hands it over,
// and tells the daemon before the router plans the next request, as the
// simulator's router knows it.
func (e *engine) enqueue(ctx context.Context, j *job) {
	e.mu.Lock()
	e.queuedS += j.estS
	e.mu.Unlock()
	if err := e.sendLoad(ctx); err != nil && ctx.Err() == nil {
		e.r.cfg.Logger.Warn("replay: report load", "node", e.id, "err", err)
	}
}

// busy sets when the engine's current item is expected to end, taking
// j (nil: none) off the queue.
func (e *engine) busy(until time.Time, started *job) {
	e.mu.Lock()
	e.busyTil = until
	if started != nil {
		if e.queuedS -= started.estS; len(e.waiting) == 0 {
			e.queuedS = 0
		}
	}
	e.mu.Unlock()
	e.report()
}

func (e *engine) take(j *job) { e.waiting = append(e.waiting, j) }

// sleepUntil waits until t or until ctx ends.
func sleepUntil(ctx context.Context, t0 time.Time) bool {
	d := time.Until(t0)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func dur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// run is the engine's loop: prefill the first waiting request when its
// memory fits, else one decode step, else wait for a request.
func (e *engine) run(ctx context.Context) {
	cfg := &e.r.cfg.Engine
	for ctx.Err() == nil {
		for drained := false; !drained; {
			select {
			case j := <-e.arrivals:
				e.take(j)
			default:
				drained = true
			}
		}
		if len(e.waiting) > 0 && e.batch.Len() < cfg.MaxBatch && e.used+e.waiting[0].total <= cfg.GPUBlocks {
			j := e.waiting[0]
			e.waiting = e.waiting[1:]
			e.used += j.total
			if !e.prefill(ctx, j) {
				return
			}
			continue
		}
		if e.batch.Len() > 0 {
			end := e.clock.Add(dur(cfg.Decode.StepS(e.batch.KVTokens(), cfg.KVBytesPerToken)))
			e.mu.Lock()
			e.busyTil = end // no report: the estimate moves little
			e.mu.Unlock()
			if !sleepUntil(ctx, end) {
				return
			}
			e.clock = end
			if end.Sub(e.reported) >= 50*time.Millisecond {
				e.report() // the queue drains as the engine works
			}
			for _, j := range e.batch.Step(nil) {
				e.finish(j, end)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case j := <-e.arrivals:
			e.take(j)
			e.clock = time.Now() // idle until now
		}
	}
}

func (e *engine) finish(j *job, now time.Time) {
	e.used -= j.total
	e.r.finished(j, e, now)
}

// prefill runs j's prefill: look up the local prefix, fetch what the plan
// says while computing a split's head, compute the rest, then put what
// was computed. It reports false when ctx ended.
func (e *engine) prefill(ctx context.Context, j *job) bool {
	r := e.r
	cfg := &r.cfg
	P := cfg.Engine.Prefill.Seconds
	B := cfg.Engine.BlockTokens
	K := cfg.Engine.KVBytesPerToken
	start := e.clock
	j.out.QueueS = r.since(start) - j.req.ArrivalS
	e.busy(start.Add(dur(j.estS)), j)

	// The prefix this node's daemon holds now.
	cctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	t0 := time.Now()
	local, err := e.cli.Locate(cctx, cfg.Tenant, cfg.Namespace, j.keys)
	cancel()
	r.record("locate", time.Since(t0))
	if err != nil {
		cfg.Logger.Warn("replay: locate", "node", e.id, "err", err)
		local = 0
	}
	from := local // blocks [0, from) are here when the compute phase starts
	p := j.plan
	if p.Source != "" && p.PoolBlocks > local {
		k := min(max(p.SplitBlocks, local), p.PoolBlocks)
		if p.Plan == "fetch" {
			k = local
		}
		moving := p.PoolBlocks - k
		modeled := cfg.FetchFixed + dur(float64(moving*B)*K/cfg.LinkBytesPerSecond)
		fetched := make(chan error, 1)
		go func() {
			fctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
			defer cancel()
			t0 := time.Now()
			res, err := e.cli.Fetch(fctx, cfg.Tenant, cfg.Namespace, j.keys[k:p.PoolBlocks], 0)
			r.record("fetch", time.Since(t0))
			for _, x := range res {
				if err == nil && x.Err != nil {
					err = x.Err
				}
			}
			fetched <- err
		}()
		// The head computes while the tail moves; the modeled link sets
		// the least the move takes.
		phase := max(dur(P(float64(k*B))-P(float64(local*B))), modeled)
		e.clock = e.clock.Add(phase)
		if !sleepUntil(ctx, e.clock) {
			return false
		}
		var ferr error
		select {
		case ferr = <-fetched:
		case <-ctx.Done():
			return false
		}
		if now := time.Now(); now.After(e.clock) {
			e.clock = now // the real transfer took longer
		}
		if ferr != nil {
			// The source no longer had a block: compute it instead.
			r.mu.Lock()
			r.fetchErrs++
			r.mu.Unlock()
			j.out.FetchFailed = true
			from = k
		} else {
			from = p.PoolBlocks
			j.out.Fetched = moving * B
		}
	}
	// The rest of the prompt.
	rest := P(float64(j.req.InputTokens)) - P(float64(from*B))
	e.clock = e.clock.Add(dur(rest))
	e.busy(e.clock, nil)
	if !sleepUntil(ctx, e.clock) {
		return false
	}
	j.first = e.clock
	e.busy(e.clock, nil) // free again: a report
	j.out.FromHost = local * B
	j.out.Computed = j.req.InputTokens - j.out.FromHost - j.out.Fetched
	// The blocks computed here go to the node's daemon, as an engine's
	// connector puts them, without holding the engine up.
	var compute [][]byte
	for i := local; i < len(j.keys); i++ {
		if j.out.Fetched > 0 && i >= p.PoolBlocks-j.out.Fetched/B && i < p.PoolBlocks {
			continue // fetched: already here
		}
		compute = append(compute, j.keys[i])
	}
	r.puts.Add(1)
	go func() {
		defer r.puts.Done()
		for _, k := range compute {
			pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Timeout)
			t0 := time.Now()
			err := e.cli.Put(pctx, api.BlockKey{Tenant: cfg.Tenant, Namespace: cfg.Namespace, Key: k}, r.value)
			cancel()
			r.record("put", time.Since(t0))
			if err != nil && !errors.Is(err, api.ErrAlreadyExists) {
				cfg.Logger.Warn("replay: put", "node", e.id, "err", err)
			}
		}
	}()
	if j.req.OutputTokens <= 1 {
		e.finish(j, j.first)
	} else {
		e.batch.Add(j, j.req.InputTokens, j.req.OutputTokens)
	}
	return true
}
