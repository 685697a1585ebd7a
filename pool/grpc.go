package pool

import (
	"bytes"
	"context"
	"errors"
	"io"
	"time"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

// MaxBatchBytes bounds the values of one BatchPut or BatchGet call.
const MaxBatchBytes = 64 << 20

// grpcService implements kvpoolv1.KVPoolServiceServer over the Store. Every
// handler returns api errors through api.ToStatus, the one mapping to gRPC
// codes.
type grpcService struct {
	kvpoolv1.UnimplementedKVPoolServiceServer
	n *Node
}

var _ kvpoolv1.KVPoolServiceServer = (*grpcService)(nil)

func keyParts(k *kvpoolv1.BlockKey) (tenant, ns, key []byte) {
	if k == nil {
		return nil, nil, nil
	}
	return []byte(k.GetTenant()), []byte(k.GetNamespace()), k.GetKey()
}

func (g *grpcService) Put(stream kvpoolv1.KVPoolService_PutServer) error {
	resp, err := g.put(stream)
	if err != nil {
		return api.ToStatus(err)
	}
	return stream.SendAndClose(resp)
}

// put receives the header and chunks. Receiving runs in its own goroutine
// so the handler can give up when the reservation's deadline passes even
// if the client stalls mid-stream; the handler alone writes the arena, and
// it aborts the reservation on every failure.
func (g *grpcService) put(stream kvpoolv1.KVPoolService_PutServer) (*kvpoolv1.PutResponse, error) {
	first, err := stream.Recv()
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
	res, err := g.n.store.Reserve(tenant, ns, key, int64(h.GetSizeBytes()), true)
	if err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		if !committed {
			g.n.store.Abort(res)
		}
	}()

	type msg struct {
		m   *kvpoolv1.PutRequest
		err error
	}
	msgs := make(chan msg)
	done := make(chan struct{})
	defer close(done)
	g.n.wg.Go(func() {
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
	})
	deadline := time.NewTimer(g.n.cfg.ReservationTimeout)
	defer deadline.Stop()

	mem := res.Bytes()
	var off int
	var crc uint32
	for {
		var m msg
		select {
		case m = <-msgs:
		case <-deadline.C:
			return nil, api.Errorf(api.ErrFailedPrecondition, "pool: put of %d bytes not finished within the reservation timeout of %v", len(mem), g.n.cfg.ReservationTimeout)
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
	cr, err := g.n.store.Commit(res, crc, true, h.GetCrc32C(), h.Crc32C != nil)
	if err != nil {
		return nil, err
	}
	nodes := []string{g.n.cfg.NodeID}
	if h.GetReplicas() > 1 {
		if nodes, err = g.n.replicate(stream.Context(), tenant, ns, key, int(h.GetReplicas())); err != nil {
			return nil, err
		}
	}
	return &kvpoolv1.PutResponse{Existed: cr.Existed, Crc32C: cr.CRC, ReplicaNodes: nodes}, nil
}

func (g *grpcService) Get(req *kvpoolv1.GetRequest, stream kvpoolv1.KVPoolService_GetServer) error {
	tenant, ns, key := keyParts(req.GetKey())
	pin, err := g.n.store.Acquire(tenant, ns, key)
	if err != nil {
		return api.ToStatus(err)
	}
	defer g.n.store.Release(pin)
	if d := g.n.leaseFor(req.GetLeaseMs(), req.GetLease()); d > 0 {
		g.n.store.Lease(tenant, ns, [][]byte{key}, d)
	}
	chunk := g.n.cfg.GetChunkBytes
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

func (g *grpcService) BatchPut(_ context.Context, req *kvpoolv1.BatchPutRequest) (*kvpoolv1.BatchPutResponse, error) {
	total := 0
	for _, it := range req.GetItems() {
		total += len(it.GetValue())
	}
	if total > MaxBatchBytes {
		return nil, api.ToStatus(api.Errorf(api.ErrInvalidArgument, "pool: batch of %d bytes exceeds %d; split it", total, MaxBatchBytes))
	}
	out := &kvpoolv1.BatchPutResponse{Results: make([]*kvpoolv1.BatchPutResult, len(req.GetItems()))}
	for i, it := range req.GetItems() {
		tenant, ns, key := keyParts(it.GetKey())
		cr, err := g.n.store.PutBytes(tenant, ns, key, it.GetValue(), it.GetCrc32C(), it.Crc32C != nil)
		out.Results[i] = &kvpoolv1.BatchPutResult{Status: itemStatus(err), Existed: cr.Existed, Crc32C: cr.CRC}
	}
	return out, nil
}

// PutBytes stores value in one step: reserve, copy, commit.
func (s *Store) PutBytes(tenant, ns, key, value []byte, want uint32, haveWant bool) (CommitResult, error) {
	res, err := s.Reserve(tenant, ns, key, int64(len(value)), true)
	if err != nil {
		return CommitResult{}, err
	}
	copy(res.Bytes(), value)
	return s.Commit(res, api.Checksum(value), true, want, haveWant)
}

func itemStatus(err error) *kvpoolv1.ItemStatus {
	if err == nil {
		return &kvpoolv1.ItemStatus{}
	}
	return &kvpoolv1.ItemStatus{Code: int32(api.Code(err)), Message: err.Error()}
}

func (g *grpcService) BatchGet(_ context.Context, req *kvpoolv1.BatchGetRequest) (*kvpoolv1.BatchGetResponse, error) {
	tenant, ns := []byte(req.GetTenant()), []byte(req.GetNamespace())
	out := &kvpoolv1.BatchGetResponse{Results: make([]*kvpoolv1.BatchGetResult, len(req.GetKeys()))}
	total := 0
	for i, key := range req.GetKeys() {
		pin, err := g.n.store.Acquire(tenant, ns, key)
		if err != nil {
			out.Results[i] = &kvpoolv1.BatchGetResult{Status: itemStatus(err)}
			continue
		}
		total += len(pin.Mem)
		if total > MaxBatchBytes {
			g.n.store.Release(pin)
			return nil, api.ToStatus(api.Errorf(api.ErrInvalidArgument, "pool: batch reply exceeds %d bytes; ask for fewer keys", MaxBatchBytes))
		}
		out.Results[i] = &kvpoolv1.BatchGetResult{Status: &kvpoolv1.ItemStatus{}, Value: bytes.Clone(pin.Mem), Crc32C: pin.CRC}
		g.n.store.Release(pin)
	}
	return out, nil
}

func (g *grpcService) Exists(_ context.Context, req *kvpoolv1.ExistsRequest) (*kvpoolv1.ExistsResponse, error) {
	ex, err := g.n.store.Exists([]byte(req.GetTenant()), []byte(req.GetNamespace()), req.GetKeys())
	if err != nil {
		return nil, api.ToStatus(err)
	}
	return &kvpoolv1.ExistsResponse{Exists: ex}, nil
}

func (g *grpcService) Locate(_ context.Context, req *kvpoolv1.LocateRequest) (*kvpoolv1.LocateResponse, error) {
	tenant, ns := []byte(req.GetTenant()), []byte(req.GetNamespace())
	k, err := g.n.store.Locate(tenant, ns, req.GetKeys())
	if err != nil {
		return nil, api.ToStatus(err)
	}
	out := &kvpoolv1.LocateResponse{PrefixBlocks: uint32(k), NodeId: g.n.cfg.NodeID}
	if d := g.n.leaseFor(req.GetLeaseMs(), req.GetLease()); d > 0 && k > 0 {
		_, until, err := g.n.store.Lease(tenant, ns, req.GetKeys()[:k], d)
		if err != nil {
			return nil, api.ToStatus(err)
		}
		out.LeaseUntilUnixMs = until.UnixMilli()
	}
	return out, nil
}

func (g *grpcService) Remove(_ context.Context, req *kvpoolv1.RemoveRequest) (*kvpoolv1.RemoveResponse, error) {
	tenant, ns, key := keyParts(req.GetKey())
	if err := g.n.store.RemoveForce(tenant, ns, key, req.GetForce()); err != nil {
		return nil, api.ToStatus(err)
	}
	return &kvpoolv1.RemoveResponse{}, nil
}

func (g *grpcService) Stats(context.Context, *kvpoolv1.StatsRequest) (*kvpoolv1.StatsResponse, error) {
	st := g.n.store.Stats()
	out := &kvpoolv1.StatsResponse{
		NodeId:                g.n.cfg.NodeID,
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
		MemoryLocked:          g.n.seg.locked,
	}
	for _, ns := range st.Namespaces {
		out.Namespaces = append(out.Namespaces, &kvpoolv1.NamespaceStats{Tenant: ns.Tenant, Namespace: ns.Namespace, Blocks: ns.Blocks, StoredBytes: ns.StoredBytes})
	}
	out.Tenants = g.n.tenantStatsProto()
	out.LeasedBlocks = uint64(g.n.store.LeasedBlocks(g.n.cfg.Now()))
	return out, nil
}

func (n *Node) tenantStatsProto() []*kvpoolv1.TenantStats {
	var out []*kvpoolv1.TenantStats
	for _, t := range n.store.TenantStats() {
		out = append(out, &kvpoolv1.TenantStats{
			Tenant: t.Tenant, Policy: t.Config.Policy.String(), QuotaBytes: t.Config.QuotaBytes,
			StoredBytes: uint64(t.StoredBytes), Blocks: uint64(t.Blocks), Hits: t.Hits, Misses: t.Misses,
			QuotaEvictions: t.QuotaEvictions, PressureEvictions: t.PressureEvictions, Expirations: t.Expirations, Rejected: t.Rejected,
		})
		if !t.PolicyApplied.IsZero() {
			out[len(out)-1].PolicyAppliedUnixMs = t.PolicyApplied.UnixMilli()
		}
	}
	return out
}

// leaseFor turns a caller's lease request into a length, capped by the
// node's maximum: ms when given, the node's default when only asked for.
// 0 means no lease.
func (n *Node) leaseFor(ms uint32, asked bool) time.Duration {
	if ms == 0 && asked {
		return n.cfg.LeaseDefault
	}
	return min(time.Duration(ms)*time.Millisecond, n.cfg.LeaseMax)
}

func (g *grpcService) Info(context.Context, *kvpoolv1.InfoRequest) (*kvpoolv1.InfoResponse, error) {
	return &kvpoolv1.InfoResponse{
		NodeId:        g.n.cfg.NodeID,
		Version:       g.n.cfg.Version,
		HostId:        g.n.hostID,
		ShmSocket:     g.n.ShmSocket(),
		DataChannel:   true,
		MaxBlockBytes: uint64(g.n.cfg.MaxBlockBytes),
		MaxKeyBytes:   api.MaxKeyBytes,
		PageBytes:     uint64(g.n.cfg.PageBytes),
		CapacityBytes: uint64(g.n.cfg.CapacityBytes),
	}, nil
}
