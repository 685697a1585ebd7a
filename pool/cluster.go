package pool

import (
	"context"
	"math"
	"net"
	"sort"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/transfer"
)

// cluster is a node's membership: its records in etcd (member), its
// mirror of everyone's locations, and gossip. Only set when Config.Etcd is.
type cluster struct {
	member *metadata.Member
	mirror *metadata.Mirror
	gossip *metadata.Gossip
}

func newCluster(n *Node) (*cluster, error) {
	cfg := &n.cfg
	advertise := n.advertised()
	gossipAddr := cfg.GossipAddr
	if gossipAddr == "" {
		host, _, _ := net.SplitHostPort(n.tcpLis.Addr().String())
		gossipAddr = net.JoinHostPort(host, "0")
	}
	c := &cluster{}
	var err error
	c.mirror, err = metadata.NewMirror(metadata.MirrorConfig{
		Client: cfg.Etcd,
		Prefix: cfg.MetadataPrefix,
		Dead:   func(id string) bool { return c.gossip.Dead(id) },
		OnApply: func(lag time.Duration, records int) {
			n.metrics.mirrorLag.Observe(lag.Seconds())
		},
		OnPolicy: n.applyPolicy,
		Logger:   cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	c.gossip, err = metadata.NewGossip(metadata.GossipConfig{
		NodeID:        cfg.NodeID,
		BindAddr:      gossipAddr,
		ProbeInterval: cfg.GossipProbeInterval,
		Seeds: func() []string {
			var seeds []string
			for _, ni := range c.mirror.Nodes() {
				if a := ni.Record.Addrs[addrGossip]; a != "" && ni.Record.ID != cfg.NodeID {
					seeds = append(seeds, a)
				}
			}
			return seeds
		},
		Load:   n.load,
		Logger: cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	c.member, err = metadata.NewMember(metadata.MemberConfig{
		Client: cfg.Etcd,
		Prefix: cfg.MetadataPrefix,
		Record: metadata.NodeRecord{
			ID:            cfg.NodeID,
			Addrs:         n.recordAddrs(advertise, c.gossip.Addr()),
			CapacityBytes: cfg.CapacityBytes,
			Zone:          cfg.Zone,
			Accelerator:   cfg.Accelerator,
			Version:       cfg.Version,
		},
		LeaseTTL: cfg.LeaseTTL,
		Snapshot: n.store.ForEach,
		Links:    n.linkRecords,
		Logger:   cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	n.store.sink = c.member
	return c, nil
}

// run starts the member, mirror and gossip; they stop with ctx.
func (c *cluster) run(ctx context.Context, start func(name string, f func() error)) {
	start("etcd member", func() error { return c.member.Run(ctx) })
	start("location mirror", func() error { return c.mirror.Run(ctx) })
	start("gossip", func() error { return c.gossip.Run(ctx) })
}

// linkRecords are this node's measured links, for the member to publish:
// every daemon plans with the whole link matrix.
func (n *Node) linkRecords() []metadata.LinkRecord {
	var out []metadata.LinkRecord
	for _, e := range n.links.All(n.cfg.Now()) {
		if e.Peer == n.cfg.NodeID {
			continue
		}
		out = append(out, metadata.LinkRecord{Peer: e.Peer, BytesPerSecond: e.BytesPerSecond, RTTMicros: e.RTT.Microseconds(), Samples: e.Samples})
	}
	return out
}

// load is what the node gossips: its store's usage and its engine's last
// report.
func (n *Node) load() metadata.Load {
	st := n.store.Stats()
	n.engineMu.Lock()
	l := n.engine
	n.engineMu.Unlock()
	l.CapacityBytes, l.UsedBytes, l.Blocks = int64(st.CapacityBytes), int64(st.UsedBytes), int64(st.Blocks)
	return l
}

// ReportLoad records the local engine's queue time and prefill speed; the
// node plans with them and gossips them.
func (g *grpcService) ReportLoad(_ context.Context, req *kvpoolv1.ReportLoadRequest) (*kvpoolv1.ReportLoadResponse, error) {
	q, tps, at := req.GetQueueSeconds(), req.GetPrefillTokensPerSecond(), req.GetPrefillPromptTokens()
	if q < 0 || tps < 0 || math.IsNaN(q) || math.IsNaN(tps) || math.IsInf(q, 0) || math.IsInf(tps, 0) {
		return nil, api.ToStatus(api.Errorf(api.ErrInvalidArgument, "pool: queue %v s and prefill %v tokens/s must be non-negative numbers", q, tps))
	}
	if at > 1<<40 {
		return nil, api.ToStatus(api.Errorf(api.ErrInvalidArgument, "pool: prefill prompt tokens %d is implausible", at))
	}
	if m := req.GetModel(); m != "" {
		if _, err := g.n.cfg.Profiles.Model(m); err != nil {
			return nil, api.ToStatus(api.Errorf(api.ErrInvalidArgument, "pool: report load: %v", err))
		}
	}
	n := g.n
	n.engineMu.Lock()
	n.engine.QueueSeconds, n.engine.PrefillTokensPerSecond, n.engine.EngineReportUnix = q, tps, n.cfg.Now().Unix()
	n.engine.PrefillPromptTokens, n.engine.Model = int64(at), req.GetModel()
	n.engineMu.Unlock()
	if c := n.cluster; c != nil {
		c.gossip.Refresh()
	}
	return &kvpoolv1.ReportLoadResponse{}, nil
}

// adminService implements kvpoolv1.AdminServiceServer from the node's
// mirror and gossip.
type adminService struct {
	kvpoolv1.UnimplementedAdminServiceServer
	n *Node
}

var _ kvpoolv1.AdminServiceServer = (*adminService)(nil)

func (a *adminService) cluster() (*cluster, error) {
	if a.n.cluster == nil {
		return nil, api.ToStatus(api.Errorf(api.ErrFailedPrecondition, "pool: node %s runs standalone, without etcd", a.n.cfg.NodeID))
	}
	return a.n.cluster, nil
}

func (a *adminService) ListNodes(context.Context, *kvpoolv1.ListNodesRequest) (*kvpoolv1.ListNodesResponse, error) {
	c, err := a.cluster()
	if err != nil {
		return nil, err
	}
	peers := map[string]metadata.Peer{}
	for _, p := range c.gossip.Peers() {
		peers[p.ID] = p
	}
	out := &kvpoolv1.ListNodesResponse{AnsweredBy: a.n.cfg.NodeID}
	seen := map[string]bool{}
	for _, ni := range c.mirror.Nodes() {
		r := ni.Record
		st := &kvpoolv1.NodeStatus{
			NodeId: r.ID, Addrs: r.Addrs, Zone: r.Zone, Version: r.Version, CapacityBytes: uint64(r.CapacityBytes),
			EtcdState: "registered", GossipState: "unknown", PublishedBlocks: uint64(ni.Blocks),
			Epoch: strconv.FormatInt(r.Epoch, 16), StartedUnix: r.StartedUnix,
		}
		if p, ok := peers[r.ID]; ok {
			fillPeer(st, p)
		}
		out.Nodes = append(out.Nodes, st)
		seen[r.ID] = true
	}
	for id, p := range peers {
		if !seen[id] {
			st := &kvpoolv1.NodeStatus{NodeId: id, EtcdState: "absent", Addrs: map[string]string{addrGossip: p.Addr}}
			fillPeer(st, p)
			out.Nodes = append(out.Nodes, st)
		}
	}
	sort.Slice(out.Nodes, func(i, j int) bool { return out.Nodes[i].NodeId < out.Nodes[j].NodeId })
	return out, nil
}

func fillPeer(st *kvpoolv1.NodeStatus, p metadata.Peer) {
	st.GossipState = p.State
	st.UsedBytes, st.StoredBlocks = uint64(p.Load.UsedBytes), uint64(p.Load.Blocks)
	st.QueueSeconds, st.PrefillTokensPerSecond = p.Load.QueueSeconds, p.Load.PrefillTokensPerSecond
	if st.CapacityBytes == 0 {
		st.CapacityBytes = uint64(p.Load.CapacityBytes)
	}
}

func (a *adminService) ClusterLocate(_ context.Context, req *kvpoolv1.ClusterLocateRequest) (*kvpoolv1.ClusterLocateResponse, error) {
	c, err := a.cluster()
	if err != nil {
		return nil, err
	}
	if err := validateChain(req.GetTenant(), req.GetNamespace(), req.GetKeys()); err != nil {
		return nil, api.ToStatus(err)
	}
	r := c.mirror.Locate(req.GetTenant(), req.GetNamespace(), req.GetKeys())
	out := &kvpoolv1.ClusterLocateResponse{
		ChainBlocks: uint32(r.ChainBlocks), DeepestBlocks: uint32(r.Deepest), DeepestNodes: r.DeepestNodes,
		PoolPrefixBlocks: uint32(r.PoolPrefix), AnsweredBy: a.n.cfg.NodeID,
	}
	for _, np := range r.Nodes {
		out.Nodes = append(out.Nodes, &kvpoolv1.NodePrefix{NodeId: np.Node, PrefixBlocks: uint32(np.Blocks)})
	}
	return out, nil
}

func validateChain(tenant, namespace string, keys [][]byte) error {
	if len(keys) > 1<<16 {
		return api.Errorf(api.ErrInvalidArgument, "pool: chain of %d keys; at most 65536", len(keys))
	}
	for _, k := range keys {
		if err := validateKey([]byte(tenant), []byte(namespace), k); err != nil {
			return err
		}
	}
	if len(keys) == 0 {
		return validateKey([]byte(tenant), []byte(namespace), []byte("x"))
	}
	return nil
}

func (a *adminService) ListBlocks(_ context.Context, req *kvpoolv1.ListBlocksRequest) (*kvpoolv1.ListBlocksResponse, error) {
	c, err := a.cluster()
	if err != nil {
		return nil, err
	}
	if err := api.ValidateName("node id", req.GetNodeId()); err != nil {
		return nil, api.ToStatus(err)
	}
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = 1000
	}
	out := &kvpoolv1.ListBlocksResponse{}
	found := false
	for _, ni := range c.mirror.Nodes() {
		if ni.Record.ID == req.GetNodeId() {
			out.Total, found = uint64(ni.Blocks), true
		}
	}
	if !found {
		return nil, api.ToStatus(api.Errorf(api.ErrNotFound, "pool: no node %q in the cluster", req.GetNodeId()))
	}
	recs := c.mirror.Blocks(req.GetNodeId(), limit)
	sort.Slice(recs, func(i, j int) bool {
		if recs[i].Tenant != recs[j].Tenant {
			return recs[i].Tenant < recs[j].Tenant
		}
		if recs[i].Namespace != recs[j].Namespace {
			return recs[i].Namespace < recs[j].Namespace
		}
		return recs[i].Key < recs[j].Key
	})
	for _, r := range recs {
		out.Blocks = append(out.Blocks, &kvpoolv1.BlockRef{Tenant: r.Tenant, Namespace: r.Namespace, Key: []byte(r.Key)})
	}
	return out, nil
}

func (a *adminService) ClusterStats(ctx context.Context, _ *kvpoolv1.ClusterStatsRequest) (*kvpoolv1.ClusterStatsResponse, error) {
	c, err := a.cluster()
	if err != nil {
		return nil, err
	}
	nodes, err := a.ListNodes(ctx, nil)
	if err != nil {
		return nil, err
	}
	ms, mb := c.mirror.Stats(), c.member.Stats()
	out := &kvpoolv1.ClusterStatsResponse{
		Nodes:                uint32(len(nodes.Nodes)),
		MirrorBlocks:         uint64(ms.Blocks),
		MirrorRevision:       ms.Revision,
		MirrorRecordsApplied: ms.Applied,
		MirrorMalformed:      ms.Malformed,
		MirrorReloads:        ms.Reloads,
		PublishedBatches:     mb.Batches,
		PublishedRecords:     mb.Records,
		PublishedSnapshots:   mb.Snapshots,
		PublishFailures:      mb.Failures,
		PublishQueued:        uint64(mb.Queued),
		AnsweredBy:           a.n.cfg.NodeID,
	}
	for _, ns := range nodes.Nodes {
		if ns.GossipState == "alive" || ns.GossipState == "suspect" {
			out.LiveNodes++
		}
		out.CapacityBytes += ns.CapacityBytes
		out.UsedBytes += ns.UsedBytes
		out.StoredBlocks += ns.StoredBlocks
	}
	out.Tenants = a.n.tenantStatsProto()
	return out, nil
}

// clusterCollector reports the mirror's and member's counters at scrape.
type clusterCollector struct{ c *cluster }

var (
	descMirrorBlocks    = prometheus.NewDesc("kvpool_metadata_mirror_blocks", "Blocks in this daemon's location mirror.", nil, nil)
	descMirrorMalformed = prometheus.NewDesc("kvpool_metadata_mirror_malformed_total", "Malformed records skipped by the mirror.", nil, nil)
	descMirrorReloads   = prometheus.NewDesc("kvpool_metadata_mirror_reloads_total", "Full reloads of the mirror (compaction, lost watch).", nil, nil)
	descPublished       = prometheus.NewDesc("kvpool_metadata_published_records_total", "Location records written to etcd.", nil, nil)
	descPublishQueue    = prometheus.NewDesc("kvpool_metadata_publish_queue", "Location changes waiting for etcd.", nil, nil)
	descPublishFailures = prometheus.NewDesc("kvpool_metadata_publish_failures_total", "etcd sessions that failed and were retried.", nil, nil)
)

func (cc *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMirrorBlocks, descMirrorMalformed, descMirrorReloads, descPublished, descPublishQueue, descPublishFailures} {
		ch <- d
	}
}

func (cc *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	ms, mb := cc.c.mirror.Stats(), cc.c.member.Stats()
	ch <- prometheus.MustNewConstMetric(descMirrorBlocks, prometheus.GaugeValue, float64(ms.Blocks))
	ch <- prometheus.MustNewConstMetric(descMirrorMalformed, prometheus.CounterValue, float64(ms.Malformed))
	ch <- prometheus.MustNewConstMetric(descMirrorReloads, prometheus.CounterValue, float64(ms.Reloads))
	ch <- prometheus.MustNewConstMetric(descPublished, prometheus.CounterValue, float64(mb.Records))
	ch <- prometheus.MustNewConstMetric(descPublishQueue, prometheus.GaugeValue, float64(mb.Queued))
	ch <- prometheus.MustNewConstMetric(descPublishFailures, prometheus.CounterValue, float64(mb.Failures))
}

// Cluster accessors for tests and tools in this module.

// Mirror returns the node's location mirror, or nil when standalone.
func (n *Node) Mirror() *metadata.Mirror {
	if n.cluster == nil {
		return nil
	}
	return n.cluster.mirror
}

// Member returns the node's etcd membership, or nil when standalone.
func (n *Node) Member() *metadata.Member {
	if n.cluster == nil {
		return nil
	}
	return n.cluster.member
}

// Gossip returns the node's gossip, or nil when standalone.
func (n *Node) Gossip() *metadata.Gossip {
	if n.cluster == nil {
		return nil
	}
	return n.cluster.gossip
}

func (a *adminService) ListLinks(context.Context, *kvpoolv1.ListLinksRequest) (*kvpoolv1.ListLinksResponse, error) {
	now := a.n.cfg.Now()
	out := &kvpoolv1.ListLinksResponse{NodeId: a.n.cfg.NodeID, Transport: a.n.cfg.Transport}
	known := map[string]bool{}
	for _, e := range a.n.links.All(now) {
		known[e.Peer] = true
		out.Links = append(out.Links, linkStatus(e, now))
	}
	// Peers never pulled from show their seeds.
	if c := a.n.cluster; c != nil {
		for _, ni := range c.mirror.Nodes() {
			if id := ni.Record.ID; id != a.n.cfg.NodeID && !known[id] {
				out.Links = append(out.Links, linkStatus(a.n.links.Estimate(id, now), now))
			}
		}
	}
	sort.Slice(out.Links, func(i, j int) bool { return out.Links[i].Peer < out.Links[j].Peer })
	return out, nil
}

func linkStatus(e transfer.Estimate, now time.Time) *kvpoolv1.LinkStatus {
	idle := -1.0
	if !e.Updated.IsZero() {
		idle = now.Sub(e.Updated).Seconds()
	}
	return &kvpoolv1.LinkStatus{Peer: e.Peer, BytesPerSecond: e.BytesPerSecond, RttSeconds: e.RTT.Seconds(),
		BandwidthSamples: uint64(e.Samples), RttSamples: uint64(e.RTTSamples), Bytes: uint64(e.Bytes), IdleSeconds: idle}
}

// linkCollector reports link estimates at scrape time.
type linkCollector struct{ n *Node }

var (
	descLinkBW  = prometheus.NewDesc("kvpool_transfer_link_bandwidth_bytes_per_second", "Estimated bandwidth from a peer.", []string{"peer"}, nil)
	descLinkRTT = prometheus.NewDesc("kvpool_transfer_link_rtt_seconds", "Estimated round trip to a peer.", []string{"peer"}, nil)
)

func (lc *linkCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descLinkBW; ch <- descLinkRTT }

func (lc *linkCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range lc.n.links.All(lc.n.cfg.Now()) {
		ch <- prometheus.MustNewConstMetric(descLinkBW, prometheus.GaugeValue, e.BytesPerSecond, e.Peer)
		ch <- prometheus.MustNewConstMetric(descLinkRTT, prometheus.GaugeValue, e.RTT.Seconds(), e.Peer)
	}
}
