package pool

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvpool/kvpool/metadata"
)

// cluster is a node's membership: its records in etcd (member), its
// mirror of everyone's locations, and gossip. Only set when Config.Etcd is.
// It is the cluster view the fetcher, the planner and the admin service
// read (holderView, planView, adminView).
type cluster struct {
	member *metadata.Member
	mirror *metadata.Mirror
	gossip *metadata.Gossip
}

// clusterView is everything the node's parts read of the cluster; each
// part declares the piece it uses.
type clusterView interface {
	holderView
	planView
	adminView
}

var _ clusterView = (*cluster)(nil)

// newCluster builds the membership of n. log carries the node's id; each
// part adds its own name. On failure nothing is left running: memberlist
// starts its listeners when the gossip is created, so they are shut down
// if a later step fails.
func newCluster(n *Node, log *slog.Logger) (_ *cluster, err error) {
	cfg := &n.cfg
	gossipAddr := cfg.GossipAddr
	if gossipAddr == "" {
		host, _, _ := net.SplitHostPort(n.doors.tcp.Addr().String())
		gossipAddr = net.JoinHostPort(host, "0")
	}
	c := &cluster{}
	c.mirror, err = metadata.NewMirror(metadata.MirrorConfig{
		Client: cfg.Etcd,
		Prefix: cfg.MetadataPrefix,
		Dead:   func(id string) bool { return c.gossip.Dead(id) },
		OnApply: func(lag time.Duration, records int) {
			n.metrics.mirrorLag.Observe(lag.Seconds())
		},
		OnPolicy: func(tenant string, value []byte) { applyPolicy(n.store, n.metrics.badPolicies, n.log, tenant, value) },
		Logger:   log,
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
		Load:   n.engine.load,
		Logger: log,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.gossip.Shutdown()
		}
	}()
	addrs := map[string]string{addrGRPC: n.advertised(), addrGossip: c.gossip.Addr()}
	if n.doors.xfer != nil {
		addrs[addrShm] = cfg.transferSocket()
		addrs[addrHost] = n.hostID
	}
	c.member, err = metadata.NewMember(metadata.MemberConfig{
		Client: cfg.Etcd,
		Prefix: cfg.MetadataPrefix,
		Record: metadata.NodeRecord{
			ID:                      cfg.NodeID,
			Addrs:                   addrs,
			CapacityBytes:           cfg.CapacityBytes,
			Zone:                    cfg.Zone,
			Accelerator:             cfg.Accelerator,
			Version:                 cfg.Version,
			NamedReads:              true,
			EngineCaches:            len(cfg.EngineEvents),
			HostToGPUBytesPerSecond: cfg.HostToGPUBytesPerSecond,
		},
		LeaseTTL: cfg.LeaseTTL,
		FlushGap: cfg.LocationFlushGap,
		Snapshot: n.blocks.ForEach,
		Links:    func() []metadata.LinkRecord { return linkRecords(n.links.All(cfg.Now()), cfg.NodeID) },
		Logger:   log,
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// run starts the member, mirror and gossip; they stop with ctx.
func (c *cluster) run(ctx context.Context, g *services) {
	g.Go("etcd member", func() error { return c.member.Run(ctx) })
	g.Go("location mirror", func() error { return c.mirror.Run(ctx) })
	g.Go("gossip", func() error { return c.gossip.Run(ctx) })
}

// The cluster view.

func (c *cluster) Nodes() []metadata.NodeInfo { return c.mirror.Nodes() }

// zoneOf is the zone of the node that serves addr (its advertised
// address); "" when no node known serves it.
func (c *cluster) zoneOf(addr string) string {
	for _, ni := range c.mirror.Nodes() {
		for _, a := range ni.Record.Addrs {
			if a == addr {
				return ni.Record.Zone
			}
		}
	}
	return ""
}

func (c *cluster) Holders(tenant, namespace string, key []byte) []metadata.NodeRecord {
	return c.mirror.Holders(tenant, namespace, key)
}

func (c *cluster) Locate(tenant, namespace string, chain [][]byte) metadata.LocateResult {
	return c.mirror.Locate(tenant, namespace, chain)
}

func (c *cluster) Dead(id string) bool { return c.gossip.Dead(id) }

func (c *cluster) Peers() []metadata.Peer { return c.gossip.Peers() }

func (c *cluster) Link(to, from string) (metadata.LinkRecord, bool) { return c.mirror.Link(to, from) }

func (c *cluster) Blocks(node string, limit int) []metadata.Record {
	return c.mirror.Blocks(node, limit)
}

func (c *cluster) Stats() (metadata.MirrorStats, metadata.MemberStats) {
	return c.mirror.Stats(), c.member.Stats()
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

// clusterCollector reports the mirror's and member's counters at scrape.
type clusterCollector struct{ c *cluster }

var (
	descMirrorBlocks    = prometheus.NewDesc("kvpool_metadata_mirror_blocks", "Blocks in this daemon's location mirror.", nil, nil)
	descMirrorMalformed = prometheus.NewDesc("kvpool_metadata_mirror_malformed_total", "Malformed records skipped by the mirror.", nil, nil)
	descMirrorReloads   = prometheus.NewDesc("kvpool_metadata_mirror_reloads_total", "Full reloads of the mirror (compaction, lost watch).", nil, nil)
	descPublished       = prometheus.NewDesc("kvpool_metadata_published_records_total", "Location records written to etcd.", nil, nil)
	descPublishQueue    = prometheus.NewDesc("kvpool_metadata_publish_queue", "Location changes waiting for etcd.", nil, nil)
	descPublishFailures = prometheus.NewDesc("kvpool_metadata_publish_failures_total", "etcd sessions that failed and were retried.", nil, nil)
	descGossipMembers   = prometheus.NewDesc("kvpool_metadata_gossip_members", "Nodes gossip knows, this one included, by state: alive, or dead (failed its probes or left).", []string{"state"}, nil)
	descMapNodes        = prometheus.NewDesc("kvpool_metadata_nodes", "Nodes registered in the cluster map (their etcd lease is live), as this daemon's mirror sees them.", nil, nil)
	clusterDescs        = []*prometheus.Desc{descMirrorBlocks, descMirrorMalformed, descMirrorReloads, descPublished, descPublishQueue, descPublishFailures, descGossipMembers, descMapNodes}
)

func (cc *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range clusterDescs {
		ch <- d
	}
}

func (cc *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	ms, mb := cc.c.Stats()
	ch <- prometheus.MustNewConstMetric(descMirrorBlocks, prometheus.GaugeValue, float64(ms.Blocks))
	ch <- prometheus.MustNewConstMetric(descMirrorMalformed, prometheus.CounterValue, float64(ms.Malformed))
	ch <- prometheus.MustNewConstMetric(descMirrorReloads, prometheus.CounterValue, float64(ms.Reloads))
	ch <- prometheus.MustNewConstMetric(descPublished, prometheus.CounterValue, float64(mb.Records))
	ch <- prometheus.MustNewConstMetric(descPublishQueue, prometheus.GaugeValue, float64(mb.Queued))
	ch <- prometheus.MustNewConstMetric(descPublishFailures, prometheus.CounterValue, float64(mb.Failures))
	states := map[string]int{"alive": 0, "dead": 0}
	for _, p := range cc.c.gossip.Peers() {
		states[p.State]++
	}
	for state, n := range states {
		ch <- prometheus.MustNewConstMetric(descGossipMembers, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(descMapNodes, prometheus.GaugeValue, float64(len(cc.c.mirror.Nodes())))
}
