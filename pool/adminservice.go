package pool

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer"
)

// The AdminService's handlers: the cluster as the node's mirror and gossip
// see it, its links, and tenant policies. They return Go errors; the
// interceptors map them to gRPC codes once.

// adminView is what the admin service reads of the cluster. *cluster
// implements it; nil means the node runs standalone.
type adminView interface {
	Nodes() []metadata.NodeInfo
	Peers() []metadata.Peer
	Locate(tenant, namespace string, chain [][]byte) metadata.LocateResult
	Blocks(node string, limit int) []metadata.Record
	Stats() (metadata.MirrorStats, metadata.MemberStats)
}

// linkEstimates are the node's measured links. *transfer.Links implements
// it.
type linkEstimates interface {
	All(now time.Time) []transfer.Estimate
	Estimate(peer string, now time.Time) transfer.Estimate
}

// policyStore keeps tenant policies. The node's policies implements it.
type policyStore interface {
	Set(ctx context.Context, tenant string, cfg eviction.TenantConfig) error
	Delete(ctx context.Context, tenant string) error
	List(ctx context.Context) (map[string]eviction.TenantConfig, error)
}

// adminService implements kvpoolv1.AdminServiceServer.
type adminService struct {
	kvpoolv1.UnimplementedAdminServiceServer
	self      string
	transport string
	cluster   adminView // nil: standalone
	links     linkEstimates
	tenants   interface{ TenantStats() []store.TenantStats }
	policies  policyStore
	// gpu is what a node's engines hold in GPU memory, as this daemon
	// knows it; nil: nothing known.
	gpu func(node, tenant, namespace string, chain [][]byte) (blocks int, followed bool)
	// drainer drains the node; the node implements it.
	drainer interface {
		Drain(ctx context.Context, budget time.Duration) (DrainReport, error)
	}
	now func() time.Time
}

var _ kvpoolv1.AdminServiceServer = (*adminService)(nil)

func (a *adminService) view() (adminView, error) {
	if a.cluster == nil {
		return nil, api.Errorf(api.ErrFailedPrecondition, "pool: node %s runs standalone, without etcd", a.self)
	}
	return a.cluster, nil
}

func (a *adminService) ListNodes(context.Context, *kvpoolv1.ListNodesRequest) (*kvpoolv1.ListNodesResponse, error) {
	c, err := a.view()
	if err != nil {
		return nil, err
	}
	peers := map[string]metadata.Peer{}
	for _, p := range c.Peers() {
		peers[p.ID] = p
	}
	out := &kvpoolv1.ListNodesResponse{AnsweredBy: a.self}
	seen := map[string]bool{}
	for _, ni := range c.Nodes() {
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
	slices.SortFunc(out.Nodes, func(x, y *kvpoolv1.NodeStatus) int { return strings.Compare(x.NodeId, y.NodeId) })
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
	c, err := a.view()
	if err != nil {
		return nil, err
	}
	if err := api.ValidateChain(req.GetTenant(), req.GetNamespace(), req.GetKeys()); err != nil {
		return nil, err
	}
	r := c.Locate(req.GetTenant(), req.GetNamespace(), req.GetKeys())
	out := &kvpoolv1.ClusterLocateResponse{
		ChainBlocks: uint32(r.ChainBlocks), DeepestBlocks: uint32(r.Deepest), DeepestNodes: r.DeepestNodes,
		PoolPrefixBlocks: uint32(r.PoolPrefix), AnsweredBy: a.self,
	}
	for _, np := range r.Nodes {
		p := &kvpoolv1.NodePrefix{NodeId: np.Node, PrefixBlocks: uint32(np.Blocks)}
		if a.gpu != nil {
			gpu, followed := a.gpu(np.Node, req.GetTenant(), req.GetNamespace(), req.GetKeys())
			p.GpuPrefixBlocks, p.GpuFollowed = uint32(gpu), followed
		}
		out.Nodes = append(out.Nodes, p)
	}
	return out, nil
}

func (a *adminService) ListBlocks(_ context.Context, req *kvpoolv1.ListBlocksRequest) (*kvpoolv1.ListBlocksResponse, error) {
	c, err := a.view()
	if err != nil {
		return nil, err
	}
	if err := api.ValidateName("node id", req.GetNodeId()); err != nil {
		return nil, err
	}
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = 1000
	}
	out := &kvpoolv1.ListBlocksResponse{}
	found := false
	for _, ni := range c.Nodes() {
		if ni.Record.ID == req.GetNodeId() {
			out.Total, found = uint64(ni.Blocks), true
		}
	}
	if !found {
		return nil, api.Errorf(api.ErrNotFound, "pool: no node %q in the cluster", req.GetNodeId())
	}
	recs := c.Blocks(req.GetNodeId(), limit)
	slices.SortFunc(recs, func(x, y metadata.Record) int {
		return cmp.Or(strings.Compare(x.Tenant, y.Tenant), strings.Compare(x.Namespace, y.Namespace), strings.Compare(x.Key, y.Key))
	})
	for _, r := range recs {
		out.Blocks = append(out.Blocks, &kvpoolv1.BlockRef{Tenant: r.Tenant, Namespace: r.Namespace, Key: []byte(r.Key)})
	}
	return out, nil
}

func (a *adminService) ClusterStats(ctx context.Context, _ *kvpoolv1.ClusterStatsRequest) (*kvpoolv1.ClusterStatsResponse, error) {
	c, err := a.view()
	if err != nil {
		return nil, err
	}
	nodes, err := a.ListNodes(ctx, nil)
	if err != nil {
		return nil, err
	}
	ms, mb := c.Stats()
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
		AnsweredBy:           a.self,
		Tenants:              tenantStatsProto(a.tenants.TenantStats(), func(string) bool { return true }),
	}
	for _, ns := range nodes.Nodes {
		if ns.GossipState == "alive" {
			out.LiveNodes++
		}
		out.CapacityBytes += ns.CapacityBytes
		out.UsedBytes += ns.UsedBytes
		out.StoredBlocks += ns.StoredBlocks
	}
	return out, nil
}

func (a *adminService) ListLinks(context.Context, *kvpoolv1.ListLinksRequest) (*kvpoolv1.ListLinksResponse, error) {
	now := a.now()
	out := &kvpoolv1.ListLinksResponse{NodeId: a.self, Transport: a.transport}
	known := map[string]bool{}
	for _, e := range a.links.All(now) {
		known[e.Peer] = true
		out.Links = append(out.Links, linkStatus(e, now))
	}
	// Peers never pulled from show their seeds.
	if a.cluster != nil {
		for _, ni := range a.cluster.Nodes() {
			if id := ni.Record.ID; id != a.self && !known[id] {
				out.Links = append(out.Links, linkStatus(a.links.Estimate(id, now), now))
			}
		}
	}
	slices.SortFunc(out.Links, func(x, y *kvpoolv1.LinkStatus) int { return strings.Compare(x.Peer, y.Peer) })
	return out, nil
}

func linkStatus(e transfer.Estimate, now time.Time) *kvpoolv1.LinkStatus {
	idle := -1.0
	if !e.Updated.IsZero() {
		idle = now.Sub(e.Updated).Seconds()
	}
	return &kvpoolv1.LinkStatus{Peer: e.Peer, BytesPerSecond: e.BytesPerSecond, RttSeconds: e.RTT.Seconds(),
		BandwidthSamples: uint64(e.Samples), RttSamples: uint64(e.RTTSamples), Bytes: uint64(e.Bytes), IdleSeconds: idle,
		FixedSeconds: e.Fixed.Seconds(), PerBlockSeconds: e.PerBlock.Seconds(), PerDoublingSeconds: e.PerDoubling.Seconds(), FitSamples: uint64(e.FitSamples)}
}

func (a *adminService) SetPolicy(ctx context.Context, req *kvpoolv1.SetPolicyRequest) (*kvpoolv1.SetPolicyResponse, error) {
	tenant, cfg, err := tenantConfigFromProto(req.GetPolicy())
	if err != nil {
		return nil, err
	}
	if err := a.policies.Set(ctx, tenant, cfg); err != nil {
		return nil, err
	}
	return &kvpoolv1.SetPolicyResponse{Policy: tenantPolicyProto(tenant, cfg), StoredUnixMs: a.now().UnixMilli()}, nil
}

func (a *adminService) GetPolicy(ctx context.Context, req *kvpoolv1.GetPolicyRequest) (*kvpoolv1.GetPolicyResponse, error) {
	if err := api.ValidateName("tenant", req.GetTenant()); err != nil {
		return nil, err
	}
	all, err := a.policies.List(ctx)
	if err != nil {
		return nil, err
	}
	cfg, ok := all[req.GetTenant()]
	if !ok {
		return nil, api.Errorf(api.ErrNotFound, "pool: no policy for tenant %s; it gets the node's default", req.GetTenant())
	}
	return &kvpoolv1.GetPolicyResponse{Policy: tenantPolicyProto(req.GetTenant(), cfg)}, nil
}

func (a *adminService) ListPolicies(ctx context.Context, _ *kvpoolv1.ListPoliciesRequest) (*kvpoolv1.ListPoliciesResponse, error) {
	all, err := a.policies.List(ctx)
	if err != nil {
		return nil, err
	}
	out := &kvpoolv1.ListPoliciesResponse{}
	for _, tenant := range slices.Sorted(maps.Keys(all)) {
		out.Policies = append(out.Policies, tenantPolicyProto(tenant, all[tenant]))
	}
	return out, nil
}

func (a *adminService) DeletePolicy(ctx context.Context, req *kvpoolv1.DeletePolicyRequest) (*kvpoolv1.DeletePolicyResponse, error) {
	if err := api.ValidateName("tenant", req.GetTenant()); err != nil {
		return nil, err
	}
	if err := a.policies.Delete(ctx, req.GetTenant()); err != nil {
		return nil, err
	}
	return &kvpoolv1.DeletePolicyResponse{}, nil
}

func (a *adminService) Drain(ctx context.Context, req *kvpoolv1.DrainRequest) (*kvpoolv1.DrainResponse, error) {
	if req.GetNodeId() != a.self {
		return nil, api.Errorf(api.ErrFailedPrecondition, "pool: this is node %q, not %q: ask that node to drain", a.self, req.GetNodeId())
	}
	b := req.GetBudgetSeconds()
	if !(b >= 0) || b > (100*365*24*time.Hour).Seconds() {
		return nil, api.Errorf(api.ErrInvalidArgument, "pool: drain budget %v s: want ≥ 0 (0: the node's --drain-budget)", b)
	}
	rep, err := a.drainer.Drain(ctx, time.Duration(b*float64(time.Second)))
	if err != nil {
		return nil, err
	}
	out := &kvpoolv1.DrainResponse{
		NodeId: a.self, Blocks: uint64(rep.Blocks), Bytes: uint64(rep.Bytes), ReplicatedBlocks: uint64(rep.Replicated),
		HandedOffBlocks: uint64(rep.HandedOff), HandedOffBytes: uint64(rep.HandedOffBytes), KeptBlocks: uint64(rep.Kept),
		LeasedKeptBlocks: uint64(rep.LeasedKept), PeerBlocks: map[string]uint64{}, HandOffSeconds: rep.HandOff.Seconds(),
		LeaseWaitSeconds: rep.LeaseWait.Seconds(), TookSeconds: rep.Took.Seconds(), Errors: rep.Errors,
	}
	for id, k := range rep.PeerBlocks {
		out.PeerBlocks[id] = uint64(k)
	}
	return out, nil
}
