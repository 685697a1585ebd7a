package metadata

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MemberConfig configures a node's membership in etcd.
type MemberConfig struct {
	// Client is the etcd client. Required; the caller owns it.
	Client *clientv3.Client
	// Prefix roots every key. Default "/kvpool/".
	Prefix string
	// Record is the node's record; Epoch is filled in. ID is required.
	Record NodeRecord
	// LeaseTTL bounds how long a dead node's records outlive it. Default
	// 5 s, at least 2 s.
	LeaseTTL time.Duration
	// FlushInterval is how long location changes wait to be coalesced into
	// one batch. Default 5 ms.
	FlushInterval time.Duration
	// FlushGap is the least time between the starts of two location
	// batches: changes queued sooner after a batch wait for it. However
	// fast blocks come and go, a node then writes at most one batch per
	// FlushGap (20 a second at the default), which bounds the write load
	// a pool of many nodes puts on etcd and what every node's mirror
	// decodes. A change after a quiet spell still goes out after
	// FlushInterval, and a full batch (MaxBatch) at once. Each batch
	// costs etcd a log write and sync and every mirror a watch event:
	// at the 1500 single-block fetches a second of one busy node (a
	// replica each, and its removal) 5 ms batches took 8 % of a
	// two-processor host's CPU, embedded etcd included. Default 50 ms;
	// negative: no gap.
	FlushGap time.Duration
	// MaxBatch is the most records in one batch (one etcd key). Default
	// 4096, about 150 KB with 32-byte keys.
	MaxBatch int
	// MaxQueue is how many changes may wait while etcd is unreachable;
	// past it the queue is dropped and the node's whole set is written as
	// a snapshot once etcd is back. Default 1M.
	MaxQueue int
	// CompactAfter is how many batches the node's log may grow to before
	// it is replaced by a snapshot of the node's set. Default 512.
	CompactAfter int
	// Snapshot lists every block the node holds, for snapshots. Required.
	// It is called from the member's goroutine and must not block on it.
	Snapshot func(yield func(tenant, namespace string, key []byte) bool)
	// Links, when set, reports the node's current estimates of its links
	// to its peers; the member publishes them under links/<node> on its
	// lease, for every mirror's link matrix. It is called from the
	// member's goroutine every LinkInterval and must not block; the
	// member copies what it returns. Entries that fail validation (see
	// NodeLinks) and repeats of a peer are dropped and logged. Default
	// nil: publish nothing.
	Links func() []LinkRecord
	// LinkInterval is how often Links is polled. A poll writes the record
	// only when it changed materially since the last write in this lease
	// (a peer appeared or left, a seed became a measurement, or a
	// throughput or round trip moved by more than 5%), or when only sample
	// counts moved and the last write is 30 s old. Default 1 s.
	LinkInterval time.Duration
	// Logger receives the member's logs. It should already carry the
	// node's id; the member adds its own name ("component"="member").
	// Default: discard.
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (c *MemberConfig) fill() error {
	if c.Prefix == "" {
		c.Prefix = "/kvpool/"
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 5 * time.Second
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = 5 * time.Millisecond
	}
	if c.FlushGap == 0 {
		c.FlushGap = 50 * time.Millisecond
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 4096
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = 1 << 20
	}
	if c.CompactAfter == 0 {
		c.CompactAfter = 512
	}
	if c.LinkInterval == 0 {
		c.LinkInterval = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("no etcd client"))
	}
	if c.Snapshot == nil {
		errs = append(errs, errors.New("no snapshot function"))
	}
	if err := (&NodeRecord{ID: c.Record.ID, Epoch: 1}).validate(); err != nil {
		errs = append(errs, err)
	}
	if c.LeaseTTL < 2*time.Second {
		errs = append(errs, fmt.Errorf("lease TTL %v: want at least 2s", c.LeaseTTL))
	}
	if c.MaxBatch < 1 || c.MaxQueue < c.MaxBatch || c.CompactAfter < 2 || c.FlushInterval < 0 {
		errs = append(errs, errors.New("batch limits: want MaxBatch ≥ 1, MaxQueue ≥ MaxBatch, CompactAfter ≥ 2, FlushInterval ≥ 0"))
	}
	if c.LinkInterval < 0 {
		errs = append(errs, fmt.Errorf("link interval %v: want > 0", c.LinkInterval))
	}
	if len(errs) > 0 {
		return fmt.Errorf("metadata: invalid member config: %w", errors.Join(errs...))
	}
	return nil
}

// Member is a node's presence in etcd: its record on a lease kept alive,
// and the log of its block locations, written in coalesced batches on the
// same lease. When the node dies the lease expires and etcd drops it all.
//
// Added and Removed queue changes and never block; Run writes them. While
// etcd is unreachable changes queue (up to MaxQueue, then a snapshot
// replaces them) and are written within a flush of etcd's return. If the
// lease is lost, Run takes a new one (a new epoch) and writes the node's
// whole set again.
type Member struct {
	cfg  MemberConfig
	log  *slog.Logger
	keys keys

	mu struct {
		sync.Mutex
		queue        []Record
		needSnapshot bool
		epoch        int64
		// inflight counts changes taken from the queue and not yet written.
		inflight int
	}
	wake chan struct{}

	// Written only by Run's goroutine.
	lease clientv3.LeaseID
	seq   uint64
	// progressed is set when the current session wrote to etcd, so Run
	// starts its backoff afresh after a session that worked.
	progressed bool
	logLen     int // batches in the current epoch's log since the last snapshot
	// lastWrite is when the last batch or snapshot began to be written
	// (monotonic), for FlushGap.
	lastWrite time.Time
	links     linkState
	stats     MemberStats
	statsMu   sync.Mutex
}

// linkState is what the member published under links/<node> in the
// current lease. Owned by Run's goroutine.
type linkState struct {
	// written is the last record written in this lease, sorted by peer;
	// nil before the first write or when the key was deleted.
	written []LinkRecord
	// at is when written was written, by MemberConfig.Now.
	at time.Time
	// dropped is how many entries the last poll dropped as invalid, so a
	// steady stream of bad entries is logged once, not every poll.
	dropped int
	// failing is set while writes fail, so an outage is logged once.
	failing bool
}

// MemberStats counts what a member wrote.
type MemberStats struct {
	Batches, Records, Snapshots, Failures uint64
	// LinkWrites counts links records written, including those written
	// at registration; LinkFailures counts failed link writes (each is
	// retried at the next poll).
	LinkWrites, LinkFailures uint64
	Epoch                    int64
	Queued                   int
}

// NewMember validates cfg. It starts nothing.
func NewMember(cfg MemberConfig) (*Member, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	m := &Member{cfg: cfg, log: cfg.Logger.With("component", "member"), keys: keys{cfg.Prefix}, wake: make(chan struct{}, 1)}
	return m, nil
}

// Added queues "this node holds (tenant, namespace, key)".
func (m *Member) Added(tenant, namespace, key []byte) { m.enqueue(OpAdd, tenant, namespace, key) }

// Removed queues "this node no longer holds (tenant, namespace, key)".
func (m *Member) Removed(tenant, namespace, key []byte) { m.enqueue(OpRemove, tenant, namespace, key) }

func (m *Member) enqueue(op Op, tenant, namespace, key []byte) {
	m.mu.Lock()
	if !m.mu.needSnapshot {
		if len(m.mu.queue) >= m.cfg.MaxQueue {
			m.mu.queue, m.mu.needSnapshot = nil, true
		} else {
			m.mu.queue = append(m.mu.queue, Record{Op: op, Tenant: string(tenant), Namespace: string(namespace), Key: string(key), queuedNano: m.cfg.Now().UnixNano()})
		}
	}
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Pending reports how many changes are not yet in etcd: queued, being
// written, or owed in a snapshot (counted as 1).
func (m *Member) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := len(m.mu.queue) + m.mu.inflight
	if m.mu.needSnapshot || m.mu.epoch == 0 {
		n++
	}
	return n
}

// Epoch returns the current lease id, 0 before the first registration.
func (m *Member) Epoch() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.epoch
}

// Stats returns what the member has written so far.
func (m *Member) Stats() MemberStats {
	m.statsMu.Lock()
	st := m.stats
	m.statsMu.Unlock()
	m.mu.Lock()
	st.Queued, st.Epoch = len(m.mu.queue), m.mu.epoch
	m.mu.Unlock()
	return st
}

// Run registers the node and writes location batches until ctx is done.
// On a clean stop it revokes the lease, so the node's records leave etcd
// at once. It retries etcd failures forever; it returns nil when ctx ends.
func (m *Member) Run(ctx context.Context) error {
	const firstBackoff = 50 * time.Millisecond
	backoff := firstBackoff
	for ctx.Err() == nil {
		m.progressed = false
		err := m.session(ctx)
		if ctx.Err() != nil {
			break
		}
		m.count(func(s *MemberStats) { s.Failures++ })
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// etcd answers again but our lease expired while it could not
			// hear us (frozen, partitioned, restarted without its data).
			// Retrying it would fail forever; register anew at once.
			m.lease = 0
			backoff = firstBackoff
		}
		if m.progressed {
			// The session wrote something before it ended: this is a new
			// failure, not the same outage going on.
			backoff = firstBackoff
		}
		m.log.Warn("etcd session ended; retrying", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	// NB: not through a client already closed (a crash the caller
	// simulates, or a shutdown that closed it first): over TLS that call
	// would wait out its whole timeout instead of failing at once.
	if m.lease != 0 && m.cfg.Client.Ctx().Err() == nil {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := m.cfg.Client.Revoke(rctx, m.lease)
		cancel()
		if err != nil {
			m.log.Warn("could not revoke the lease; records expire with it", "err", err)
		}
	}
	return nil
}

func (m *Member) count(f func(*MemberStats)) {
	m.statsMu.Lock()
	f(&m.stats)
	m.statsMu.Unlock()
}

// session holds one lease: it registers, keeps the lease alive and flushes
// batches until the lease is lost or ctx ends.
func (m *Member) session(ctx context.Context) error {
	if m.lease == 0 {
		if err := m.register(ctx); err != nil {
			return err
		}
	}
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	alive, err := m.cfg.Client.KeepAlive(kctx, m.lease)
	if err != nil {
		m.lease = 0
		return fmt.Errorf("keepalive: %w", err)
	}
	tick := time.NewTicker(max(m.cfg.FlushInterval, m.cfg.FlushGap, time.Millisecond))
	defer tick.Stop()
	var linkTick <-chan time.Time // nil without a Links function: never fires
	if m.cfg.Links != nil {
		t := time.NewTicker(m.cfg.LinkInterval)
		defer t.Stop()
		linkTick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-alive:
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				// The lease is gone (expired while we could not reach
				// etcd) or keepalives stopped: start a new epoch.
				m.lease = 0
				return errors.New("lease lost")
			}
		case <-m.wake:
			// Coalesce: changes arriving within FlushInterval, or until
			// FlushGap has passed since the last batch, share a batch.
			if wait := max(m.cfg.FlushInterval, m.untilGap()); wait > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(wait):
				}
			}
			if err := m.flush(ctx); err != nil {
				return err
			}
		case <-tick.C:
			if m.untilGap() > 0 {
				continue // a wake is due sooner, or the next tick
			}
			if err := m.flush(ctx); err != nil {
				return err
			}
		case <-linkTick:
			if err := m.publishLinks(ctx); err != nil {
				return err
			}
		}
	}
}

// register takes a new lease (a new epoch), writes the node record on it
// and schedules a snapshot: mirrors forget earlier epochs.
func (m *Member) register(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, m.cfg.LeaseTTL)
	defer cancel()
	g, err := m.cfg.Client.Grant(lctx, int64((m.cfg.LeaseTTL+time.Second-1)/time.Second))
	if err != nil {
		return fmt.Errorf("grant lease: %w", err)
	}
	rec := m.cfg.Record
	rec.Schema = NodeRecordSchema
	rec.Epoch = int64(g.ID)
	rec.StartedUnix = m.cfg.Now().Unix()
	b, _ := json.Marshal(rec)
	// The links record goes out with the registration, so mirrors learn
	// the new epoch's links at once; with none to publish, an earlier
	// epoch's record is deleted.
	links := m.pollLinks()
	linkOp := clientv3.OpDelete(m.keys.link(rec.ID))
	if len(links) > 0 {
		lb, err := json.Marshal(NodeLinks{Schema: LinksSchema, Node: rec.ID, UnixNano: m.cfg.Now().UnixNano(), Links: links})
		if err != nil {
			return fmt.Errorf("encode links: %w", err)
		}
		linkOp = clientv3.OpPut(m.keys.link(rec.ID), string(lb), clientv3.WithLease(g.ID))
	}
	// Earlier epochs of this node (a restart with the same id) are gone
	// from etcd's point of view once their lease expires; delete them now
	// so a restarted node is clean at once.
	_, err = m.cfg.Client.Txn(lctx).Then(
		clientv3.OpDelete(m.keys.nodeLocs(rec.ID), clientv3.WithPrefix()),
		clientv3.OpPut(m.keys.node(rec.ID), string(b), clientv3.WithLease(g.ID)),
		linkOp,
	).Commit()
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	m.lease, m.seq, m.logLen, m.progressed = g.ID, 0, 0, true
	m.links.written, m.links.at, m.links.failing = nil, m.cfg.Now(), false
	if len(links) > 0 {
		m.links.written = links
		m.count(func(s *MemberStats) { s.LinkWrites++ })
	}
	m.mu.Lock()
	m.mu.epoch = int64(g.ID)
	m.mu.queue, m.mu.needSnapshot = nil, true
	m.mu.Unlock()
	m.log.Info("registered", "epoch", fmt.Sprintf("%x", int64(g.ID)), "ttl", m.cfg.LeaseTTL.String())
	return m.flush(ctx)
}

// flush writes queued changes, and a snapshot when one is due: a reset
// after a new epoch or a dropped queue, or a compaction when the log grew
// past CompactAfter batches.
func (m *Member) flush(ctx context.Context) error {
	m.mu.Lock()
	reset := m.mu.needSnapshot
	if reset {
		m.mu.queue, m.mu.needSnapshot, m.mu.inflight = nil, false, 1
	}
	m.mu.Unlock()
	if reset {
		err := m.writeSnapshot(ctx, true)
		m.mu.Lock()
		m.mu.inflight = 0
		if err != nil {
			m.mu.needSnapshot = true
		}
		m.mu.Unlock()
		return err
	}
	// Full batches go out now; a partial one only when it is the first (a
	// flush interval has passed) or a compaction follows.
	for first := true; ; first = false {
		m.mu.Lock()
		n := min(len(m.mu.queue), m.cfg.MaxBatch)
		if n < m.cfg.MaxBatch && !first && m.logLen < m.cfg.CompactAfter {
			n = 0
		}
		batch := m.mu.queue[:n:n]
		m.mu.queue = m.mu.queue[n:]
		m.mu.inflight = n
		more := len(m.mu.queue) > 0
		m.mu.Unlock()
		if n == 0 {
			if more {
				select {
				case m.wake <- struct{}{}:
				default:
				}
			}
			break
		}
		if err := m.put(ctx, &Batch{Records: batch}); err != nil {
			m.requeue(batch)
			return err
		}
		m.mu.Lock()
		m.mu.inflight = 0
		m.mu.Unlock()
		m.logLen++
		m.count(func(s *MemberStats) { s.Batches++; s.Records += uint64(len(batch)) })
	}
	if m.logLen >= m.cfg.CompactAfter {
		return m.writeSnapshot(ctx, false)
	}
	return nil
}

// requeue puts an unwritten batch back in front of the queue.
func (m *Member) requeue(batch []Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.inflight = 0
	if m.mu.needSnapshot {
		return
	}
	m.mu.queue = append(append(make([]Record, 0, len(batch)+len(m.mu.queue)), batch...), m.mu.queue...)
}

// untilGap is how long until FlushGap has passed since the last write.
func (m *Member) untilGap() time.Duration {
	if m.cfg.FlushGap <= 0 || m.lastWrite.IsZero() {
		return 0
	}
	return m.cfg.FlushGap - time.Since(m.lastWrite)
}

func (m *Member) put(ctx context.Context, b *Batch) error {
	m.lastWrite = time.Now()
	b.UnixNano = m.cfg.Now().UnixNano()
	if len(b.Records) > 0 && b.Records[0].queuedNano != 0 {
		b.UnixNano = b.Records[0].queuedNano
	}
	key := m.keys.loc(m.cfg.Record.ID, int64(m.lease), m.seq)
	pctx, cancel := context.WithTimeout(ctx, m.cfg.LeaseTTL)
	defer cancel()
	if _, err := m.cfg.Client.Put(pctx, key, string(AppendBatch(nil, b)), clientv3.WithLease(m.lease)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	m.seq++
	m.progressed = true
	return nil
}

// writeSnapshot writes the node's whole set as consecutive snapshot parts,
// then deletes the log before them.
func (m *Member) writeSnapshot(ctx context.Context, reset bool) error {
	var all []Record
	m.cfg.Snapshot(func(tenant, namespace string, key []byte) bool {
		all = append(all, Record{Op: OpAdd, Tenant: tenant, Namespace: namespace, Key: string(key)})
		return true
	})
	first := m.seq
	parts := max((len(all)+m.cfg.MaxBatch-1)/m.cfg.MaxBatch, 1)
	for p := range parts {
		recs := all[min(p*m.cfg.MaxBatch, len(all)):min((p+1)*m.cfg.MaxBatch, len(all))]
		if err := m.put(ctx, &Batch{Snapshot: true, Reset: reset, Part: uint32(p), Parts: uint32(parts), Records: recs}); err != nil {
			return err
		}
	}
	if first > 0 {
		dctx, cancel := context.WithTimeout(ctx, m.cfg.LeaseTTL)
		defer cancel()
		from := m.keys.loc(m.cfg.Record.ID, int64(m.lease), 0)
		to := m.keys.loc(m.cfg.Record.ID, int64(m.lease), first)
		if _, err := m.cfg.Client.Delete(dctx, from, clientv3.WithRange(to)); err != nil {
			return fmt.Errorf("delete compacted log: %w", err)
		}
	}
	m.logLen = 0
	m.count(func(s *MemberStats) { s.Snapshots++; s.Records += uint64(len(all)) })
	return nil
}
