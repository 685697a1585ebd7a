package api

import (
	"context"

	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// NodeStats is a node's usage and allocator state (Client.Stats). The
// JSON is the CLI's stable --json shape.
type NodeStats struct {
	NodeID           string `json:"node_id"`
	CapacityBytes    uint64 `json:"capacity_bytes"`
	UsedBytes        uint64 `json:"used_bytes"`
	FreeBytes        uint64 `json:"free_bytes"`
	StoredBytes      uint64 `json:"stored_bytes"`
	Blocks           uint64 `json:"blocks"`
	Reservations     uint64 `json:"reservations"`
	ReservedBytes    uint64 `json:"reserved_bytes"`
	PageBytes        uint64 `json:"page_bytes"`
	LargestFreeBytes uint64 `json:"largest_free_bytes"`
	// ExternalFragmentation is 1 - largest free run / free bytes;
	// InternalFragmentation 1 - stored bytes / bytes of their pages.
	ExternalFragmentation float64          `json:"external_fragmentation"`
	InternalFragmentation float64          `json:"internal_fragmentation"`
	MemoryLocked          bool             `json:"memory_locked"`
	Namespaces            []NamespaceStats `json:"namespaces"`
	Tenants               []TenantStats    `json:"tenants"`
	LeasedBlocks          uint64           `json:"leased_blocks"`
}

// NamespaceStats is the usage of one (tenant, namespace) on a node.
type NamespaceStats struct {
	Tenant      string `json:"tenant"`
	Namespace   string `json:"namespace"`
	Blocks      uint64 `json:"blocks"`
	StoredBytes uint64 `json:"stored_bytes"`
}

// TenantStats is one tenant's use of a node and what its policy did.
type TenantStats struct {
	Tenant            string `json:"tenant"`
	Policy            string `json:"policy"`
	QuotaBytes        int64  `json:"quota_bytes"` // 0: none
	StoredBytes       uint64 `json:"stored_bytes"`
	Blocks            uint64 `json:"blocks"`
	Hits              uint64 `json:"hits"`
	Misses            uint64 `json:"misses"`
	QuotaEvictions    uint64 `json:"quota_evictions"`
	PressureEvictions uint64 `json:"pressure_evictions"`
	Expirations       uint64 `json:"expirations"`
	Rejected          uint64 `json:"rejected"`
	// PolicyAppliedUnixMs is when the node last applied a policy change
	// for the tenant (0: never).
	PolicyAppliedUnixMs int64 `json:"policy_applied_unix_ms"`
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
		Namespaces: []NamespaceStats{}, Tenants: TenantsFromProto(st.GetTenants())}
	for _, ns := range st.GetNamespaces() {
		out.Namespaces = append(out.Namespaces, NamespaceStats{Tenant: ns.GetTenant(), Namespace: ns.GetNamespace(), Blocks: ns.GetBlocks(), StoredBytes: ns.GetStoredBytes()})
	}
	return out, nil
}

// TenantsFromProto converts the tenants a Stats or ClusterStats answer
// carries.
func TenantsFromProto(ts []*kvpoolv1.TenantStats) []TenantStats {
	out := []TenantStats{}
	for _, t := range ts {
		out = append(out, TenantStats{Tenant: t.GetTenant(), Policy: t.GetPolicy(), QuotaBytes: t.GetQuotaBytes(), StoredBytes: t.GetStoredBytes(),
			Blocks: t.GetBlocks(), Hits: t.GetHits(), Misses: t.GetMisses(), QuotaEvictions: t.GetQuotaEvictions(),
			PressureEvictions: t.GetPressureEvictions(), Expirations: t.GetExpirations(), Rejected: t.GetRejected(),
			PolicyAppliedUnixMs: t.GetPolicyAppliedUnixMs()})
	}
	return out
}
