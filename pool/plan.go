package pool

import (
	"errors"
	"math"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/transfer"
	"github.com/kvpool/kvpool/transfer/cost"
)

// PlanQuery asks where a request for a chain should run, and whether that
// node should fetch or recompute the prefix it lacks: the client's
// PlanRequest, whose zero Model and BlockTokens mean Config.Model and
// Config.BlockTokens.
type PlanQuery = api.PlanRequest

// PlanAnswer is the cost model's answer with what it rested on.
type PlanAnswer struct {
	cost.Result
	Model       string
	BlockTokens int
	ChainBlocks int
	// Reference is the accelerator of the curve that gives the prompt's
	// prefill speed and B*: this node's.
	Reference string
	// Nodes describes each candidate beyond its NodePlan.
	Nodes map[string]PlanNode
}

// PlanNode is what a candidate's plan read about it.
type PlanNode struct {
	Accelerator string
	// PrefillTokensPerSecond is the node's speed at the prompt's length,
	// after scaling its curve by its engine's report.
	PrefillTokensPerSecond float64
	// LinkMeasured is whether the chosen source's link figures come from
	// transfers.
	LinkMeasured bool
}

// planView is what planning needs to know of the cluster: every live
// node with its prefix of the chain, its accelerator and load, and the link
// matrix others published. *cluster implements it; nil means standalone.
type planView interface {
	Nodes() []metadata.NodeInfo
	Locate(tenant, namespace string, chain [][]byte) metadata.LocateResult
	Dead(id string) bool
	Peers() []metadata.Peer
	Link(to, from string) (metadata.LinkRecord, bool)
}

// gpuPrefixer says how many leading keys of a chain this node's engines
// hold in GPU memory. *engines.Tracker implements it.
type gpuPrefixer interface {
	Prefix(tenant, namespace string, chain [][]byte) int
}

// peerGPU says how many leading keys of a chain a peer's engines hold in
// GPU memory, and whether this node follows them at all. *peerCaches
// implements it.
type peerGPU interface {
	Prefix(node, tenant, namespace string, chain [][]byte) (blocks int, followed bool)
}

// prefixIndex says which keys of a chain the node holds. *store.Store
// implements it.
type prefixIndex interface {
	Exists(tenant, ns []byte, keys [][]byte) ([]bool, error)
}

// planner answers PlanQuery from the live location mirror, gossiped load
// and the link matrix (this node's own estimates for links into it, the
// ones other nodes published for theirs), through the cost model.
type planner struct {
	cfg     *PlanConfig
	self    string
	store   prefixIndex
	cluster planView // nil: standalone
	links   *transfer.Links
	load    func() metadata.Load // this node's, with its engine's report
	now     func() time.Time
	// gpu is this node's engines' GPU caches; nil when not followed.
	gpu gpuPrefixer
	// peerGPU is the copy of the peers' engines' GPU caches; nil
	// standalone.
	peerGPU peerGPU
	// placed are the requests its plans placed that their nodes have not
	// reported yet.
	placed *placements
	// disk is this node's disk tier; nil without one.
	disk diskPrefixer
	// decisions counts the winning plan of each answer, by its kind;
	// nil counts nothing.
	decisions *prometheus.CounterVec
}

// diskPrefixer says how much of a chain this node holds in memory and on
// its disk tier, and how fast the disk reads. *tiers implements it.
type diskPrefixer interface {
	Prefix(tenant, ns []byte, chain [][]byte) (memory, total int, err error)
	ReadBytesPerSecond() float64
}

// Plan answers q from the live location mirror, gossiped load and the
// link matrix (this node's own estimates for links into it, the ones
// other nodes published for theirs). A standalone node plans for itself.
func (p *planner) Plan(q PlanQuery) (PlanAnswer, error) {
	cfg := p.cfg
	if q.Model == "" {
		q.Model = cfg.Model
	}
	if q.BlockTokens == 0 {
		q.BlockTokens = cfg.BlockTokens
	}
	if err := api.ValidateChain(q.Tenant, q.Namespace, q.Keys); err != nil {
		return PlanAnswer{}, err
	}
	switch {
	case len(q.Keys) == 0:
		return PlanAnswer{}, api.Errorf(api.ErrInvalidArgument, "pool: plan: an empty chain")
	case q.BlockTokens < 0 || q.BlockTokens > 1<<20:
		return PlanAnswer{}, api.Errorf(api.ErrInvalidArgument, "pool: plan: block tokens %d: want 1 to 1048576", q.BlockTokens)
	case q.PromptTokens < 0 || q.PromptTokens > 1<<30:
		return PlanAnswer{}, api.Errorf(api.ErrInvalidArgument, "pool: plan: prompt tokens %d: want 0 to 2^30", q.PromptTokens)
	case q.LinkBytesPerSecond < 0 || math.IsNaN(q.LinkBytesPerSecond) || math.IsInf(q.LinkBytesPerSecond, 0):
		return PlanAnswer{}, api.Errorf(api.ErrInvalidArgument, "pool: plan: link bandwidth %v: want a non-negative number", q.LinkBytesPerSecond)
	}
	model, err := cfg.Profiles.Model(q.Model)
	if err != nil {
		return PlanAnswer{}, api.Errorf(api.ErrInvalidArgument, "pool: plan: %v", err)
	}
	nominal, err := cfg.Profiles.Curve(q.Model, cfg.Accelerator)
	if err != nil {
		return PlanAnswer{}, api.Errorf(api.ErrFailedPrecondition, "pool: plan: %v", err)
	}
	prompt := q.PromptTokens
	if prompt == 0 {
		prompt = len(q.Keys) * q.BlockTokens
	}
	var local, onDisk int
	if p.disk != nil {
		local, onDisk, err = p.disk.Prefix([]byte(q.Tenant), []byte(q.Namespace), q.Keys)
	} else {
		local, err = p.localPrefix(q.Tenant, q.Namespace, q.Keys)
	}
	if err != nil {
		return PlanAnswer{}, err
	}

	// The nodes: this one, and with a cluster every live node the mirror
	// knows, with its prefix, accelerator and gossiped engine load.
	type nodeIn struct {
		rec  metadata.NodeRecord
		load metadata.Load
		hold int
	}
	nodes := []nodeIn{{rec: metadata.NodeRecord{ID: p.self, Accelerator: cfg.Accelerator}, load: p.load(), hold: local}}
	if c := p.cluster; c != nil {
		held := map[string]int{}
		for _, np := range c.Locate(q.Tenant, q.Namespace, q.Keys).Nodes {
			held[np.Node] = np.Blocks
		}
		loads := map[string]metadata.Load{}
		for _, p := range c.Peers() {
			loads[p.ID] = p.Load
		}
		for _, ni := range c.Nodes() {
			id := ni.Record.ID
			if id == p.self || c.Dead(id) {
				continue
			}
			nodes = append(nodes, nodeIn{rec: ni.Record, load: loads[id], hold: held[id]})
		}
	}
	want := map[string]bool{}
	for _, id := range q.Candidates {
		want[id] = true
	}
	req := &cost.Request{
		KVBytesPerToken: model.KVBytesPerToken(), BlockTokens: q.BlockTokens, ChainBlocks: len(q.Keys),
		PromptTokens: prompt, Nominal: nominal,
	}
	ans := PlanAnswer{Model: q.Model, BlockTokens: q.BlockTokens, ChainBlocks: len(q.Keys), Reference: cfg.Accelerator, Nodes: map[string]PlanNode{}}
	var errs []error
	now := p.now()
	everyNode := len(want) == 0 // decided once: the loop empties want
	for _, ni := range nodes {
		node := cost.Node{ID: ni.rec.ID, Blocks: ni.hold, Candidate: everyNode || want[ni.rec.ID]}
		if ni.rec.ID == p.self && onDisk > local {
			// The local disk is a link like any other, at its measured
			// read rate.
			node.DiskBlocks, node.DiskBytesPerSecond = onDisk, p.disk.ReadBytesPerSecond()
		}
		switch {
		case ni.rec.ID == p.self && p.gpu != nil:
			node.GPUBlocks = p.gpu.Prefix(q.Tenant, q.Namespace, q.Keys)
			node.HostToGPUBytesPerSecond = cfg.HostToGPUBytesPerSecond
		case ni.rec.ID != p.self && p.peerGPU != nil:
			// A peer whose engines this node follows: its GPU tier is
			// free, its host tier loads at its own host-to-GPU rate.
			if gpu, followed := p.peerGPU.Prefix(ni.rec.ID, q.Tenant, q.Namespace, q.Keys); followed {
				node.GPUBlocks = gpu
				// A record without a usable rate (an older node, a bad
				// one) is priced at this node's: one peer's record must
				// not fail every plan.
				node.HostToGPUBytesPerSecond = cfg.HostToGPUBytesPerSecond
				if r := ni.rec.HostToGPUBytesPerSecond; r > 0 && !math.IsInf(r, 0) {
					node.HostToGPUBytesPerSecond = r
				}
			}
		}
		var placedQueueS float64
		if p.placed != nil {
			var spec int
			placedQueueS, spec = p.placed.view(now, ni.rec.ID, time.UnixMilli(ni.load.EngineReportUnixMilli), q.Tenant, q.Namespace, q.Keys)
			node.GPUBlocks = max(node.GPUBlocks, spec)
		}
		delete(want, ni.rec.ID)
		if node.Candidate {
			accel := ni.rec.Accelerator
			if accel == "" {
				accel = cost.DefaultAccelerator
			}
			curve, err := cfg.Profiles.Curve(q.Model, accel)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			node.Prefill = curve
			if l := ni.load; l.PrefillTokensPerSecond > 0 && (l.Model == "" || l.Model == q.Model) {
				node.Prefill = cost.Scaled{Base: curve, Factor: cost.ReportedFactor(curve, l.PrefillTokensPerSecond, int(l.PrefillPromptTokens), prompt)}
			}
			node.Queue = time.Duration((ni.load.QueueSeconds + placedQueueS) * float64(time.Second))
			ans.Nodes[node.ID] = PlanNode{Accelerator: accel, PrefillTokensPerSecond: cost.TokensPerSecond(node.Prefill, float64(prompt))}
		}
		req.Nodes = append(req.Nodes, node)
	}
	for id := range want {
		errs = append(errs, api.Errorf(api.ErrInvalidArgument, "pool: plan: candidate %q is not a live node", id))
	}
	if err := errors.Join(errs...); err != nil {
		return PlanAnswer{}, api.Errorf(api.ErrInvalidArgument, "pool: plan: %v", err)
	}
	req.Link = func(from, to string) cost.Link {
		l, _ := p.link(from, to, now, q.LinkBytesPerSecond)
		return l
	}
	res, err := cost.Plan(req)
	if err != nil {
		return PlanAnswer{}, api.Errorf(api.ErrInvalidArgument, "pool: %v", err)
	}
	if q.Place && p.placed != nil && len(res.Nodes) > 0 {
		w := res.Nodes[0]
		p.placed.add(placement{node: w.Node, at: now, serviceS: (w.Total - w.Queue).Seconds(),
			tenant: q.Tenant, namespace: q.Namespace, keys: q.Keys})
	}
	ans.Result = res
	if p.decisions != nil && len(res.Nodes) > 0 {
		w := res.Winner()
		p.decisions.WithLabelValues(w.Plan.String(), planWhere(w.Node == p.self)).Inc()
	}
	for _, np := range res.Nodes {
		if np.Source != "" {
			pn := ans.Nodes[np.Node]
			_, pn.LinkMeasured = p.link(np.Source, np.Node, now, q.LinkBytesPerSecond)
			ans.Nodes[np.Node] = pn
		}
	}
	return ans, nil
}

// link is the link from → to and whether transfers measured it: this
// node's own estimate for links into it, what `to` published otherwise,
// the seed when nobody has measured it. whatIf > 0 replaces the
// bandwidth.
func (p *planner) link(from, to string, now time.Time, whatIf float64) (cost.Link, bool) {
	var l cost.Link
	measured := false
	if to == p.self {
		e := p.links.Estimate(from, now)
		// Plans price fetches as fetches ran: the fit's rate and costs.
		l, measured = cost.Link{BytesPerSecond: e.FetchBytesPerSecond, RTT: e.RTT, Fixed: e.Fixed, PerBlock: e.PerBlock, PerDoubling: e.PerDoubling}, e.Samples > 0
	} else if rec, ok := p.publishedLink(from, to); ok {
		l = cost.Link{BytesPerSecond: rec.BytesPerSecond, RTT: time.Duration(rec.RTTMicros) * time.Microsecond,
			Fixed: time.Duration(rec.FixedMicros * 1e3), PerBlock: time.Duration(rec.PerBlockMicros * 1e3), PerDoubling: time.Duration(rec.PerDoublingMicros * 1e3)}
		measured = rec.Samples > 0
		if rec.FetchBytesPerSecond > 0 {
			l.BytesPerSecond = rec.FetchBytesPerSecond
		}
		if rec.FixedMicros == 0 && rec.PerBlockMicros == 0 && rec.PerDoublingMicros == 0 {
			// An older node's record: the seed's fetch costs.
			l.Fixed, l.PerBlock = p.links.SeedCosts()
		}
	} else {
		s := p.links.Seed("")
		l = cost.Link{BytesPerSecond: s.BytesPerSecond, RTT: s.RTT}
		l.Fixed, l.PerBlock = p.links.SeedCosts()
	}
	if whatIf > 0 {
		l.BytesPerSecond, measured = whatIf, false
	}
	return l, measured
}

func (p *planner) publishedLink(from, to string) (metadata.LinkRecord, bool) {
	if p.cluster == nil {
		return metadata.LinkRecord{}, false
	}
	return p.cluster.Link(to, from)
}

// localPrefix is how many leading keys of the chain this node holds.
func (p *planner) localPrefix(tenant, namespace string, keys [][]byte) (int, error) {
	exists, err := p.store.Exists([]byte(tenant), []byte(namespace), keys)
	if err != nil {
		return 0, err
	}
	if i := slices.Index(exists, false); i >= 0 {
		return i, nil
	}
	return len(keys), nil
}

// planWhere labels whether a plan's winner is the answering node.
func planWhere(self bool) string {
	if self {
		return "this_node"
	}
	return "other_node"
}
