package sim

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/kvpool/kvpool/transfer/cost"
)

// The engine model.
//
// Each node runs one engine that does one thing at a time, prefill first
// (vLLM's scheduling without chunked prefill): when a routed request
// waits and the engine's KV memory admits it, the engine prefills it;
// otherwise it runs one decode step of its batch. A prefill has up to
// two phases. The load phase moves the blocks the plan fetches, from the
// node's own host tier over its host-to-GPU link or from another node's
// host tier over the network into this node, while (for a split) the
// engine computes the head of the missing prefix; the engine waits for
// both, as the cost model's terms say. The compute phase prefills the
// rest; its end is the request's first token. The request then decodes,
// one token per step, until its answer is complete.
//
// Memory: a request pins the chain blocks it uses in the GPU tier and
// reserves the rest of its KV (the prompt's partial last block and the
// whole answer) up front, so a running request is never preempted. Its
// prompt's full blocks stay in the GPU tier as prefix cache once it
// finishes, and are written through to the node's host tier when its
// prefill ends, as kvpool's engine connector puts them. Blocks an answer
// generates are not cached (the trace does not say which later blocks
// they become).
//
// Routing uses what a router can know at the request's arrival: each
// node's estimated queue time (the plans of the requests it has not
// finished prefilling), which blocks each tier holds, and each link's
// bandwidth shared with the transfers already on it. A plan can go stale
// before the engine starts it: a source that has evicted a planned
// block fails the fetch, and the engine recomputes instead.

// event kinds
const (
	evArrive  = iota // Arg: request index
	evCompute        // Arg: node; the engine's current compute is done
	evLink           // Arg: link index + links × version
)

// phase is what an engine is doing.
type phase uint8

const (
	idle phase = iota
	loading
	computing
	decoding
)

// job is one request in the cluster.
type job struct {
	req   *Request
	chain []uint64 // dense ids of the prompt's full blocks
	// extra is the blocks of KV beyond the chain: the prompt's partial
	// block and the answer.
	extra int
	node  int
	// The plan as routed: source node (−1 none), its prefix p, the split
	// point k, and the estimated service time (the plan's total less the
	// queue).
	source, pool, split int
	estS                float64
	// Execution.
	local      int // the GPU prefix the engine used
	moving     int // blocks in flight in the load phase
	pending    int // load-phase parts still running
	srcTier    *Tier
	gpuPinned  int
	startS     float64
	firstS     float64
	doneS      float64
	fetchError bool
	outcome    Outcome
}

type engine struct {
	gpu, host *Tier
	waiting   []*job // routed, not started; FIFO
	queuedS   float64
	phase     phase
	cur       *job
	estEndS   float64 // when the current item is expected to end
	batch     Batch[*job]
	hostLink  int // link indexes
	netLink   int
}

// cluster is one run's state.
type cluster struct {
	cfg     Config
	reqs    []Request
	jobs    []job
	engines []engine
	links   []*Link
	linkVer []int
	q       Queue
	rng     *rand.Rand
	rr      int
	seen    map[uint64]bool // Oracle: every block computed anywhere
	names   []string        // n0.. then h0..
	index   map[string]int  // name → node
	res     Result
	now     float64
	done    int
}

// Run simulates cfg serving reqs (ParseTrace's output) and reports how
// it went. progress, when not nil, is called as requests finish (with
// how many have and how many there are), at most about 200 times. Run
// is a pure function of its arguments.
func Run(cfg Config, reqs []Request, progress func(done, total int)) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	if len(reqs) == 0 {
		return Result{}, fmt.Errorf("sim: no requests")
	}
	c, err := newCluster(cfg, reqs)
	if err != nil {
		return Result{}, err
	}
	c.loop(progress)
	if c.done != len(reqs) {
		return Result{}, fmt.Errorf("sim: internal error: %d of %d requests finished", c.done, len(reqs))
	}
	c.summarize()
	return c.res, nil
}

func newCluster(cfg Config, reqs []Request) (*cluster, error) {
	c := &cluster{cfg: cfg, reqs: reqs, rng: rand.New(rand.NewPCG(cfg.Seed, 0x6b7670)), index: map[string]int{}}
	return c, c.setup()
}

// loop runs events until none are left.
func (c *cluster) loop(progress func(done, total int)) {
	step, reported := max(1, len(c.reqs)/200), 0
	for {
		e, ok := c.q.Pop()
		if !ok {
			return
		}
		c.now = e.AtS
		switch e.Kind {
		case evArrive:
			c.arrive(&c.jobs[e.Arg])
		case evCompute:
			c.computed(e.Arg)
		case evLink:
			c.linkEvent(e.Arg)
		}
		if progress != nil && (c.done >= reported+step || (c.done == len(c.reqs) && reported < c.done)) {
			reported = c.done
			progress(c.done, len(c.reqs))
		}
	}
}

// setup checks the requests against the config, gives their blocks dense
// ids (policies index by id) and schedules the arrivals.
func (c *cluster) setup() error {
	B := c.cfg.BlockTokens
	dense := map[uint64]uint64{}
	c.jobs = make([]job, len(c.reqs))
	for i := range c.reqs {
		r := &c.reqs[i]
		if want := (r.InputTokens + B - 1) / B; len(r.Blocks) != want {
			return fmt.Errorf("sim: request %d: %d blocks for %d tokens at %d tokens per block (want %d): is the block size right?", r.ID, len(r.Blocks), r.InputTokens, B, want)
		}
		full := r.InputTokens / B
		chain := make([]uint64, full)
		for k, b := range r.Blocks[:full] {
			d, ok := dense[b]
			if !ok {
				d = uint64(len(dense))
				dense[b] = d
			}
			chain[k] = d
		}
		total := (r.InputTokens + max(r.OutputTokens, 1) + B - 1) / B
		if total > c.cfg.GPUBlocks {
			return fmt.Errorf("sim: request %d needs %d blocks of KV (%d + %d tokens), more than an engine's %d", r.ID, total, r.InputTokens, r.OutputTokens, c.cfg.GPUBlocks)
		}
		c.jobs[i] = job{req: r, chain: chain, extra: total - full, source: -1}
		c.q.Push(Event{AtS: r.ArrivalS, Kind: evArrive, Arg: i})
	}
	n := c.cfg.Nodes
	c.engines = make([]engine, n)
	for i := range c.engines {
		e := &c.engines[i]
		e.gpu = NewTier(c.cfg.GPUBlocks, c.cfg.GPUPolicy)
		e.hostLink, e.netLink = -1, -1
		if c.cfg.HostBlocks > 0 {
			e.host = NewTier(c.cfg.HostBlocks, c.cfg.HostPolicy)
			e.hostLink = c.addLink(&Link{BytesPerSecond: c.cfg.HostToGPUBytesPerSecond})
		}
		if c.cfg.Policy.fetchesRemote() {
			e.netLink = c.addLink(&Link{BytesPerSecond: c.cfg.NetworkBytesPerSecond, FixedS: c.cfg.RTTS + c.cfg.FetchFixedS})
		}
	}
	c.names = make([]string, 2*n)
	for i := range n {
		c.names[i], c.names[n+i] = "n"+strconv.Itoa(i), "h"+strconv.Itoa(i)
		c.index[c.names[i]], c.index[c.names[n+i]] = i, i
	}
	if c.cfg.Policy == Oracle {
		c.seen = map[uint64]bool{}
	}
	c.res.Outcomes = make([]Outcome, len(c.reqs))
	return nil
}

func (c *cluster) addLink(l *Link) int {
	c.links = append(c.links, l)
	c.linkVer = append(c.linkVer, 0)
	return len(c.links) - 1
}

func dur(s float64) time.Duration { return time.Duration(s * 1e9) }

// queueS is the router's estimate of how long a request arriving now
// waits at engine i before it starts.
func (c *cluster) queueS(i int) float64 {
	e := &c.engines[i]
	return max(0, e.estEndS-c.now) + e.queuedS
}

// sharedLink is link l as a planner sees it: its bandwidth shared with
// the transfers already on it, and the fixed cost as the round trip.
func (c *cluster) sharedLink(l int) cost.Link {
	k := c.links[l]
	return cost.Link{BytesPerSecond: k.BytesPerSecond / float64(k.Busy()+1), RTT: dur(k.FixedS)}
}

// globalPrefix is how many leading blocks of chain were computed
// anywhere (Oracle).
func (c *cluster) globalPrefix(chain []uint64) int {
	for i, b := range chain {
		if !c.seen[b] {
			return i
		}
	}
	return len(chain)
}

// route plans j on the node its policy picks.
func (c *cluster) route(j *job) {
	n := c.cfg.Nodes
	pol := c.cfg.Policy
	req := &cost.Request{
		KVBytesPerToken: c.cfg.KVBytesPerToken, BlockTokens: c.cfg.BlockTokens, ChainBlocks: len(j.chain),
		PromptTokens: j.req.InputTokens, Nominal: c.cfg.Prefill, NoSplit: pol != PoolSplit,
	}
	// Which nodes may take it.
	candidate := make([]bool, n)
	switch pol {
	case RoundRobin:
		candidate[c.rr%n] = true
		c.rr++
	case LeastLoaded:
		best := c.ties(func(i int) (float64, float64) { return c.queueS(i), 0 })
		candidate[best] = true
	case Affinity:
		best := c.ties(func(i int) (float64, float64) {
			e := &c.engines[i]
			held := 0
			if !c.cfg.RouterSeesHostOnly {
				held = e.gpu.Held(j.chain)
			}
			if e.host != nil {
				held = max(held, e.host.Held(j.chain))
			}
			return -float64(held), c.queueS(i)
		})
		candidate[best] = true
	default:
		for i := range candidate {
			candidate[i] = true
		}
	}
	for i := range n {
		e := &c.engines[i]
		node := cost.Node{ID: c.names[i], Candidate: candidate[i], Prefill: c.cfg.Prefill}
		if candidate[i] {
			node.Queue = dur(c.queueS(i))
		}
		switch {
		case pol == Oracle:
			node.Blocks = c.globalPrefix(j.chain)
		case !c.cfg.NoGPUCache && !c.cfg.RouterSeesHostOnly:
			node.Blocks = e.gpu.Held(j.chain)
		}
		req.Nodes = append(req.Nodes, node)
	}
	if pol != Oracle && c.cfg.HostBlocks > 0 {
		for i := range n {
			req.Nodes = append(req.Nodes, cost.Node{ID: c.names[n+i], Blocks: c.engines[i].host.Held(j.chain)})
		}
		req.Link = func(from, to string) cost.Link {
			src, dst := c.index[from], c.index[to]
			switch {
			case src == dst:
				return c.sharedLink(c.engines[dst].hostLink)
			case pol.fetchesRemote():
				return c.sharedLink(c.engines[dst].netLink)
			}
			return cost.Link{}
		}
	}
	res, err := cost.Plan(req)
	if err != nil {
		panic(fmt.Sprintf("sim: INVARIANT: the planner refused a request the config validated: %v", err))
	}
	// Equally good candidates: the seed picks.
	win := res.Nodes[0]
	ties := 1
	for ties < len(res.Nodes) && res.Nodes[ties].Total == win.Total {
		ties++
	}
	if ties > 1 {
		win = res.Nodes[c.rng.IntN(ties)]
	}
	j.node = c.index[win.Node]
	j.estS = (win.Total - win.Queue).Seconds()
	j.source, j.pool, j.split = -1, win.LocalBlocks, win.LocalBlocks
	if win.Plan != cost.Recompute {
		j.source, j.pool, j.split = c.index[win.Source], win.PoolBlocks, win.SplitBlocks
		if win.Plan == cost.Fetch {
			j.split = win.LocalBlocks
		}
	}
	j.outcome.Plan = win.Plan.String()
}

// ties returns the node with the least key (then the least second key);
// the seed picks among equal ones.
func (c *cluster) ties(key func(i int) (float64, float64)) int {
	var best []int
	var b1, b2 float64
	for i := range c.cfg.Nodes {
		k1, k2 := key(i)
		switch {
		case len(best) == 0 || k1 < b1 || (k1 == b1 && k2 < b2):
			best, b1, b2 = append(best[:0], i), k1, k2
		case k1 == b1 && k2 == b2:
			best = append(best, i)
		}
	}
	if len(best) == 1 {
		return best[0]
	}
	return best[c.rng.IntN(len(best))]
}

func (c *cluster) arrive(j *job) {
	c.route(j)
	e := &c.engines[j.node]
	e.waiting = append(e.waiting, j)
	e.queuedS += j.estS
	c.kick(j.node)
}

// prefillS is the engine's time to prefill tokens [from, to).
func (c *cluster) prefillS(from, to int) float64 {
	return c.cfg.Prefill.Seconds(float64(to)) - c.cfg.Prefill.Seconds(float64(from))
}

// kick starts engine i's next item if it is free.
func (c *cluster) kick(i int) {
	e := &c.engines[i]
	if e.phase != idle {
		return
	}
	if len(e.waiting) > 0 && e.batch.Len() < c.cfg.MaxBatch {
		j := e.waiting[0]
		if c.admit(e, j) {
			e.waiting = e.waiting[1:]
			e.queuedS -= j.estS
			if len(e.waiting) == 0 {
				e.queuedS = 0 // no float dust
			}
			c.start(e, j)
			return
		}
	}
	if e.batch.Len() > 0 {
		e.phase = decoding
		e.estEndS = c.now + c.cfg.Decode.StepS(e.batch.KVTokens(), c.cfg.KVBytesPerToken)
		c.q.Push(Event{AtS: e.estEndS, Kind: evCompute, Arg: i})
	}
}

// admit reports whether e's memory has room for j now.
func (c *cluster) admit(e *engine, j *job) bool {
	if c.cfg.Policy == Oracle || c.cfg.NoGPUCache {
		return e.gpu.Fits(len(j.chain) + j.extra)
	}
	h := e.gpu.Held(j.chain)
	return e.gpu.Fits(e.gpu.Unpinned(j.chain[:h]) + len(j.chain) - h + j.extra)
}

// start begins j's prefill on e.
func (c *cluster) start(e *engine, j *job) {
	B := c.cfg.BlockTokens
	j.startS = c.now
	e.cur = j
	if c.cfg.Policy == Oracle {
		e.gpu.Reserve(len(j.chain)+j.extra, c.now)
		j.local = c.globalPrefix(j.chain)
		c.compute(e, j, j.local)
		return
	}
	if c.cfg.NoGPUCache {
		j.local = 0
		e.gpu.Reserve(len(j.chain)+j.extra, c.now)
	} else {
		j.local = e.gpu.Prefix(j.chain, c.now)
		e.gpu.Pin(j.chain, j.local)
		if !e.gpu.Reserve(len(j.chain)-j.local+j.extra, c.now) {
			panic("sim: INVARIANT: admitted a request its engine has no room for")
		}
	}
	// The fetch as planned, if it is still possible and still useful.
	if j.source >= 0 && j.pool > j.local {
		src := c.engines[j.source].host
		if src.Held(j.chain) < j.pool {
			// The source evicted a planned block meanwhile.
			j.fetchError = true
			j.source = -1
		} else {
			src.Prefix(j.chain[:j.pool], c.now)
			src.Pin(j.chain, j.pool)
			j.srcTier = src
			k := min(max(j.split, j.local), j.pool)
			j.moving = j.pool - k
			link := e.netLink
			if j.source == j.node {
				link = e.hostLink
			}
			e.phase = loading
			j.pending = 1
			c.links[link].Start(c.now, j.req.ID, float64(j.moving*B)*c.cfg.KVBytesPerToken)
			c.linkChanged(link)
			if head := c.prefillS(j.local*B, k*B); head > 0 {
				j.pending++
				c.q.Push(Event{AtS: c.now + head, Kind: evCompute, Arg: j.node})
			}
			e.estEndS = c.now + j.estS
			return
		}
	} else {
		j.source = -1
	}
	c.compute(e, j, j.local)
}

// compute starts the compute phase of j: prefill from block `from` on.
func (c *cluster) compute(e *engine, j *job, from int) {
	e.phase = computing
	e.estEndS = c.now + c.prefillS(from*c.cfg.BlockTokens, j.req.InputTokens)
	c.q.Push(Event{AtS: e.estEndS, Kind: evCompute, Arg: j.node})
}

// computed handles the end of engine i's current compute.
func (c *cluster) computed(i int) {
	e := &c.engines[i]
	switch e.phase {
	case loading: // the split's head
		c.loadPartDone(e)
	case computing:
		c.firstToken(e, e.cur)
	case decoding:
		e.phase = idle
		for _, j := range e.batch.Step(nil) {
			c.finish(e, j)
		}
		c.kick(i)
	}
}

// loadPartDone counts one part of the load phase as done; when both are,
// the rest of the prompt computes.
func (c *cluster) loadPartDone(e *engine) {
	j := e.cur
	if j.pending--; j.pending > 0 {
		return
	}
	c.compute(e, j, j.pool)
}

// firstToken ends j's prefill: its blocks enter the tiers and it joins
// the batch.
func (c *cluster) firstToken(e *engine, j *job) {
	B := c.cfg.BlockTokens
	j.firstS = c.now
	e.cur, e.phase = nil, idle
	o := &j.outcome
	o.Reused = j.local * B
	if j.srcTier != nil {
		j.srcTier.Unpin(j.chain, j.pool)
		j.srcTier = nil
		if j.source == j.node {
			o.FromHost = j.moving * B
		} else {
			o.Fetched = j.moving * B
		}
	}
	o.Computed = j.req.InputTokens - o.Reused - o.FromHost - o.Fetched
	switch {
	case c.cfg.Policy == Oracle:
		for _, b := range j.chain {
			c.seen[b] = true
		}
	case c.cfg.NoGPUCache:
		if e.host != nil {
			e.host.Insert(j.chain, 0, c.now)
		}
	default:
		e.gpu.Release(len(j.chain) - j.local)
		got := e.gpu.Insert(j.chain, j.local, c.now)
		e.gpu.Pin(j.chain[j.local:], got-j.local)
		j.gpuPinned = got
		if e.host != nil {
			e.host.Insert(j.chain, 0, c.now)
		}
	}
	if j.req.OutputTokens <= 1 {
		c.finish(e, j)
	} else {
		e.batch.Add(j, j.req.InputTokens, j.req.OutputTokens)
	}
	c.kick(j.node)
}

// finish frees j's memory and records it.
func (c *cluster) finish(e *engine, j *job) {
	j.doneS = c.now
	if c.cfg.Policy == Oracle || c.cfg.NoGPUCache {
		e.gpu.Release(len(j.chain) + j.extra)
	} else {
		e.gpu.Unpin(j.chain, j.gpuPinned)
		e.gpu.Release(j.extra)
	}
	o := &j.outcome
	o.ID, o.Node = j.req.ID, j.node
	o.TTFTS = j.firstS - j.req.ArrivalS
	o.QueueS = j.startS - j.req.ArrivalS
	if j.req.OutputTokens > 1 {
		o.TPOTS = (j.doneS - j.firstS) / float64(j.req.OutputTokens-1)
	}
	o.DoneS = j.doneS
	o.FetchFailed = j.fetchError
	c.res.Outcomes[j.req.ID] = *o
	c.done++
}

// linkChanged schedules link l's next completion; earlier schedules go
// stale.
func (c *cluster) linkChanged(l int) {
	c.linkVer[l]++
	if at, ok := c.links[l].NextDone(); ok {
		c.q.Push(Event{AtS: at, Kind: evLink, Arg: l + len(c.links)*c.linkVer[l]})
	}
}

func (c *cluster) linkEvent(arg int) {
	l, ver := arg%len(c.links), arg/len(c.links)
	if ver != c.linkVer[l] {
		return
	}
	c.links[l].Advance(c.now)
	ids := c.links[l].Done()
	c.linkChanged(l)
	for _, id := range ids {
		j := &c.jobs[id]
		c.loadPartDone(&c.engines[j.node])
	}
}
