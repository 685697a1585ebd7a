package pool

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer/cost"
)

// MaxBatchBytes bounds the values of one BatchPut or BatchGet call.
const MaxBatchBytes = 64 << 20

// The KVPoolService's handlers. They return Go errors, wrapping the api
// sentinels; the interceptors (metrics.go) turn them into gRPC codes once,
// through api.ToStatus.

// blockWriter stores blocks: two-phase (Reserve, then Commit or Abort) or
// in one step. *store.Store implements it.
type blockWriter interface {
	Reserve(tenant, ns, key []byte, size int64, serverOwned bool) (*store.Reservation, error)
	Commit(r *store.Reservation, crc uint32, haveCRC bool, want uint32, haveWant bool) (store.CommitResult, error)
	Abort(r *store.Reservation)
	PutBytes(tenant, ns, key, value []byte, want uint32, haveWant bool) (store.CommitResult, error)
}

// blockReader pins blocks for reading and leases them. *store.Store implements
// it.
type blockReader interface {
	Acquire(tenant, ns, key []byte) (store.Pin, error)
	Release(p store.Pin)
	Lease(tenant, ns []byte, keys [][]byte, d time.Duration) (int, time.Time, error)
}

// blockIndex answers what the node holds and removes blocks. *store.Store
// implements it.
type blockIndex interface {
	Exists(tenant, ns []byte, keys [][]byte) ([]bool, error)
	Locate(tenant, ns []byte, chain [][]byte) (int, error)
	RemoveForce(tenant, ns, key []byte, force bool) error
}

// usageReporter reports the store's usage. *store.Store implements it.
type usageReporter interface {
	Stats() store.Stats
	TenantStats() []store.TenantStats
	LeasedBlocks(now time.Time) int
}

// kvStore is all the KV service asks of the store.
type kvStore interface {
	blockWriter
	blockReader
	blockIndex
	usageReporter
}

// chainFetcher makes blocks local by pulling them from peers, and says
// where blocks are. The node's fetcher implements it.
type chainFetcher interface {
	// Fetch calls answer, when not nil, with the results as soon as they
	// are final, and returns them after its bookkeeping.
	Fetch(ctx context.Context, tenant, namespace string, keys [][]byte, timeout time.Duration, answer func([]api.FetchResult)) ([]api.FetchResult, error)
	// ReportCallOverhead takes a caller's report of how much longer its
	// previous Fetch, of blocks keys (0: not said), took than the node's
	// own timing of it; a report of 0 (the caller does not know) is
	// ignored.
	ReportCallOverhead(d time.Duration, blocks int)
	Route(tenant, namespace string, keys [][]byte) ([][]api.Holder, error)
}

// replicator places copies of a committed block on other nodes. The
// node's fetcher implements it.
type replicator interface {
	Replicate(ctx context.Context, tenant, namespace, key []byte, copies int) ([]string, error)
}

// queryPlanner answers fetch-or-recompute questions. The node's planner
// implements it.
type queryPlanner interface {
	Plan(q PlanQuery) (PlanAnswer, error)
}

// loadReporter records what the local engine reports. The node's
// engineLoad implements it.
type loadReporter interface {
	Report(queueSeconds, prefillTokensPerSecond float64, promptTokens uint64, model string) error
}

// leaseLimits turn a caller's lease request into a length.
type leaseLimits struct{ def, max time.Duration }

// of is ms capped by the maximum when given, the default when only asked
// for; 0 means no lease.
func (l leaseLimits) of(ms uint32, asked bool) time.Duration {
	if ms == 0 && asked {
		return l.def
	}
	return min(time.Duration(ms)*time.Millisecond, l.max)
}

// kvService implements kvpoolv1.KVPoolServiceServer.
type kvService struct {
	kvpoolv1.UnimplementedKVPoolServiceServer
	info     *kvpoolv1.InfoResponse
	store    kvStore
	leases   leaseLimits
	fetch    chainFetcher
	replicas replicator
	plan     queryPlanner
	engine   loadReporter
	// caches are this node's engines' GPU caches (nil when it follows
	// none), served to peers until stopping closes; gpu answers Locate's
	// GPU prefix.
	caches   engineCaches
	gpu      gpuPrefixer
	stopping <-chan struct{}
	// tasks runs a Put stream's receiver, so shutdown waits for it.
	tasks              *tasks
	reservationTimeout time.Duration
	getChunkBytes      int
	memoryLocked       bool
	now                func() time.Time
}

var _ kvpoolv1.KVPoolServiceServer = (*kvService)(nil)

func keyParts(k *kvpoolv1.BlockKey) (tenant, ns, key []byte) {
	if k == nil {
		return nil, nil, nil
	}
	return []byte(k.GetTenant()), []byte(k.GetNamespace()), k.GetKey()
}

func (s *kvService) Put(stream kvpoolv1.KVPoolService_PutServer) error {
	resp, err := s.put(stream)
	if err != nil {
		return err
	}
	return stream.SendAndClose(resp)
}

// put receives the header and chunks. Receiving runs in its own goroutine
// so the handler can give up when the reservation's deadline passes even
// if the client stalls mid-stream; the handler alone writes the arena, and
// it aborts the reservation on every failure.
func (s *kvService) put(stream kvpoolv1.KVPoolService_PutServer) (*kvpoolv1.PutResponse, error) {
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil, api.Errorf(api.ErrInvalidArgument, "pool: a put stream must start with a header; it carried no message")
	}
	if err != nil {
		return nil, err
	}
	h := first.GetHeader()
	if h == nil {
		return nil, api.Errorf(api.ErrInvalidArgument, "pool: a put stream must start with a header")
	}
	tenant, ns, key := keyParts(h.GetKey())
	if h.GetSizeBytes() > 1<<62 {
		return nil, api.Errorf(api.ErrInvalidArgument, "pool: value size %d", h.GetSizeBytes())
	}
	res, err := s.store.Reserve(tenant, ns, key, int64(h.GetSizeBytes()), true)
	if err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		if !committed {
			s.store.Abort(res)
		}
	}()

	type msg struct {
		m   *kvpoolv1.PutRequest
		err error
	}
	msgs := make(chan msg)
	done := make(chan struct{})
	defer close(done)
	if !s.tasks.Go(func() {
		for {
			m, err := stream.Recv()
			select {
			case msgs <- msg{m, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}) {
		return nil, api.Errorf(api.ErrUnavailable, "pool: the node is shutting down")
	}
	deadline := time.NewTimer(s.reservationTimeout)
	defer deadline.Stop()

	mem := res.Bytes()
	var off int
	var crc uint32
	for {
		var m msg
		select {
		case m = <-msgs:
		case <-deadline.C:
			return nil, api.Errorf(api.ErrFailedPrecondition, "pool: put of %d bytes not finished within the reservation timeout of %v", len(mem), s.reservationTimeout)
		case <-stream.Context().Done():
			return nil, stream.Context().Err()
		}
		if errors.Is(m.err, io.EOF) {
			break
		}
		if m.err != nil {
			return nil, m.err
		}
		chunk := m.m.GetChunk()
		if m.m.GetHeader() != nil {
			return nil, api.Errorf(api.ErrInvalidArgument, "pool: a second header in one put stream")
		}
		if len(chunk) > len(mem)-off {
			return nil, api.Errorf(api.ErrInvalidArgument, "pool: the stream carries more than the %d bytes its header declares", len(mem))
		}
		copy(mem[off:], chunk)
		crc = api.UpdateChecksum(crc, chunk)
		off += len(chunk)
	}
	if off != len(mem) {
		return nil, api.Errorf(api.ErrInvalidArgument, "pool: the stream carried %d bytes, its header declares %d", off, len(mem))
	}
	committed = true
	cr, err := s.store.Commit(res, crc, true, h.GetCrc32C(), h.Crc32C != nil)
	if err != nil {
		return nil, err
	}
	nodes := []string{s.info.GetNodeId()}
	if h.GetReplicas() > 1 {
		if nodes, err = s.replicas.Replicate(stream.Context(), tenant, ns, key, int(h.GetReplicas())); err != nil {
			return nil, err
		}
	}
	return &kvpoolv1.PutResponse{Existed: cr.Existed, Crc32C: cr.CRC, ReplicaNodes: nodes}, nil
}

func (s *kvService) Get(req *kvpoolv1.GetRequest, stream kvpoolv1.KVPoolService_GetServer) error {
	tenant, ns, key := keyParts(req.GetKey())
	pin, err := s.store.Acquire(tenant, ns, key)
	if err != nil {
		return err
	}
	defer s.store.Release(pin)
	if d := s.leases.of(req.GetLeaseMs(), req.GetLease()); d > 0 {
		s.store.Lease(tenant, ns, [][]byte{key}, d)
	}
	chunk := s.getChunkBytes
	if c := int(req.GetChunkBytes()); c != 0 {
		chunk = min(max(c, 4<<10), 4<<20)
	}
	if err := stream.Send(&kvpoolv1.GetResponse{Msg: &kvpoolv1.GetResponse_Info{Info: &kvpoolv1.BlockInfo{SizeBytes: uint64(len(pin.Mem)), Crc32C: pin.CRC}}}); err != nil {
		return err
	}
	// Send marshals the message before it returns, so the pin may be
	// released once the last Send is done.
	for off := 0; off < len(pin.Mem); off += chunk {
		end := min(off+chunk, len(pin.Mem))
		if err := stream.Send(&kvpoolv1.GetResponse{Msg: &kvpoolv1.GetResponse_Chunk{Chunk: pin.Mem[off:end]}}); err != nil {
			return err
		}
	}
	return nil
}

func (s *kvService) BatchPut(_ context.Context, req *kvpoolv1.BatchPutRequest) (*kvpoolv1.BatchPutResponse, error) {
	total := 0
	for _, it := range req.GetItems() {
		total += len(it.GetValue())
	}
	if total > MaxBatchBytes {
		return nil, api.Errorf(api.ErrInvalidArgument, "pool: batch of %d bytes exceeds %d; split it", total, MaxBatchBytes)
	}
	out := &kvpoolv1.BatchPutResponse{Results: make([]*kvpoolv1.BatchPutResult, len(req.GetItems()))}
	for i, it := range req.GetItems() {
		tenant, ns, key := keyParts(it.GetKey())
		cr, err := s.store.PutBytes(tenant, ns, key, it.GetValue(), it.GetCrc32C(), it.Crc32C != nil)
		out.Results[i] = &kvpoolv1.BatchPutResult{Status: itemStatus(err), Existed: cr.Existed, Crc32C: cr.CRC}
	}
	return out, nil
}

// itemStatus is one item's outcome inside a batch answer, through the one
// table (api.Code).
func itemStatus(err error) *kvpoolv1.ItemStatus {
	if err == nil {
		return &kvpoolv1.ItemStatus{}
	}
	return &kvpoolv1.ItemStatus{Code: int32(api.Code(err)), Message: err.Error()}
}

func (s *kvService) BatchGet(_ context.Context, req *kvpoolv1.BatchGetRequest) (*kvpoolv1.BatchGetResponse, error) {
	tenant, ns := []byte(req.GetTenant()), []byte(req.GetNamespace())
	out := &kvpoolv1.BatchGetResponse{Results: make([]*kvpoolv1.BatchGetResult, len(req.GetKeys()))}
	total := 0
	for i, key := range req.GetKeys() {
		pin, err := s.store.Acquire(tenant, ns, key)
		if err != nil {
			out.Results[i] = &kvpoolv1.BatchGetResult{Status: itemStatus(err)}
			continue
		}
		total += len(pin.Mem)
		if total > MaxBatchBytes {
			s.store.Release(pin)
			return nil, api.Errorf(api.ErrInvalidArgument, "pool: batch reply exceeds %d bytes; ask for fewer keys", MaxBatchBytes)
		}
		out.Results[i] = &kvpoolv1.BatchGetResult{Status: &kvpoolv1.ItemStatus{}, Value: bytes.Clone(pin.Mem), Crc32C: pin.CRC}
		s.store.Release(pin)
	}
	return out, nil
}

func (s *kvService) Exists(_ context.Context, req *kvpoolv1.ExistsRequest) (*kvpoolv1.ExistsResponse, error) {
	ex, err := s.store.Exists([]byte(req.GetTenant()), []byte(req.GetNamespace()), req.GetKeys())
	if err != nil {
		return nil, err
	}
	return &kvpoolv1.ExistsResponse{Exists: ex}, nil
}

func (s *kvService) Locate(_ context.Context, req *kvpoolv1.LocateRequest) (*kvpoolv1.LocateResponse, error) {
	tenant, ns := []byte(req.GetTenant()), []byte(req.GetNamespace())
	var memory, k int
	var err error
	if t, ok := s.store.(diskPrefixer); ok {
		memory, k, err = t.Prefix(tenant, ns, req.GetKeys())
	} else {
		k, err = s.store.Locate(tenant, ns, req.GetKeys())
		memory = k
	}
	if err != nil {
		return nil, err
	}
	out := &kvpoolv1.LocateResponse{PrefixBlocks: uint32(k), MemoryPrefixBlocks: uint32(memory), NodeId: s.info.GetNodeId()}
	if s.gpu != nil {
		out.GpuPrefixBlocks = uint32(s.gpu.Prefix(req.GetTenant(), req.GetNamespace(), req.GetKeys()))
	}
	if d := s.leases.of(req.GetLeaseMs(), req.GetLease()); d > 0 && k > 0 {
		_, until, err := s.store.Lease(tenant, ns, req.GetKeys()[:k], d)
		if err != nil {
			return nil, err
		}
		out.LeaseUntilUnixMs = until.UnixMilli()
	}
	return out, nil
}

// WatchEngineCaches streams this node's engines' GPU caches to a peer.
func (s *kvService) WatchEngineCaches(_ *kvpoolv1.WatchEngineCachesRequest, stream kvpoolv1.KVPoolService_WatchEngineCachesServer) error {
	return watchEngineCaches(s.caches, s.info.GetNodeId(), s.stopping, stream)
}

func (s *kvService) Remove(_ context.Context, req *kvpoolv1.RemoveRequest) (*kvpoolv1.RemoveResponse, error) {
	tenant, ns, key := keyParts(req.GetKey())
	if err := s.store.RemoveForce(tenant, ns, key, req.GetForce()); err != nil {
		return nil, err
	}
	return &kvpoolv1.RemoveResponse{}, nil
}

// A tenant sees the node's totals and only its own namespaces and tenant
// row; every other caller sees every tenant's.
func (s *kvService) Stats(ctx context.Context, _ *kvpoolv1.StatsRequest) (*kvpoolv1.StatsResponse, error) {
	st := s.store.Stats()
	caller := callerOf(ctx)
	mine := func(tenant string) bool { return caller.Role != auth.RoleTenant || tenant == caller.Tenant }
	out := &kvpoolv1.StatsResponse{
		NodeId:                s.info.GetNodeId(),
		CapacityBytes:         st.CapacityBytes,
		UsedBytes:             st.UsedBytes,
		FreeBytes:             st.FreeBytes,
		StoredBytes:           st.StoredBytes,
		Blocks:                st.Blocks,
		Reservations:          st.Reservations,
		ReservedBytes:         st.ReservedBytes,
		PageBytes:             st.PageBytes,
		LargestFreeBytes:      st.LargestFreeBytes,
		ExternalFragmentation: st.ExternalFragmentation,
		InternalFragmentation: st.InternalFragmentation,
		MemoryLocked:          s.memoryLocked,
		Tenants:               tenantStatsProto(s.store.TenantStats(), mine),
		LeasedBlocks:          uint64(s.store.LeasedBlocks(s.now())),
		Pins:                  st.Pins,
	}
	for _, ns := range st.Namespaces {
		if mine(ns.Tenant) {
			out.Namespaces = append(out.Namespaces, &kvpoolv1.NamespaceStats{Tenant: ns.Tenant, Namespace: ns.Namespace, Blocks: ns.Blocks, StoredBytes: ns.StoredBytes})
		}
	}
	return out, nil
}

func tenantStatsProto(ts []store.TenantStats, keep func(tenant string) bool) []*kvpoolv1.TenantStats {
	var out []*kvpoolv1.TenantStats
	for _, t := range ts {
		if !keep(t.Tenant) {
			continue
		}
		p := &kvpoolv1.TenantStats{
			Tenant: t.Tenant, Policy: t.Config.Policy.String(), QuotaBytes: t.Config.QuotaBytes,
			StoredBytes: uint64(t.StoredBytes), Blocks: uint64(t.Blocks), Hits: t.Hits, Misses: t.Misses,
			QuotaEvictions: t.QuotaEvictions, PressureEvictions: t.PressureEvictions, Expirations: t.Expirations, Rejected: t.Rejected,
		}
		if !t.PolicyApplied.IsZero() {
			p.PolicyAppliedUnixMs = t.PolicyApplied.UnixMilli()
		}
		out = append(out, p)
	}
	return out
}

func (s *kvService) Info(context.Context, *kvpoolv1.InfoRequest) (*kvpoolv1.InfoResponse, error) {
	return s.info, nil
}

// ReportLoad records the local engine's queue time and prefill speed; the
// node plans with them and gossips them.
func (s *kvService) ReportLoad(_ context.Context, req *kvpoolv1.ReportLoadRequest) (*kvpoolv1.ReportLoadResponse, error) {
	if err := s.engine.Report(req.GetQueueSeconds(), req.GetPrefillTokensPerSecond(), req.GetPrefillPromptTokens(), req.GetModel()); err != nil {
		return nil, err
	}
	return &kvpoolv1.ReportLoadResponse{}, nil
}

func (s *kvService) Fetch(ctx context.Context, req *kvpoolv1.FetchRequest) (*kvpoolv1.FetchResponse, error) {
	s.fetch.ReportCallOverhead(overheadFromMicros(req.GetPreviousCallOverheadUs()), int(req.GetPreviousCallBlocks()))
	res, err := s.fetch.Fetch(ctx, req.GetTenant(), req.GetNamespace(), req.GetKeys(), time.Duration(req.GetTimeoutMs())*time.Millisecond, nil)
	if err != nil {
		return nil, err
	}
	out := &kvpoolv1.FetchResponse{Results: make([]*kvpoolv1.FetchResult, len(res))}
	for i, r := range res {
		out.Results[i] = &kvpoolv1.FetchResult{SourceNode: r.Source, Status: itemStatus(r.Err), SizeBytes: uint64(r.Size), FetchSeconds: r.Took.Seconds()}
		out.FetchedBytes += uint64(r.Size)
	}
	return out, nil
}

func (s *kvService) Route(_ context.Context, req *kvpoolv1.RouteRequest) (*kvpoolv1.RouteResponse, error) {
	routes, err := s.fetch.Route(req.GetTenant(), req.GetNamespace(), req.GetKeys())
	if err != nil {
		return nil, err
	}
	out := &kvpoolv1.RouteResponse{NodeId: s.info.GetNodeId(), Blocks: make([]*kvpoolv1.BlockRoute, len(routes))}
	for i, hs := range routes {
		br := &kvpoolv1.BlockRoute{}
		for _, h := range hs {
			br.Holders = append(br.Holders, &kvpoolv1.Holder{NodeId: h.NodeID, Addr: h.Addr, BytesPerSecond: h.BytesPerSecond, RttMicros: h.RTTMicros})
		}
		out.Blocks[i] = br
	}
	return out, nil
}

func planQuery(tenant, namespace string, keys [][]byte, model string, blockTokens uint32, promptTokens uint64, link float64) (PlanQuery, error) {
	if promptTokens > 1<<30 {
		return PlanQuery{}, api.Errorf(api.ErrInvalidArgument, "pool: plan: prompt tokens %d: want at most 2^30", promptTokens)
	}
	return PlanQuery{Tenant: tenant, Namespace: namespace, Keys: keys, Model: model, BlockTokens: int(blockTokens),
		PromptTokens: int(promptTokens), LinkBytesPerSecond: link}, nil
}

func (s *kvService) Plan(_ context.Context, req *kvpoolv1.PlanRequest) (*kvpoolv1.PlanResponse, error) {
	q, err := planQuery(req.GetTenant(), req.GetNamespace(), req.GetKeys(), req.GetModel(), req.GetBlockTokens(), req.GetPromptTokens(), req.GetLinkBytesPerSecond())
	if err != nil {
		return nil, err
	}
	q.Candidates, q.Place = req.GetCandidates(), req.GetPlace()
	ans, err := s.plan.Plan(q)
	if err != nil {
		return nil, err
	}
	out := &kvpoolv1.PlanResponse{Summary: s.planSummary(&ans)}
	for i := range ans.Result.Nodes {
		out.Nodes = append(out.Nodes, nodePlanProto(&ans, &ans.Result.Nodes[i]))
	}
	return out, nil
}

// Estimate is Plan for one node (empty: this one).
func (s *kvService) Estimate(_ context.Context, req *kvpoolv1.EstimateRequest) (*kvpoolv1.EstimateResponse, error) {
	q, err := planQuery(req.GetTenant(), req.GetNamespace(), req.GetKeys(), req.GetModel(), req.GetBlockTokens(), req.GetPromptTokens(), req.GetLinkBytesPerSecond())
	if err != nil {
		return nil, err
	}
	q.Candidates = []string{cmp.Or(req.GetNodeId(), s.info.GetNodeId())}
	ans, err := s.plan.Plan(q)
	if err != nil {
		return nil, err
	}
	return &kvpoolv1.EstimateResponse{Summary: s.planSummary(&ans), Node: nodePlanProto(&ans, &ans.Result.Nodes[0])}, nil
}

func (s *kvService) planSummary(a *PlanAnswer) *kvpoolv1.PlanSummary {
	return &kvpoolv1.PlanSummary{
		AnsweredBy: s.info.GetNodeId(), Model: a.Model, KvBytesPerToken: a.KVBytesPerToken,
		BlockTokens: uint32(a.BlockTokens), ChainBlocks: uint32(a.ChainBlocks), PromptTokens: uint64(a.PromptTokens),
		ReferenceAccelerator: a.Reference, PrefillTokensPerSecond: a.PrefillTokensPerSecond,
		BreakevenBytesPerSecond: a.BreakevenBytesPerSecond,
	}
}

func nodePlanProto(a *PlanAnswer, np *cost.NodePlan) *kvpoolv1.NodePlan {
	info := a.Nodes[np.Node]
	return &kvpoolv1.NodePlan{
		NodeId: np.Node, Accelerator: info.Accelerator, PrefillTokensPerSecond: info.PrefillTokensPerSecond,
		QueueSeconds: np.Queue.Seconds(), LocalBlocks: uint32(np.LocalBlocks), GpuBlocks: uint32(np.GPUBlocks),
		LocalLoadSeconds: np.LocalLoad.Seconds(), DiskBlocks: uint32(np.DiskBlocks), PoolBlocks: uint32(np.PoolBlocks),
		Source: np.Source, LinkBytesPerSecond: np.Link.BytesPerSecond, LinkRttSeconds: np.Link.RTT.Seconds(),
		LinkMeasured: info.LinkMeasured, FetchBytes: np.FetchBytes, TransferSeconds: np.Transfer.Seconds(),
		RecomputeSeconds: np.Recompute.Seconds(), RemainderSeconds: np.Remainder.Seconds(),
		RecomputeTotalSeconds: np.RecomputeTotal.Seconds(), FetchTotalSeconds: np.FetchTotal.Seconds(),
		SplitBlocks: uint32(np.SplitBlocks), SplitTotalSeconds: np.SplitTotal.Seconds(),
		Plan: np.Plan.String(), TotalSeconds: np.Total.Seconds(), BreakevenBytesPerSecond: np.BreakevenBytesPerSecond,
	}
}
