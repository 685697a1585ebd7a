package metadata

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MirrorConfig configures a location mirror.
type MirrorConfig struct {
	// Client is the etcd client. Required; the caller owns it.
	Client *clientv3.Client
	// Prefix roots every key. Default "/kvpool/".
	Prefix string
	// Dead, when set, reports nodes that gossip has declared dead; they are
	// left out of every answer at once, before their lease expires.
	Dead func(node string) bool
	// OnApply, when set, is called after each applied batch with the
	// batch's age (now - its write time): the mirror's lag.
	OnApply func(lag time.Duration, records int)
	// OnPolicy, when set, hears every tenant policy record: its JSON on
	// load and on every change, nil when it is deleted. It is called from
	// the mirror's goroutine, in revision order, and must not block for
	// long. After a reload, tenants whose record vanished meanwhile hear
	// nil.
	OnPolicy func(tenant string, policy []byte)
	// Logger receives the mirror's logs. It should already carry the
	// node's id; the mirror adds its own name ("component"="mirror").
	// Default: discard.
	Logger *slog.Logger
}

// Mirror is a daemon's local copy of the cluster's location index, fed by
// etcd: one range read, then a watch from the revision after it. It
// survives compaction (it reloads), reconnection and leader changes (the
// watch resumes from the last applied revision) without missing or
// duplicating records, because batches apply by sequence number. Locate is
// answered from memory. All methods are safe for concurrent use.
type Mirror struct {
	cfg  MirrorConfig
	log  *slog.Logger
	keys keys

	mu       sync.RWMutex
	st       *state
	rev      int64 // etcd revision the state reflects
	ready    chan struct{}
	readyOne sync.Once

	malformed atomic.Uint64
	reloads   atomic.Uint64
	applied   atomic.Uint64

	// policies are the tenants whose policy record the last load or watch
	// saw; only touched from Run's goroutine.
	policies map[string]bool
}

// NewMirror validates cfg. It starts nothing.
func NewMirror(cfg MirrorConfig) (*Mirror, error) {
	if cfg.Client == nil {
		return nil, errors.New("metadata: mirror: no etcd client")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/kvpool/"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Mirror{cfg: cfg, log: cfg.Logger.With("component", "mirror"), keys: keys{cfg.Prefix}, st: newState(), ready: make(chan struct{})}, nil
}

// Ready is closed after the first complete load.
func (m *Mirror) Ready() <-chan struct{} { return m.ready }

// Run loads and watches until ctx is done.
func (m *Mirror) Run(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		if err := m.load(ctx); err != nil {
			if ctx.Err() != nil {
				break
			}
			m.log.Warn("mirror load failed; retrying", "err", err, "backoff", backoff)
			sleep(ctx, backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		m.readyOne.Do(func() { close(m.ready) })
		err := m.watch(ctx)
		if ctx.Err() != nil {
			break
		}
		m.log.Warn("mirror watch ended; reloading", "err", err)
		m.reloads.Add(1)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// load replaces the state with a fresh range read of the whole prefix.
func (m *Mirror) load(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := m.cfg.Client.Get(lctx, m.cfg.Prefix, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	st := newState()
	var locs []*mvccpb.KeyValue
	seen := map[string]bool{}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		switch {
		case strings.HasPrefix(k, m.keys.policies()):
			tenant := strings.TrimPrefix(k, m.keys.policies())
			seen[tenant] = true
			m.policy(tenant, kv.Value)
		case strings.HasPrefix(k, m.keys.nodes()):
			m.applyNode(st, kv)
		case strings.HasPrefix(k, m.keys.locs()):
			locs = append(locs, kv)
		case strings.HasPrefix(k, m.keys.links()):
			m.applyLinks(st, kv)
		}
	}
	// Keys sort by node, epoch and seq, which is the order to apply them.
	for _, kv := range locs {
		m.applyLoc(st, kv)
	}
	for tenant := range m.policies {
		if !seen[tenant] {
			m.policy(tenant, nil)
		}
	}
	m.policies = seen
	m.mu.Lock()
	m.st, m.rev = st, resp.Header.Revision
	m.mu.Unlock()
	return nil
}

// policy passes a tenant policy record on. A nil value is a deletion.
func (m *Mirror) policy(tenant string, value []byte) {
	if m.policies == nil {
		m.policies = map[string]bool{}
	}
	if value == nil {
		delete(m.policies, tenant)
	} else {
		m.policies[tenant] = true
	}
	if m.cfg.OnPolicy != nil {
		m.cfg.OnPolicy(tenant, value)
	}
}

func (m *Mirror) applyNode(st *state, kv *mvccpb.KeyValue) {
	rec, err := decodeNode(kv.Value)
	if err == nil && string(kv.Key) != m.keys.node(rec.ID) {
		err = fmt.Errorf("%w: node record %q under key %q", ErrMalformed, rec.ID, kv.Key)
	}
	if err != nil {
		m.skip(kv, err)
		return
	}
	st.upsertNode(rec)
}

func (m *Mirror) applyLoc(st *state, kv *mvccpb.KeyValue) {
	node, epoch, seq, err := m.keys.parseLoc(string(kv.Key))
	if err != nil {
		m.skip(kv, err)
		return
	}
	b, err := DecodeBatch(kv.Value)
	if err != nil {
		m.skip(kv, err)
		return
	}
	if st.applyBatch(node, epoch, seq, b) {
		m.applied.Add(uint64(len(b.Records)))
		if m.cfg.OnApply != nil && b.UnixNano > 0 {
			m.cfg.OnApply(time.Since(time.Unix(0, b.UnixNano)), len(b.Records))
		}
	}
}

func (m *Mirror) applyLinks(st *state, kv *mvccpb.KeyValue) {
	rec, err := DecodeNodeLinks(kv.Value)
	if err == nil && string(kv.Key) != m.keys.link(rec.Node) {
		err = fmt.Errorf("%w: links record of %q under key %q", ErrMalformed, rec.Node, kv.Key)
	}
	if err != nil {
		m.skip(kv, err)
		return
	}
	st.setLinks(rec)
}

func (m *Mirror) skip(kv *mvccpb.KeyValue, err error) {
	m.malformed.Add(1)
	m.log.Warn("skipping a malformed record", "key", string(kv.Key), "err", err)
}

// watch applies events from the revision after the state's until the
// watch fails (compaction, cancellation).
func (m *Mirror) watch(ctx context.Context) error {
	m.mu.RLock()
	from := m.rev + 1
	m.mu.RUnlock()
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range m.cfg.Client.Watch(wctx, m.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if err := wr.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return fmt.Errorf("watch compacted at revision %d: %w", wr.CompactRevision, err)
			}
			return err
		}
		m.mu.Lock()
		for _, ev := range wr.Events {
			m.applyEvent(ev)
		}
		if wr.Header.Revision > m.rev {
			m.rev = wr.Header.Revision
		}
		m.mu.Unlock()
	}
	return ctx.Err()
}

// applyEvent applies one watch event. REQUIRES: m.mu.
func (m *Mirror) applyEvent(ev *clientv3.Event) {
	k := string(ev.Kv.Key)
	switch {
	case strings.HasPrefix(k, m.keys.policies()):
		tenant := strings.TrimPrefix(k, m.keys.policies())
		if ev.Type == clientv3.EventTypeDelete {
			m.policy(tenant, nil)
		} else {
			m.policy(tenant, ev.Kv.Value)
		}
	case strings.HasPrefix(k, m.keys.nodes()):
		if ev.Type == clientv3.EventTypeDelete {
			m.st.dropNode(strings.TrimPrefix(k, m.keys.nodes()))
			return
		}
		m.applyNode(m.st, ev.Kv)
	case strings.HasPrefix(k, m.keys.locs()):
		// Deletions of location keys are the node's log compaction or
		// its lease expiring; the node record's deletion covers the
		// latter, and compacted batches were already applied.
		if ev.Type == clientv3.EventTypePut {
			m.applyLoc(m.st, ev.Kv)
		}
	case strings.HasPrefix(k, m.keys.links()):
		if ev.Type == clientv3.EventTypeDelete {
			m.st.dropLinks(strings.TrimPrefix(k, m.keys.links()))
			return
		}
		m.applyLinks(m.st, ev.Kv)
	}
	if ev.Kv.ModRevision > m.rev {
		m.rev = ev.Kv.ModRevision
	}
}

// Locate answers for every live node how many leading blocks of chain it
// holds, the deepest such prefix and who holds it, and how much of the
// chain the pool holds anywhere.
func (m *Mirror) Locate(tenant, namespace string, chain [][]byte) LocateResult {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.locate(tenant, namespace, chain, m.cfg.Dead)
}

// Nodes returns the node records the mirror knows, by id.
func (m *Mirror) Nodes() []NodeInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]NodeInfo, 0, len(m.st.nodes))
	for _, n := range m.st.nodes {
		out = append(out, NodeInfo{Record: n.rec, Blocks: n.blocks})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Record.ID < out[j].Record.ID })
	return out
}

// NodeInfo is a node as the mirror sees it.
type NodeInfo struct {
	Record NodeRecord
	// Blocks is how many blocks the node's published log says it holds.
	Blocks int
}

// Blocks lists up to limit blocks held by node (0: no limit).
func (m *Mirror) Blocks(node string, limit int) []Record {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.nodeRecords(node, limit)
}

// Link returns the published estimate of the link from node from to node
// to, as from measured it, and whether from published one. Nodes that
// gossip declared dead are not filtered out: callers filter nodes.
func (m *Mirror) Link(from, to string) (LinkRecord, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return findLink(m.st.links[from].Links, to)
}

// Links returns every node's published links record, sorted by node, each
// with its links sorted by peer: the whole link matrix, for admin and
// debugging. Dead nodes are not filtered out. The caller owns the result.
func (m *Mirror) Links() []NodeLinks {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]NodeLinks, 0, len(m.st.links))
	for _, rec := range m.st.links {
		rec.Links = slices.Clone(rec.Links)
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// MirrorStats counts what the mirror did.
type MirrorStats struct {
	// Links counts the nodes whose links record the mirror holds.
	Nodes, Blocks, Links        int
	Revision                    int64
	Applied, Malformed, Reloads uint64
}

// Stats returns counters and sizes.
func (m *Mirror) Stats() MirrorStats {
	m.mu.RLock()
	st := MirrorStats{Nodes: len(m.st.nodes), Blocks: len(m.st.blocks), Links: len(m.st.links), Revision: m.rev}
	m.mu.RUnlock()
	st.Applied, st.Malformed, st.Reloads = m.applied.Load(), m.malformed.Load(), m.reloads.Load()
	return st
}

// Content returns the mirror's whole location index as sorted
// "node tenant/namespace/hexkey" lines: what tests compare with etcd.
func (m *Mirror) Content() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.st.content()
}

// Revision is the etcd revision the mirror reflects.
func (m *Mirror) Revision() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.rev
}

// ReadContent builds the location index straight from etcd, the way a
// fresh mirror would, in Content's form.
func ReadContent(ctx context.Context, cli *clientv3.Client, prefix string) ([]string, int64, error) {
	mm, err := NewMirror(MirrorConfig{Client: cli, Prefix: prefix})
	if err != nil {
		return nil, 0, err
	}
	if err := mm.load(ctx); err != nil {
		return nil, 0, err
	}
	return mm.Content(), mm.Revision(), nil
}

// Holders returns the live nodes holding a block, and each node's record.
func (m *Mirror) Holders(tenant, namespace string, key []byte) []NodeRecord {
	var buf [2*64 + 128 + 2]byte
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []NodeRecord
	for _, slot := range m.st.holders(buf[:0], tenant, namespace, key) {
		id := m.st.slots[slot]
		if id == "" || (m.cfg.Dead != nil && m.cfg.Dead(id)) {
			continue
		}
		out = append(out, m.st.nodes[id].rec)
	}
	return out
}
