// Package admin is the operator's client of a kvpool daemon: the cluster
// as the daemon's mirror of etcd and its gossip see it (nodes, where a
// prefix chain's blocks are, a node's blocks, cluster stats, links), and
// per-tenant policies, as Go types. Their JSON is the CLI's stable --json
// shape, so the types keep the wire's units, named in the fields. The
// CLI's cluster and policy commands use it; engines need only package api.
package admin

import (
	"context"
	"encoding/hex"
	"time"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// Client asks a daemon about the whole cluster (its mirror of etcd and its
// gossip) and manages tenant policies. It shares an api.Client's
// connection and is safe for concurrent use.
type Client struct {
	rpc kvpoolv1.AdminServiceClient
}

// New returns the admin calls on c's connection.
func New(c *api.Client) *Client { return &Client{rpc: kvpoolv1.NewAdminServiceClient(c.Conn())} }

// Nodes is every node the answering daemon knows.
type Nodes struct {
	AnsweredBy string       `json:"answered_by"`
	Nodes      []NodeStatus `json:"nodes"`
}

// NodeStatus is one node as the answering daemon sees it: its record in
// etcd, its state in gossip, and its gossiped load.
type NodeStatus struct {
	ID      string            `json:"id"`
	Addrs   map[string]string `json:"addrs"` // "grpc", "gossip", ... → address
	Zone    string            `json:"zone"`
	Version string            `json:"version"`
	// EtcdState is "registered", or "absent" for a node only gossip knows;
	// GossipState "alive", "dead" or "unknown".
	EtcdState              string  `json:"etcd_state"`
	GossipState            string  `json:"gossip_state"`
	CapacityBytes          uint64  `json:"capacity_bytes"`
	UsedBytes              uint64  `json:"used_bytes"`
	Blocks                 uint64  `json:"blocks"`           // stored, by gossip
	PublishedBlocks        uint64  `json:"published_blocks"` // in the answering daemon's mirror
	QueueSeconds           float64 `json:"queue_seconds"`
	PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second"`
	Epoch                  string  `json:"epoch"`
	StartedUnix            int64   `json:"started_unix"`
}

// Nodes lists every node the daemon knows.
func (a *Client) Nodes(ctx context.Context) (Nodes, error) {
	r, err := a.rpc.ListNodes(ctx, &kvpoolv1.ListNodesRequest{})
	if err != nil {
		return Nodes{}, api.FromStatus(err)
	}
	out := Nodes{AnsweredBy: r.GetAnsweredBy(), Nodes: []NodeStatus{}}
	for _, n := range r.GetNodes() {
		out.Nodes = append(out.Nodes, NodeStatus{ID: n.GetNodeId(), Addrs: n.GetAddrs(), Zone: n.GetZone(), Version: n.GetVersion(),
			EtcdState: n.GetEtcdState(), GossipState: n.GetGossipState(), CapacityBytes: n.GetCapacityBytes(), UsedBytes: n.GetUsedBytes(),
			Blocks: n.GetStoredBlocks(), PublishedBlocks: n.GetPublishedBlocks(), QueueSeconds: n.GetQueueSeconds(),
			PrefillTokensPerSecond: n.GetPrefillTokensPerSecond(), Epoch: n.GetEpoch(), StartedUnix: n.GetStartedUnix()})
	}
	return out, nil
}

// Location is where a prefix chain's blocks are in the cluster.
type Location struct {
	ChainBlocks int `json:"chain_blocks"`
	// Nodes are the live nodes with how many leading blocks each holds.
	Nodes []NodePrefix `json:"nodes"`
	// DeepestBlocks is the longest prefix one node holds; DeepestNodes
	// hold it.
	DeepestBlocks int      `json:"deepest_blocks"`
	DeepestNodes  []string `json:"deepest_nodes"`
	// PoolPrefixBlocks is how many leading blocks the pool holds anywhere.
	PoolPrefixBlocks int    `json:"pool_prefix_blocks"`
	AnsweredBy       string `json:"answered_by"`
}

// NodePrefix is how many leading blocks of a chain a node holds, per
// tier.
type NodePrefix struct {
	Node string `json:"node"`
	// Blocks are in the node's kvpool host memory.
	Blocks int `json:"prefix_blocks"`
	// GPUBlocks are in one of its engines' GPU memory, from their KV
	// events; meaningful only when GPUFollowed (else unknown).
	GPUBlocks   int  `json:"gpu_prefix_blocks"`
	GPUFollowed bool `json:"gpu_followed"`
	// MemoryBlocks of Blocks are in host memory and the rest on the
	// node's disk tier, as the node itself said (TiersKnown); the map
	// says only that the node holds them.
	MemoryBlocks int  `json:"memory_prefix_blocks,omitempty"`
	TiersKnown   bool `json:"tiers_known,omitempty"`
}

// Locate answers, from the daemon's mirror, how much of the chain every
// live node holds.
func (a *Client) Locate(ctx context.Context, tenant, namespace string, chain [][]byte) (Location, error) {
	r, err := a.rpc.ClusterLocate(ctx, &kvpoolv1.ClusterLocateRequest{Tenant: tenant, Namespace: namespace, Keys: chain})
	if err != nil {
		return Location{}, api.FromStatus(err)
	}
	out := Location{ChainBlocks: int(r.GetChainBlocks()), Nodes: []NodePrefix{}, DeepestBlocks: int(r.GetDeepestBlocks()),
		DeepestNodes: r.GetDeepestNodes(), PoolPrefixBlocks: int(r.GetPoolPrefixBlocks()), AnsweredBy: r.GetAnsweredBy()}
	for _, n := range r.GetNodes() {
		out.Nodes = append(out.Nodes, NodePrefix{Node: n.GetNodeId(), Blocks: int(n.GetPrefixBlocks()),
			GPUBlocks: int(n.GetGpuPrefixBlocks()), GPUFollowed: n.GetGpuFollowed()})
	}
	return out, nil
}

// BlockList is the first page of the blocks one node has published.
type BlockList struct {
	Node   string     `json:"node"`
	Total  uint64     `json:"total"` // published in all
	Blocks []BlockRef `json:"blocks"`
}

// BlockRef names one published block.
type BlockRef struct {
	Tenant    string `json:"tenant"`
	Namespace string `json:"namespace"`
	Key       HexKey `json:"key"`
}

// HexKey is a block key whose text (and so JSON) form is hex.
type HexKey []byte

func (k HexKey) MarshalText() ([]byte, error) { return hex.AppendEncode(nil, k), nil }

func (k *HexKey) UnmarshalText(b []byte) error {
	v, err := hex.AppendDecode(nil, b)
	*k = v
	return err
}

// Blocks lists up to limit (0: 1000) of the blocks node has published,
// sorted, and how many it has in all.
func (a *Client) Blocks(ctx context.Context, node string, limit int) (BlockList, error) {
	r, err := a.rpc.ListBlocks(ctx, &kvpoolv1.ListBlocksRequest{NodeId: node, Limit: uint32(max(limit, 0))})
	if err != nil {
		return BlockList{}, api.FromStatus(err)
	}
	out := BlockList{Node: node, Total: r.GetTotal(), Blocks: []BlockRef{}}
	for _, b := range r.GetBlocks() {
		out.Blocks = append(out.Blocks, BlockRef{Tenant: b.GetTenant(), Namespace: b.GetNamespace(), Key: b.GetKey()})
	}
	return out, nil
}

// Stats sums the cluster up and says what the answering daemon's metadata
// machinery did: its mirror of etcd, and what it published there.
type Stats struct {
	Nodes                int               `json:"nodes"`
	LiveNodes            int               `json:"live_nodes"`
	CapacityBytes        uint64            `json:"capacity_bytes"`
	UsedBytes            uint64            `json:"used_bytes"`
	StoredBlocks         uint64            `json:"stored_blocks"`
	MirrorBlocks         uint64            `json:"mirror_blocks"`
	MirrorRevision       int64             `json:"mirror_revision"`
	MirrorRecordsApplied uint64            `json:"mirror_records_applied"`
	MirrorMalformed      uint64            `json:"mirror_malformed"`
	MirrorReloads        uint64            `json:"mirror_reloads"`
	PublishedBatches     uint64            `json:"published_batches"`
	PublishedRecords     uint64            `json:"published_records"`
	PublishedSnapshots   uint64            `json:"published_snapshots"`
	PublishFailures      uint64            `json:"publish_failures"`
	PublishQueued        uint64            `json:"publish_queued"`
	AnsweredBy           string            `json:"answered_by"`
	Tenants              []api.TenantStats `json:"tenants"` // the answering daemon's own
}

// Stats returns the cluster summary.
func (a *Client) Stats(ctx context.Context) (Stats, error) {
	r, err := a.rpc.ClusterStats(ctx, &kvpoolv1.ClusterStatsRequest{})
	if err != nil {
		return Stats{}, api.FromStatus(err)
	}
	return Stats{Nodes: int(r.GetNodes()), LiveNodes: int(r.GetLiveNodes()), CapacityBytes: r.GetCapacityBytes(),
		UsedBytes: r.GetUsedBytes(), StoredBlocks: r.GetStoredBlocks(), MirrorBlocks: r.GetMirrorBlocks(),
		MirrorRecordsApplied: r.GetMirrorRecordsApplied(), MirrorMalformed: r.GetMirrorMalformed(), MirrorReloads: r.GetMirrorReloads(),
		MirrorRevision: r.GetMirrorRevision(), PublishedBatches: r.GetPublishedBatches(), PublishedRecords: r.GetPublishedRecords(),
		PublishedSnapshots: r.GetPublishedSnapshots(), PublishFailures: r.GetPublishFailures(), PublishQueued: r.GetPublishQueued(),
		AnsweredBy: r.GetAnsweredBy(), Tenants: api.TenantsFromProto(r.GetTenants())}, nil
}

// Links are the answering daemon's estimates of the links into it.
type Links struct {
	Node      string `json:"node"`
	Transport string `json:"transport"` // the one it pulls with
	Links     []Link `json:"links"`
}

// Link is the estimate of the link from a peer.
type Link struct {
	Peer             string  `json:"peer"`
	BytesPerSecond   float64 `json:"bytes_per_second"`
	RTTSeconds       float64 `json:"rtt_seconds"`
	BandwidthSamples uint64  `json:"bandwidth_samples"`
	RTTSamples       uint64  `json:"rtt_samples"`
	Bytes            uint64  `json:"bytes"` // moved over the link so far
	// IdleSeconds is how long since the estimate last moved; negative when
	// the link was never measured and the figures are the seed.
	IdleSeconds float64 `json:"idle_seconds"`
	// FixedSeconds is what one fetch costs beyond its round trip and
	// bytes, PerBlockSeconds what each block adds, PerDoublingSeconds
	// what each doubling of the chain adds: fitted over recent fetches
	// (FitSamples of them), the seed before any.
	FixedSeconds       float64 `json:"fixed_seconds"`
	PerBlockSeconds    float64 `json:"per_block_seconds"`
	PerDoublingSeconds float64 `json:"per_doubling_seconds"`
	FitSamples         uint64  `json:"fit_samples"`
}

// Links returns the daemon's link estimates.
func (a *Client) Links(ctx context.Context) (Links, error) {
	r, err := a.rpc.ListLinks(ctx, &kvpoolv1.ListLinksRequest{})
	if err != nil {
		return Links{}, api.FromStatus(err)
	}
	out := Links{Node: r.GetNodeId(), Transport: r.GetTransport(), Links: []Link{}}
	for _, l := range r.GetLinks() {
		out.Links = append(out.Links, Link{Peer: l.GetPeer(), BytesPerSecond: l.GetBytesPerSecond(), RTTSeconds: l.GetRttSeconds(),
			BandwidthSamples: l.GetBandwidthSamples(), RTTSamples: l.GetRttSamples(), Bytes: l.GetBytes(), IdleSeconds: l.GetIdleSeconds(),
			FixedSeconds: l.GetFixedSeconds(), PerBlockSeconds: l.GetPerBlockSeconds(),
			PerDoublingSeconds: l.GetPerDoublingSeconds(), FitSamples: l.GetFitSamples()})
	}
	return out, nil
}

// Policy is how a tenant's blocks are kept on every node.
type Policy struct {
	Tenant string `json:"tenant"`
	// Kind is lru, lfu, fifo, ttl or prefix-lru.
	Kind string `json:"policy"`
	// QuotaBytes is the per-node cap and guarantee; 0 means none.
	QuotaBytes int64 `json:"quota_bytes"`
	// High and Low are fractions of the quota: past High the tenant evicts
	// down to Low (0: the defaults).
	High float64 `json:"high_watermark"`
	Low  float64 `json:"low_watermark"`
	// DefaultTTLSeconds expires blocks this long after they are stored; 0
	// never.
	DefaultTTLSeconds float64 `json:"default_ttl_seconds"`
	// NoDisk keeps the tenant's blocks off the nodes' disk tiers;
	// DiskAdmitReads is how many reads in memory copy a block to disk (0:
	// the default, 2); DiskQuotaBytes caps the tenant on one node's disk
	// (0: none).
	NoDisk         bool  `json:"no_disk,omitempty"`
	DiskAdmitReads int   `json:"disk_admit_reads,omitempty"`
	DiskQuotaBytes int64 `json:"disk_quota_bytes,omitempty"`
	// StoredUnixMs is when SetPolicy stored it (SetPolicy's answer only).
	StoredUnixMs int64 `json:"stored_unix_ms,omitempty"`
}

func (p Policy) proto() *kvpoolv1.TenantPolicy {
	return &kvpoolv1.TenantPolicy{Tenant: p.Tenant, Policy: p.Kind, QuotaBytes: p.QuotaBytes, HighWatermark: p.High,
		LowWatermark: p.Low, DefaultTtlSeconds: p.DefaultTTLSeconds,
		NoDisk: p.NoDisk, DiskAdmitReads: uint32(max(p.DiskAdmitReads, 0)), DiskQuotaBytes: p.DiskQuotaBytes}
}

func policyFromProto(p *kvpoolv1.TenantPolicy) Policy {
	return Policy{Tenant: p.GetTenant(), Kind: p.GetPolicy(), QuotaBytes: p.GetQuotaBytes(), High: p.GetHighWatermark(),
		Low: p.GetLowWatermark(), DefaultTTLSeconds: p.GetDefaultTtlSeconds(),
		NoDisk: p.GetNoDisk(), DiskAdmitReads: int(p.GetDiskAdmitReads()), DiskQuotaBytes: p.GetDiskQuotaBytes()}
}

// SetPolicy stores p; every daemon applies it within a second. It returns
// the policy as stored (defaults filled, StoredUnixMs set).
func (a *Client) SetPolicy(ctx context.Context, p Policy) (Policy, error) {
	r, err := a.rpc.SetPolicy(ctx, &kvpoolv1.SetPolicyRequest{Policy: p.proto()})
	if err != nil {
		return Policy{}, api.FromStatus(err)
	}
	out := policyFromProto(r.GetPolicy())
	out.StoredUnixMs = r.GetStoredUnixMs()
	return out, nil
}

// Policy returns tenant's stored policy; api.ErrNotFound when it has none.
func (a *Client) Policy(ctx context.Context, tenant string) (Policy, error) {
	r, err := a.rpc.GetPolicy(ctx, &kvpoolv1.GetPolicyRequest{Tenant: tenant})
	if err != nil {
		return Policy{}, api.FromStatus(err)
	}
	return policyFromProto(r.GetPolicy()), nil
}

// Policies lists every stored policy, by tenant.
func (a *Client) Policies(ctx context.Context) ([]Policy, error) {
	r, err := a.rpc.ListPolicies(ctx, &kvpoolv1.ListPoliciesRequest{})
	if err != nil {
		return nil, api.FromStatus(err)
	}
	out := []Policy{}
	for _, p := range r.GetPolicies() {
		out = append(out, policyFromProto(p))
	}
	return out, nil
}

// DeletePolicy deletes tenant's policy: its blocks fall back to the
// nodes' defaults.
func (a *Client) DeletePolicy(ctx context.Context, tenant string) error {
	_, err := a.rpc.DeletePolicy(ctx, &kvpoolv1.DeletePolicyRequest{Tenant: tenant})
	return api.FromStatus(err)
}

// DrainReport is what a node's drain did (see Client.Drain).
type DrainReport struct {
	NodeID string `json:"node_id"`
	// Blocks and Bytes were in the node's memory when the drain began.
	Blocks uint64 `json:"blocks"`
	Bytes  uint64 `json:"bytes"`
	// ReplicatedBlocks were already held by another live node.
	ReplicatedBlocks uint64 `json:"replicated_blocks"`
	// HandedOffBlocks were pulled by peers that lacked them.
	HandedOffBlocks uint64 `json:"handed_off_blocks"`
	HandedOffBytes  uint64 `json:"handed_off_bytes"`
	// KeptBlocks were still only on the node when the drain ended, and
	// left with it; LeasedKeptBlocks of them under a read lease.
	KeptBlocks       uint64 `json:"kept_blocks"`
	LeasedKeptBlocks uint64 `json:"leased_kept_blocks"`
	// PeerBlocks is how many blocks each peer pulled.
	PeerBlocks       map[string]uint64 `json:"peer_blocks"`
	HandOffSeconds   float64           `json:"hand_off_seconds"`
	LeaseWaitSeconds float64           `json:"lease_wait_seconds"`
	TookSeconds      float64           `json:"took_seconds"`
	// Errors are why blocks were not handed off, each reason once.
	Errors []string `json:"errors,omitempty"`
}

// Drain drains the node the client is connected to, which must be node:
// it stops taking blocks and leases, hands what only it holds to its
// peers, waits for leases, within budget (0: the node's own), and then
// stops. The call returns when the drain has ended, with its report.
func (a *Client) Drain(ctx context.Context, node string, budget time.Duration) (DrainReport, error) {
	r, err := a.rpc.Drain(ctx, &kvpoolv1.DrainRequest{NodeId: node, BudgetSeconds: budget.Seconds()})
	if err != nil {
		return DrainReport{}, api.FromStatus(err)
	}
	return DrainReport{NodeID: r.GetNodeId(), Blocks: r.GetBlocks(), Bytes: r.GetBytes(), ReplicatedBlocks: r.GetReplicatedBlocks(),
		HandedOffBlocks: r.GetHandedOffBlocks(), HandedOffBytes: r.GetHandedOffBytes(), KeptBlocks: r.GetKeptBlocks(),
		LeasedKeptBlocks: r.GetLeasedKeptBlocks(), PeerBlocks: r.GetPeerBlocks(), HandOffSeconds: r.GetHandOffSeconds(),
		LeaseWaitSeconds: r.GetLeaseWaitSeconds(), TookSeconds: r.GetTookSeconds(), Errors: r.GetErrors()}, nil
}
