package pool

import (
	"context"
	"path"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/pool/disk"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer"
)

// metrics are the node's Prometheus metrics. Usage gauges are read from
// the store at scrape time; counters are bumped at the edges.
type metrics struct {
	requests      *prometheus.CounterVec // path, op, code
	dataCounters  [wire.NumOps][17]atomic.Pointer[prometheus.Counter]
	bytesSent     prometheus.Counter
	bytesReceived prometheus.Counter
	reclaimed     prometheus.Counter
	mirrorLag     prometheus.Histogram
	fetched       *prometheus.CounterVec // by transport
	fetchedBlocks *prometheus.CounterVec // by how they were addressed (fetch.go)
	fetchFailures *prometheus.CounterVec // by reason (fetch.go)
	callOverhead  prometheus.Gauge       // the callers' reported median (fetch.go)
	planDecisions *prometheus.CounterVec // by plan, where
	badPolicies   prometheus.Counter
	acceptErrors  *prometheus.CounterVec // by door
	refusedConns  *prometheus.CounterVec // by door and reason
	accepted      *prometheus.CounterVec // by what a TCP connection turned out to be
	logsDropped   prometheus.Counter
	// peerCacheUpdates counts the peers' engine-cache updates applied.
	peerCacheUpdates prometheus.Counter
	draining         prometheus.Gauge
	arenaPopulated   prometheus.Gauge
	drainedBlocks    *prometheus.CounterVec // by outcome (drain.go)
	mailboxPosts     *prometheus.CounterVec
	// postsServedBy are mailboxPosts' series, by postServer, looked up
	// once: every post counts in one.
	postsServedBy [len(postServerNames)]prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, st *store.Store, limits *connLimits) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_pool_requests_total",
			Help: "Requests served, by path (grpc, data), operation and status code.",
		}, []string{"path", "op", "code"}),
		bytesSent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvpool_pool_data_sent_bytes_total",
			Help: "Block bytes sent over the data channel.",
		}),
		bytesReceived: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvpool_pool_data_received_bytes_total",
			Help: "Block bytes received over the data channel.",
		}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvpool_pool_reservations_reclaimed_total",
			Help: "Reservations reclaimed because they were not committed in time.",
		}),
		fetched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_transfer_fetched_bytes_total",
			Help: "Block bytes pulled from peers by Fetch, by the transport that moved them.",
		}, []string{"transport"}),
		fetchedBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_transfer_fetched_blocks_total",
			Help: "Blocks pulled from peers by Fetch, by how the holder was asked: name (read by name at the size the namespace's blocks were last seen to have, the holder pinning each only while it sends it: no pin round trip first; tcp transport only) or pin (pinned on the holder over the data channel, then read).",
		}, []string{"addressed"}),
		fetchFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_transfer_fetch_failures_total",
			Help: "Blocks a Fetch could not pull from a holder, by reason: unreachable (no connection), pin (the holder refused or lost the block), space (no room here), read (the transfer failed or timed out), checksum (the bytes did not match the holder's CRC). The caller recomputes them or another holder is tried.",
		}, []string{"reason"}),
		callOverhead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvpool_transfer_fetch_call_overhead_seconds",
			Help: "The median of what this node's callers report their last 63 Fetch calls cost beyond the node's own fetch (their request's way in, the answer's way out, their wake-up; reports of more than 10 ms are dropped), 0 until three have reported. The links' fitted fixed cost per fetch includes it, so Plan predicts the wait a caller sees.",
		}),
		planDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_plan_decisions_total",
			Help: "Plans answered (Plan, Estimate), by the winning candidate's plan (local, fetch, split, recompute) and whether it is this node (where: this_node, other_node).",
		}, []string{"plan", "where"}),
		badPolicies: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvpool_eviction_malformed_policies_total",
			Help: "Tenant policy records in etcd that did not decode and were skipped.",
		}),
		acceptErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_pool_accept_errors_total",
			Help: "Failed accepts, by door (tcp, shm): out of file descriptors or memory, or a connection reset before it was accepted. The door backs off and keeps serving.",
		}, []string{"door"}),
		accepted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_pool_accepted_connections_total",
			Help: "Connections on the TCP port that said what they are, by protocol (grpc, data, transfer) and security (tls, plaintext).",
		}, []string{"protocol", "security"}),
		refusedConns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_pool_refused_connections_total",
			Help: "Connections closed as soon as they were accepted, by door and reason: door_full (the door holds --max-conns) or remote_full (the remote address holds --max-conns-per-remote).",
		}, []string{"door", "reason"}),
		logsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvpool_log_dropped_records_total",
			Help: "Warnings and errors not logged because their cause had logged 10 records in the last 10 s.",
		}),
		peerCacheUpdates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvpool_engine_caches_peer_updates_total",
			Help: "Updates to peers' engines' GPU caches applied from their WatchEngineCaches streams.",
		}),
		arenaPopulated: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvpool_pool_arena_populated_bytes",
			Help: "Bytes of the arena whose pages are allocated: all of it with --prefault or --lock-memory, else as far as the background population has got (--populate-rate).",
		}),
		draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvpool_pool_draining",
			Help: "1 once the node has begun to drain (it takes no new blocks or leases and is leaving), else 0.",
		}),
		drainedBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_pool_drained_blocks_total",
			Help: "Blocks in memory when the node drained, by outcome: replicated (another live node held them), handed_off (a peer pulled them), kept (only this node held them when the drain ended).",
		}, []string{"outcome"}),
		mailboxPosts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvpool_pool_shm_mailbox_posts_total",
			Help: "Posts served from same-host sessions' mailboxes, the memory a session shares with the node for its small requests (pins, reservations, commits, removes) and their answers, instead of its unix socket, by who served them: node (the session's goroutine in the node), sweeper (the node's one goroutine that watches every session's mailbox while posts come close together), or client (a client in the node's own process, in its own goroutine). Each post is one or more requests; they are counted in kvpool_pool_requests_total{path=\"data\"} too.",
		}, []string{"served_by"}),
		mirrorLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvpool_metadata_mirror_lag_seconds",
			Help:    "From a location change queued on its node to this daemon's mirror applying it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
	}
	for _, a := range []string{addressedByName, addressedByPin} {
		m.fetchedBlocks.WithLabelValues(a)
	}
	for _, r := range []string{fetchUnreachable, fetchPin, fetchSpace, fetchRead, fetchChecksum} {
		m.fetchFailures.WithLabelValues(r) // every reason exported from the start, at 0
	}
	for _, o := range []string{"replicated", "handed_off", "kept"} {
		m.drainedBlocks.WithLabelValues(o)
	}
	for by, name := range postServerNames {
		m.postsServedBy[by] = m.mailboxPosts.WithLabelValues(name)
	}
	collectors := []prometheus.Collector{m.draining, m.arenaPopulated, m.drainedBlocks, m.requests, m.bytesSent, m.bytesReceived, m.reclaimed, m.mirrorLag, m.fetched, m.fetchedBlocks, m.fetchFailures, m.callOverhead, m.planDecisions, m.badPolicies, m.acceptErrors, m.refusedConns, m.accepted, m.logsDropped, m.peerCacheUpdates, m.mailboxPosts, &storeCollector{st}}
	for _, door := range []string{doorTCP, doorShm, doorShmTransfer, doorMetrics} {
		collectors = append(collectors, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "kvpool_pool_open_connections",
			Help:        "Connections open on a door (tcp: gRPC, the data channel and the tcp transport together).",
			ConstLabels: prometheus.Labels{"door": door},
		}, func() float64 { return float64(limits.openOn(door)) }))
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// dataOp counts one data-channel request. Each (op, code) counter is
// resolved once, so the hot path costs an atomic load and add; op 0 counts
// malformed frames.
func (m *metrics) dataOp(op wire.Op, code codes.Code) {
	if int(op) >= len(m.dataCounters) || code > 16 {
		return
	}
	slot := &m.dataCounters[op][code]
	c := slot.Load()
	if c == nil {
		name := op.String()
		if op == 0 {
			name = "malformed"
		}
		v := m.requests.WithLabelValues("data", name, code.String())
		slot.CompareAndSwap(nil, &v)
		c = slot.Load()
	}
	(*c).Inc()
}

// unaryInterceptor and streamInterceptor are the gRPC edge: every
// handler's Go error becomes a status here, once, through the one table
// (api.ToStatus), and is counted.
func (m *metrics) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	err = api.ToStatus(err)
	m.requests.WithLabelValues("grpc", path.Base(info.FullMethod), api.Code(err).String()).Inc()
	return resp, err
}

func (m *metrics) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	err := api.ToStatus(h(srv, ss))
	m.requests.WithLabelValues("grpc", path.Base(info.FullMethod), api.Code(err).String()).Inc()
	return err
}

// storeCollector reports the store's usage when scraped.
type storeCollector struct{ s *store.Store }

var (
	descCapacity  = prometheus.NewDesc("kvpool_pool_capacity_bytes", "Size of the shared-memory arena.", nil, nil)
	descUsed      = prometheus.NewDesc("kvpool_pool_used_bytes", "Arena bytes held by blocks and reservations (whole pages).", nil, nil)
	descStored    = prometheus.NewDesc("kvpool_pool_stored_bytes", "Sum of the committed values' sizes.", nil, nil)
	descBlocks    = prometheus.NewDesc("kvpool_pool_blocks", "Committed blocks.", nil, nil)
	descRes       = prometheus.NewDesc("kvpool_pool_reservations", "Open reservations.", nil, nil)
	descLargest   = prometheus.NewDesc("kvpool_pool_largest_free_bytes", "Longest contiguous free run.", nil, nil)
	descExtFrag   = prometheus.NewDesc("kvpool_pool_external_fragmentation_ratio", "1 - largest free run / free bytes.", nil, nil)
	descIntFrag   = prometheus.NewDesc("kvpool_pool_internal_fragmentation_ratio", "1 - stored bytes / bytes of the pages holding them.", nil, nil)
	descNSBlocks  = prometheus.NewDesc("kvpool_pool_namespace_blocks", "Committed blocks per tenant and namespace.", []string{"tenant", "namespace"}, nil)
	descNSStored  = prometheus.NewDesc("kvpool_pool_namespace_stored_bytes", "Stored bytes per tenant and namespace.", []string{"tenant", "namespace"}, nil)
	descTStored   = prometheus.NewDesc("kvpool_eviction_tenant_stored_bytes", "Stored bytes per tenant.", []string{"tenant"}, nil)
	descTQuota    = prometheus.NewDesc("kvpool_eviction_tenant_quota_bytes", "Each tenant's quota on this node; 0 means none.", []string{"tenant"}, nil)
	descTHits     = prometheus.NewDesc("kvpool_eviction_tenant_hits_total", "Reads that found their block, per tenant.", []string{"tenant"}, nil)
	descTMisses   = prometheus.NewDesc("kvpool_eviction_tenant_misses_total", "Reads that did not, per tenant.", []string{"tenant"}, nil)
	descTEvicted  = prometheus.NewDesc("kvpool_eviction_tenant_evictions_total", "Blocks evicted per tenant, by reason: quota, pressure (node watermark) or ttl.", []string{"tenant", "reason"}, nil)
	descTRejected = prometheus.NewDesc("kvpool_eviction_tenant_rejected_total", "Puts refused per tenant: at quota with nothing evictable, or not admitted.", []string{"tenant"}, nil)
	storeDescList = []*prometheus.Desc{descCapacity, descUsed, descStored, descBlocks, descRes, descLargest, descExtFrag, descIntFrag, descNSBlocks, descNSStored,
		descTStored, descTQuota, descTHits, descTMisses, descTEvicted, descTRejected}
)

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range storeDescList {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Stats()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	g(descCapacity, float64(st.CapacityBytes))
	g(descUsed, float64(st.UsedBytes))
	g(descStored, float64(st.StoredBytes))
	g(descBlocks, float64(st.Blocks))
	g(descRes, float64(st.Reservations))
	g(descLargest, float64(st.LargestFreeBytes))
	g(descExtFrag, st.ExternalFragmentation)
	g(descIntFrag, st.InternalFragmentation)
	for _, ns := range st.Namespaces {
		g(descNSBlocks, float64(ns.Blocks), ns.Tenant, ns.Namespace)
		g(descNSStored, float64(ns.StoredBytes), ns.Tenant, ns.Namespace)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, t := range c.s.TenantStats() {
		g(descTStored, float64(t.StoredBytes), t.Tenant)
		g(descTQuota, float64(t.Config.QuotaBytes), t.Tenant)
		counter(descTHits, t.Hits, t.Tenant)
		counter(descTMisses, t.Misses, t.Tenant)
		counter(descTEvicted, t.QuotaEvictions, t.Tenant, "quota")
		counter(descTEvicted, t.PressureEvictions, t.Tenant, "pressure")
		counter(descTEvicted, t.Expirations, t.Tenant, "ttl")
		counter(descTRejected, t.Rejected, t.Tenant)
	}
}

// linkCollector reports link estimates at scrape time.
type linkCollector struct {
	links *transfer.Links
	now   func() time.Time
}

var (
	descLinkBW       = prometheus.NewDesc("kvpool_transfer_link_bandwidth_bytes_per_second", "Estimated bandwidth from a peer.", []string{"peer"}, nil)
	descLinkRTT      = prometheus.NewDesc("kvpool_transfer_link_rtt_seconds", "Estimated round trip to a peer.", []string{"peer"}, nil)
	descLinkFix      = prometheus.NewDesc("kvpool_transfer_link_fetch_fixed_seconds", "What one fetch from a peer costs beyond its round trip and bytes (pins, reserve, commit, publish), fitted over recent fetches.", []string{"peer"}, nil)
	descLinkPer      = prometheus.NewDesc("kvpool_transfer_link_fetch_per_block_seconds", "What each block of a fetch from a peer adds beyond its bytes, fitted over recent fetches.", []string{"peer"}, nil)
	descLinkDoubling = prometheus.NewDesc("kvpool_transfer_link_fetch_per_doubling_seconds", "What each doubling of a fetch's chain adds (the work its blocks share), fitted over recent fetches.", []string{"peer"}, nil)
)

func (lc *linkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLinkBW
	ch <- descLinkRTT
	ch <- descLinkFix
	ch <- descLinkPer
	ch <- descLinkDoubling
}

func (lc *linkCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range lc.links.All(lc.now()) {
		ch <- prometheus.MustNewConstMetric(descLinkBW, prometheus.GaugeValue, e.BytesPerSecond, e.Peer)
		ch <- prometheus.MustNewConstMetric(descLinkRTT, prometheus.GaugeValue, e.RTT.Seconds(), e.Peer)
		ch <- prometheus.MustNewConstMetric(descLinkFix, prometheus.GaugeValue, e.Fixed.Seconds(), e.Peer)
		ch <- prometheus.MustNewConstMetric(descLinkPer, prometheus.GaugeValue, e.PerBlock.Seconds(), e.Peer)
		ch <- prometheus.MustNewConstMetric(descLinkDoubling, prometheus.GaugeValue, e.PerDoubling.Seconds(), e.Peer)
	}
}

// linkRecords are the measured links into self, for the member to
// publish: every daemon plans with the whole link matrix.
func linkRecords(estimates []transfer.Estimate, self string) []metadata.LinkRecord {
	var out []metadata.LinkRecord
	for _, e := range estimates {
		if e.Peer != self {
			out = append(out, metadata.LinkRecord{Peer: e.Peer, BytesPerSecond: e.BytesPerSecond, RTTMicros: e.RTT.Microseconds(), Samples: e.Samples,
				FixedMicros: float64(e.Fixed) / 1e3, PerBlockMicros: float64(e.PerBlock) / 1e3, PerDoublingMicros: float64(e.PerDoubling) / 1e3,
				FetchBytesPerSecond: e.FetchBytesPerSecond})
		}
	}
	return out
}

// persistCollector exports what the node found in its data directory at
// start, and the journal's state.
type persistCollector struct{ p *persistence }

var (
	descRestored     = prometheus.NewDesc("kvpool_persist_restored_blocks", "Blocks the node found in its segment at start, by outcome: adopted, dropped (failed their checksum), expired, overlapped (superseded in the journal).", []string{"outcome"}, nil)
	descRestoreTook  = prometheus.NewDesc("kvpool_persist_restore_seconds", "How long reading the journal, checking every block and adopting them took at start.", nil, nil)
	descJournalBytes = prometheus.NewDesc("kvpool_persist_journal_bytes", "Length of the index journal, flushed or not.", nil, nil)
	descCompactions  = prometheus.NewDesc("kvpool_persist_journal_compactions_total", "Journal rewrites down to the live blocks while the node runs.", nil, nil)
	descFlushErrors  = prometheus.NewDesc("kvpool_persist_journal_flush_errors_total", "Failed journal flushes: after one, a restart keeps only the blocks journaled before it.", nil, nil)
)

func (pc persistCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRestored
	ch <- descRestoreTook
	ch <- descJournalBytes
	ch <- descFlushErrors
	ch <- descCompactions
}

func (pc persistCollector) Collect(ch chan<- prometheus.Metric) {
	r := pc.p.started
	for outcome, v := range map[string]int{"adopted": r.Adopted, "dropped": r.Dropped, "expired": r.Expired, "overlapped": r.Overlapped} {
		ch <- prometheus.MustNewConstMetric(descRestored, prometheus.GaugeValue, float64(v), outcome)
	}
	ch <- prometheus.MustNewConstMetric(descRestoreTook, prometheus.GaugeValue, r.Took.Seconds())
	ch <- prometheus.MustNewConstMetric(descJournalBytes, prometheus.GaugeValue, float64(pc.p.journal.Size()))
	ch <- prometheus.MustNewConstMetric(descFlushErrors, prometheus.CounterValue, float64(pc.p.flushErrors.Load()))
	ch <- prometheus.MustNewConstMetric(descCompactions, prometheus.CounterValue, float64(pc.p.compactions.Load()))
}

// diskCollector reports the disk tier (pool/disk) and its promotions.
type diskCollector struct {
	disk  *disk.Tier
	tiers *tiers
}

var (
	descDiskBlocks   = prometheus.NewDesc("kvpool_disk_blocks", "Blocks on the node's disk tier.", nil, nil)
	descDiskBytes    = prometheus.NewDesc("kvpool_disk_bytes", "Bytes of the disk tier's files (a 4 KiB header and the block padded to 4 KiB each).", nil, nil)
	descDiskCapacity = prometheus.NewDesc("kvpool_disk_capacity_bytes", "The disk tier's capacity (--disk-capacity).", nil, nil)
	descDiskPending  = prometheus.NewDesc("kvpool_disk_pending_bytes", "Bytes offered to the disk and not yet written; they stay pinned in the arena until then.", nil, nil)
	descDiskSpills   = prometheus.NewDesc("kvpool_disk_spills_total", "Blocks copied from memory to disk.", nil, nil)
	descDiskSpilled  = prometheus.NewDesc("kvpool_disk_spilled_bytes_total", "Bytes copied from memory to disk.", nil, nil)
	descDiskSkips    = prometheus.NewDesc("kvpool_disk_spill_skips_total", "Blocks offered to the disk and not written, by reason: too_large, queue_full, quota, full, expired, removed.", []string{"reason"}, nil)
	descDiskWriteErr = prometheus.NewDesc("kvpool_disk_write_errors_total", "Failed disk writes, by reason: no_space (the file system is full), io. The block stays in memory only.", []string{"reason"}, nil)
	descDiskReads    = prometheus.NewDesc("kvpool_disk_reads_total", "Blocks read from disk (promoted into memory).", nil, nil)
	descDiskReadB    = prometheus.NewDesc("kvpool_disk_read_bytes_total", "Bytes read from disk.", nil, nil)
	descDiskReadErr  = prometheus.NewDesc("kvpool_disk_read_errors_total", "Disk reads that failed, by reason: missing, io, truncated, header, checksum. The block is dropped from the disk and the read is a miss (DataLoss once).", []string{"reason"}, nil)
	descDiskEvicted  = prometheus.NewDesc("kvpool_disk_evictions_total", "Blocks the disk tier evicted for room (a tenant's disk quota or the tier's capacity).", nil, nil)
	descDiskExpired  = prometheus.NewDesc("kvpool_disk_expired_total", "Disk blocks deleted when their TTL ended.", nil, nil)
	descDiskRate     = prometheus.NewDesc("kvpool_disk_read_bytes_per_second", "The disk's measured read rate (a moving average of promotions; a probe's until the first): what Plan prices a local disk block at.", nil, nil)
	descDiskPromoted = prometheus.NewDesc("kvpool_disk_promotions_total", "Disk blocks promoted into memory by a read, a lease or a fetch, by outcome: ok, failed.", []string{"outcome"}, nil)
	descDiskOpened   = prometheus.NewDesc("kvpool_disk_opened_blocks", "What the node found on its disk at start, by outcome: adopted, dropped (bad header or length), expired, evicted (past the capacity), partial (unfinished writes).", []string{"outcome"}, nil)
)

func (dc diskCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDiskBlocks, descDiskBytes, descDiskCapacity, descDiskPending, descDiskSpills, descDiskSpilled,
		descDiskSkips, descDiskWriteErr, descDiskReads, descDiskReadB, descDiskReadErr, descDiskEvicted, descDiskExpired, descDiskRate,
		descDiskPromoted, descDiskOpened} {
		ch <- d
	}
}

func (dc diskCollector) Collect(ch chan<- prometheus.Metric) {
	s := dc.disk.Stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descDiskBlocks, float64(s.Blocks))
	gauge(descDiskBytes, float64(s.Bytes))
	gauge(descDiskCapacity, float64(s.CapacityBytes))
	gauge(descDiskPending, float64(s.PendingBytes))
	counter(descDiskSpills, s.Spilled)
	counter(descDiskSpilled, s.SpilledBytes)
	for _, r := range disk.SkipReasons {
		counter(descDiskSkips, s.Skips[r], r)
	}
	for _, r := range disk.WriteFailures {
		counter(descDiskWriteErr, s.WriteFailures[r], r)
	}
	counter(descDiskReads, s.Read)
	counter(descDiskReadB, s.ReadBytes)
	for _, r := range disk.ReadFailures {
		counter(descDiskReadErr, s.ReadFailures[r], r)
	}
	counter(descDiskEvicted, s.Evicted)
	counter(descDiskExpired, s.Expired)
	gauge(descDiskRate, s.ReadBytesPerSecond)
	counter(descDiskPromoted, dc.tiers.promoted.Load(), "ok")
	counter(descDiskPromoted, dc.tiers.promoteFailed.Load(), "failed")
	o := dc.disk.Opened()
	for outcome, v := range map[string]int{"adopted": o.Blocks, "dropped": o.Dropped, "expired": o.Expired, "evicted": o.Evicted, "partial": o.Partial} {
		gauge(descDiskOpened, float64(v), outcome)
	}
}
