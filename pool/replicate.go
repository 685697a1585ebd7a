package pool

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/transfer"
)

// replicate makes sure copies of the committed block (tenant, namespace,
// key) sit on `copies` distinct nodes, this one included. Nodes already
// holding it count; the rest are chosen among live nodes preferring zones
// not yet used, then the most free space. Each copy is pushed the RDMA
// way: the target reserves space, the transport writes the bytes into it
// one-sidedly, the target commits them against the checksum. It returns
// the nodes holding a copy; an error when fewer than copies could be had.
func (n *Node) replicate(ctx context.Context, tenant, namespace, key []byte, copies int) ([]string, error) {
	holders := []string{n.cfg.NodeID}
	if copies <= 1 {
		return holders, nil
	}
	if n.cluster == nil {
		return holders, api.Errorf(api.ErrFailedPrecondition, "pool: %d copies asked of a standalone node", copies)
	}
	pin, err := n.store.Acquire(tenant, namespace, key)
	if err != nil {
		return holders, err
	}
	defer n.store.Release(pin)
	have := map[string]bool{n.cfg.NodeID: true}
	zones := map[string]bool{n.cfg.Zone: true}
	for _, r := range n.cluster.mirror.Holders(string(tenant), string(namespace), key) {
		if !have[r.ID] {
			have[r.ID] = true
			zones[r.Zone] = true
			holders = append(holders, r.ID)
		}
	}
	free := map[string]int64{}
	for _, p := range n.cluster.gossip.Peers() {
		free[p.ID] = p.Load.FreeBytes()
	}
	var candidates []metadata.NodeRecord
	for _, ni := range n.cluster.mirror.Nodes() {
		if !have[ni.Record.ID] && !n.cluster.gossip.Dead(ni.Record.ID) {
			candidates = append(candidates, ni.Record)
		}
	}
	sort.SliceStable(candidates, func(i, j int) bool {
		zi, zj := zones[candidates[i].Zone], zones[candidates[j].Zone]
		if zi != zj {
			return !zi
		}
		return free[candidates[i].ID] > free[candidates[j].ID]
	})
	var errs []error
	for len(holders) < copies && len(candidates) > 0 {
		want := min(copies-len(holders), len(candidates))
		batch := candidates[:want]
		candidates = candidates[want:]
		results := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, target := range batch {
			wg.Go(func() { results[i] = n.pushCopy(ctx, target, tenant, namespace, key, pin) })
		}
		wg.Wait()
		for i, err := range results {
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", batch[i].ID, err))
				continue
			}
			holders = append(holders, batch[i].ID)
		}
	}
	if len(holders) < copies {
		return holders, api.Errorf(api.ErrUnavailable, "pool: %d of %d copies placed (%s): %v", len(holders), copies, strings.Join(holders, ", "), errors.Join(errs...))
	}
	return holders, nil
}

// pushCopy writes the pinned block into a reservation on target and
// commits it there.
func (n *Node) pushCopy(ctx context.Context, target metadata.NodeRecord, tenant, namespace, key []byte, pin Pin) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.FetchTimeout)
	defer cancel()
	addr := target.Addrs[addrGRPC]
	tr, peer := n.transportTo(target)
	pc, err := n.peers.get(ctx, addr)
	if err != nil {
		return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	resp, err := pc.roundTrip(ctx, &wire.Request{Op: wire.OpReserve, ValueLen: uint64(len(pin.Mem)), Tenant: tenant, Namespace: namespace, Key: key})
	if err != nil {
		pc.close()
		return err
	}
	start := time.Now()
	b := tr.Submit(ctx, []transfer.Op{{Kind: transfer.Write, Peer: peer, Region: arenaRegion, Offset: resp.Offset, Local: pin.Mem}})
	werr := b.Wait(ctx)
	<-b.Done()
	if werr != nil {
		pc.notify(&wire.Request{Op: wire.OpAbort, Handle: resp.Handle})
		pc.done()
		return fmt.Errorf("%w: write to %s: %v", api.ErrUnavailable, target.ID, werr)
	}
	n.links.Observe(target.ID, int64(len(pin.Mem)), time.Since(start), n.cfg.Now())
	_, err = pc.roundTrip(ctx, &wire.Request{Op: wire.OpCommit, Flags: wire.FlagChecksum, CRC: pin.CRC, Handle: resp.Handle})
	if err != nil && !errors.Is(err, api.ErrAlreadyExists) {
		pc.done()
		return err
	}
	pc.done()
	return nil
}

// roundTrip sends one request and reads its response; a node error comes
// back as an api error with the connection still usable.
func (pc *peerConn) roundTrip(ctx context.Context, r *wire.Request) (wire.Response, error) {
	if dl, ok := ctx.Deadline(); ok {
		pc.c.SetDeadline(dl)
	}
	defer pc.c.SetDeadline(time.Time{})
	pc.buf = wire.AppendRequest(pc.buf[:0], r)
	if _, err := pc.c.Write(pc.buf); err != nil {
		pc.bad = true
		return wire.Response{}, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	if err := wire.ReadResponse(pc.br, &pc.resp); err != nil {
		pc.bad = true
		return wire.Response{}, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	if c := codes.Code(pc.resp.Status); c != codes.OK {
		if pc.resp.Flags&wire.FlagClose != 0 {
			pc.bad = true
		}
		return pc.resp, api.FromCode(c, pc.resp.Message)
	}
	return pc.resp, nil
}

// notify sends a request that has no response.
func (pc *peerConn) notify(r *wire.Request) {
	pc.buf = wire.AppendRequest(pc.buf[:0], r)
	pc.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := pc.c.Write(pc.buf); err != nil {
		pc.bad = true
	}
	pc.c.SetDeadline(time.Time{})
}
