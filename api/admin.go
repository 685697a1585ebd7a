package api

import (
	"context"
	"time"

	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// NodeStats is a node's usage and allocator state (Client.Stats).
type NodeStats struct {
	NodeID                                           string
	CapacityBytes, UsedBytes, FreeBytes, StoredBytes uint64
	Blocks, Reservations, ReservedBytes              uint64
	PageBytes, LargestFreeBytes                      uint64
	// ExternalFragmentation is 1 - largest free run / free bytes;
	// InternalFragmentation 1 - stored bytes / bytes of their pages.
	ExternalFragmentation, InternalFragmentation float64
	MemoryLocked                                 bool
	LeasedBlocks                                 uint64
	Namespaces                                   []NamespaceStats
	Tenants                                      []TenantStats
}

// NamespaceStats is the usage of one (tenant, namespace) on a node.
type NamespaceStats struct {
	Tenant, Namespace   string
	Blocks, StoredBytes uint64
}

// TenantStats is one tenant's use of a node and what its policy did.
type TenantStats struct {
	Tenant, Policy                                           string
	QuotaBytes                                               int64 // 0: none
	StoredBytes, Blocks, Hits, Misses                        uint64
	QuotaEvictions, PressureEvictions, Expirations, Rejected uint64
	// PolicyApplied is when the node last applied a policy change for the
	// tenant (zero: never).
	PolicyApplied time.Time
}

// Stats returns the node's usage.
func (c *Client) Stats(ctx context.Context) (NodeStats, error) {
	st, err := c.rpc.Stats(ctx, &kvpoolv1.StatsRequest{})
	if err != nil {
		return NodeStats{}, FromStatus(err)
	}
	out := NodeStats{NodeID: st.GetNodeId(), CapacityBytes: st.GetCapacityBytes(), UsedBytes: st.GetUsedBytes(), FreeBytes: st.GetFreeBytes(),
		StoredBytes: st.GetStoredBytes(), Blocks: st.GetBlocks(), Reservations: st.GetReservations(), ReservedBytes: st.GetReservedBytes(),
		PageBytes: st.GetPageBytes(), LargestFreeBytes: st.GetLargestFreeBytes(), ExternalFragmentation: st.GetExternalFragmentation(),
		InternalFragmentation: st.GetInternalFragmentation(), MemoryLocked: st.GetMemoryLocked(), LeasedBlocks: st.GetLeasedBlocks(),
		Tenants: tenantsFromProto(st.GetTenants())}
	for _, ns := range st.GetNamespaces() {
		out.Namespaces = append(out.Namespaces, NamespaceStats{Tenant: ns.GetTenant(), Namespace: ns.GetNamespace(), Blocks: ns.GetBlocks(), StoredBytes: ns.GetStoredBytes()})
	}
	return out, nil
}

func tenantsFromProto(ts []*kvpoolv1.TenantStats) []TenantStats {
	var out []TenantStats
	for _, t := range ts {
		s := TenantStats{Tenant: t.GetTenant(), Policy: t.GetPolicy(), QuotaBytes: t.GetQuotaBytes(), StoredBytes: t.GetStoredBytes(),
			Blocks: t.GetBlocks(), Hits: t.GetHits(), Misses: t.GetMisses(), QuotaEvictions: t.GetQuotaEvictions(),
			PressureEvictions: t.GetPressureEvictions(), Expirations: t.GetExpirations(), Rejected: t.GetRejected()}
		if ms := t.GetPolicyAppliedUnixMs(); ms != 0 {
			s.PolicyApplied = time.UnixMilli(ms)
		}
		out = append(out, s)
	}
	return out
}

// Admin asks a daemon about the whole cluster (its mirror of etcd and its
// gossip) and manages tenant policies: what operators' tools use. It
// shares the Client's connection and is safe for concurrent use.
type Admin struct {
	rpc kvpoolv1.AdminServiceClient
}

// Admin returns the admin calls on the client's connection.
func (c *Client) Admin() *Admin { return &Admin{rpc: kvpoolv1.NewAdminServiceClient(c.cc)} }

// NodeStatus is one node as the answering daemon sees it: its record in
// etcd, its state in gossip, and its gossiped load.
type NodeStatus struct {
	ID      string
	Addrs   map[string]string // "grpc", "gossip", ... → address
	Zone    string
	Version string
	// EtcdState is "registered", or "absent" for a node only gossip knows;
	// GossipState "alive", "suspect", "dead" or "unknown".
	EtcdState, GossipState string
	CapacityBytes          uint64
	UsedBytes              uint64
	Blocks                 uint64 // stored, by gossip
	PublishedBlocks        uint64 // in the answering daemon's mirror
	Queue                  time.Duration
	PrefillTokensPerSecond float64
	Epoch                  string
	Started                time.Time
}

// Nodes lists every node the daemon knows, and which daemon answered.
func (a *Admin) Nodes(ctx context.Context) ([]NodeStatus, string, error) {
	r, err := a.rpc.ListNodes(ctx, &kvpoolv1.ListNodesRequest{})
	if err != nil {
		return nil, "", FromStatus(err)
	}
	var out []NodeStatus
	for _, n := range r.GetNodes() {
		s := NodeStatus{ID: n.GetNodeId(), Addrs: n.GetAddrs(), Zone: n.GetZone(), Version: n.GetVersion(), EtcdState: n.GetEtcdState(),
			GossipState: n.GetGossipState(), CapacityBytes: n.GetCapacityBytes(), UsedBytes: n.GetUsedBytes(), Blocks: n.GetStoredBlocks(),
			PublishedBlocks: n.GetPublishedBlocks(), Queue: seconds(n.GetQueueSeconds()), PrefillTokensPerSecond: n.GetPrefillTokensPerSecond(),
			Epoch: n.GetEpoch()}
		if u := n.GetStartedUnix(); u != 0 {
			s.Started = time.Unix(u, 0)
		}
		out = append(out, s)
	}
	return out, r.GetAnsweredBy(), nil
}

// ClusterLocation is where a prefix chain's blocks are in the cluster.
type ClusterLocation struct {
	ChainBlocks int
	// Nodes are the live nodes with how many leading blocks each holds.
	Nodes []NodePrefix
	// DeepestBlocks is the longest prefix one node holds; DeepestNodes
	// hold it.
	DeepestBlocks int
	DeepestNodes  []string
	// PoolPrefixBlocks is how many leading blocks the pool holds anywhere.
	PoolPrefixBlocks int
	AnsweredBy       string
}

// NodePrefix is how many leading blocks of a chain a node holds.
type NodePrefix struct {
	Node   string
	Blocks int
}

// Locate answers, from the daemon's mirror, how much of the chain every
// live node holds.
func (a *Admin) Locate(ctx context.Context, tenant, namespace string, chain [][]byte) (ClusterLocation, error) {
	r, err := a.rpc.ClusterLocate(ctx, &kvpoolv1.ClusterLocateRequest{Tenant: tenant, Namespace: namespace, Keys: chain})
	if err != nil {
		return ClusterLocation{}, FromStatus(err)
	}
	out := ClusterLocation{ChainBlocks: int(r.GetChainBlocks()), DeepestBlocks: int(r.GetDeepestBlocks()), DeepestNodes: r.GetDeepestNodes(),
		PoolPrefixBlocks: int(r.GetPoolPrefixBlocks()), AnsweredBy: r.GetAnsweredBy()}
	for _, n := range r.GetNodes() {
		out.Nodes = append(out.Nodes, NodePrefix{Node: n.GetNodeId(), Blocks: int(n.GetPrefixBlocks())})
	}
	return out, nil
}

// Blocks lists up to limit (0: 1000) of the blocks node has published,
// sorted, and how many it has in all.
func (a *Admin) Blocks(ctx context.Context, node string, limit int) ([]BlockKey, uint64, error) {
	r, err := a.rpc.ListBlocks(ctx, &kvpoolv1.ListBlocksRequest{NodeId: node, Limit: uint32(max(limit, 0))})
	if err != nil {
		return nil, 0, FromStatus(err)
	}
	var out []BlockKey
	for _, b := range r.GetBlocks() {
		out = append(out, BlockKey{Tenant: b.GetTenant(), Namespace: b.GetNamespace(), Key: b.GetKey()})
	}
	return out, r.GetTotal(), nil
}

// ClusterStats sums the cluster up and says what the answering daemon's
// metadata machinery did.
type ClusterStats struct {
	Nodes, LiveNodes                       int
	CapacityBytes, UsedBytes, StoredBlocks uint64
	// The answering daemon's mirror of etcd.
	MirrorBlocks, MirrorRecordsApplied, MirrorMalformed, MirrorReloads uint64
	MirrorRevision                                                     int64
	// What the answering daemon published to etcd.
	PublishedBatches, PublishedRecords, PublishedSnapshots, PublishFailures, PublishQueued uint64
	AnsweredBy                                                                             string
	// Tenants are the answering daemon's own tenants.
	Tenants []TenantStats
}

// Stats returns the cluster summary.
func (a *Admin) Stats(ctx context.Context) (ClusterStats, error) {
	r, err := a.rpc.ClusterStats(ctx, &kvpoolv1.ClusterStatsRequest{})
	if err != nil {
		return ClusterStats{}, FromStatus(err)
	}
	return ClusterStats{Nodes: int(r.GetNodes()), LiveNodes: int(r.GetLiveNodes()), CapacityBytes: r.GetCapacityBytes(),
		UsedBytes: r.GetUsedBytes(), StoredBlocks: r.GetStoredBlocks(), MirrorBlocks: r.GetMirrorBlocks(),
		MirrorRecordsApplied: r.GetMirrorRecordsApplied(), MirrorMalformed: r.GetMirrorMalformed(), MirrorReloads: r.GetMirrorReloads(),
		MirrorRevision: r.GetMirrorRevision(), PublishedBatches: r.GetPublishedBatches(), PublishedRecords: r.GetPublishedRecords(),
		PublishedSnapshots: r.GetPublishedSnapshots(), PublishFailures: r.GetPublishFailures(), PublishQueued: r.GetPublishQueued(),
		AnsweredBy: r.GetAnsweredBy(), Tenants: tenantsFromProto(r.GetTenants())}, nil
}

// LinkStatus is the answering daemon's estimate of its link from a peer.
type LinkStatus struct {
	Peer                         string
	BytesPerSecond               float64
	RTT                          time.Duration
	BandwidthSamples, RTTSamples uint64
	Bytes                        uint64 // moved over the link so far
	// Idle is how long since the estimate last moved; negative when the
	// link was never measured and the figures are the seed.
	Idle time.Duration
}

// Links returns the daemon's id, the transport it pulls with, and its
// estimate of every link into it.
func (a *Admin) Links(ctx context.Context) (node, transport string, links []LinkStatus, err error) {
	r, err := a.rpc.ListLinks(ctx, &kvpoolv1.ListLinksRequest{})
	if err != nil {
		return "", "", nil, FromStatus(err)
	}
	for _, l := range r.GetLinks() {
		links = append(links, LinkStatus{Peer: l.GetPeer(), BytesPerSecond: l.GetBytesPerSecond(), RTT: seconds(l.GetRttSeconds()),
			BandwidthSamples: l.GetBandwidthSamples(), RTTSamples: l.GetRttSamples(), Bytes: l.GetBytes(), Idle: seconds(l.GetIdleSeconds())})
	}
	return r.GetNodeId(), r.GetTransport(), links, nil
}

// Policy is how a tenant's blocks are kept on every node.
type Policy struct {
	Tenant string
	// Kind is lru, lfu, fifo, ttl or prefix-lru.
	Kind string
	// QuotaBytes is the per-node cap and guarantee; 0 means none.
	QuotaBytes int64
	// High and Low are fractions of the quota: past High the tenant evicts
	// down to Low (0: the defaults).
	High, Low float64
	// DefaultTTL expires blocks this long after they are stored; 0 never.
	DefaultTTL time.Duration
}

func (p Policy) proto() *kvpoolv1.TenantPolicy {
	return &kvpoolv1.TenantPolicy{Tenant: p.Tenant, Policy: p.Kind, QuotaBytes: p.QuotaBytes, HighWatermark: p.High,
		LowWatermark: p.Low, DefaultTtlSeconds: p.DefaultTTL.Seconds()}
}

func policyFromProto(p *kvpoolv1.TenantPolicy) Policy {
	return Policy{Tenant: p.GetTenant(), Kind: p.GetPolicy(), QuotaBytes: p.GetQuotaBytes(), High: p.GetHighWatermark(),
		Low: p.GetLowWatermark(), DefaultTTL: seconds(p.GetDefaultTtlSeconds())}
}

// SetPolicy stores p; every daemon applies it within a second. It returns
// the policy as stored (defaults filled) and when it was stored.
func (a *Admin) SetPolicy(ctx context.Context, p Policy) (Policy, time.Time, error) {
	r, err := a.rpc.SetPolicy(ctx, &kvpoolv1.SetPolicyRequest{Policy: p.proto()})
	if err != nil {
		return Policy{}, time.Time{}, FromStatus(err)
	}
	return policyFromProto(r.GetPolicy()), time.UnixMilli(r.GetStoredUnixMs()), nil
}

// Policy returns tenant's stored policy; ErrNotFound when it has none.
func (a *Admin) Policy(ctx context.Context, tenant string) (Policy, error) {
	r, err := a.rpc.GetPolicy(ctx, &kvpoolv1.GetPolicyRequest{Tenant: tenant})
	if err != nil {
		return Policy{}, FromStatus(err)
	}
	return policyFromProto(r.GetPolicy()), nil
}

// Policies lists every stored policy, by tenant.
func (a *Admin) Policies(ctx context.Context) ([]Policy, error) {
	r, err := a.rpc.ListPolicies(ctx, &kvpoolv1.ListPoliciesRequest{})
	if err != nil {
		return nil, FromStatus(err)
	}
	var out []Policy
	for _, p := range r.GetPolicies() {
		out = append(out, policyFromProto(p))
	}
	return out, nil
}

// DeletePolicy deletes tenant's policy: its blocks fall back to the
// nodes' defaults.
func (a *Admin) DeletePolicy(ctx context.Context, tenant string) error {
	_, err := a.rpc.DeletePolicy(ctx, &kvpoolv1.DeletePolicyRequest{Tenant: tenant})
	return FromStatus(err)
}
