package pool

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer"
)

// Replicate makes sure copies of the committed block (tenant, namespace,
// key) sit on `copies` distinct nodes, this one included. Nodes already
// holding it count; the rest are chosen among live nodes preferring zones
// not yet used, then the most free space. Each copy is pushed the RDMA
// way: the target reserves space, the transport writes the bytes into it
// one-sidedly, the target commits them against the checksum. It returns
// the nodes holding a copy; an error when fewer than copies could be had.
func (f *fetcher) Replicate(ctx context.Context, tenant, namespace, key []byte, copies int) ([]string, error) {
	holders := []string{f.self}
	if copies <= 1 {
		return holders, nil
	}
	if f.cluster == nil {
		return holders, api.Errorf(api.ErrFailedPrecondition, "pool: %d copies asked of a standalone node", copies)
	}
	pin, err := f.store.Acquire(tenant, namespace, key)
	if err != nil {
		return holders, err
	}
	defer f.store.Release(pin)
	have := map[string]bool{f.self: true}
	zones := map[string]bool{f.zone: true}
	for _, r := range f.cluster.Holders(string(tenant), string(namespace), key) {
		if !have[r.ID] {
			have[r.ID] = true
			zones[r.Zone] = true
			holders = append(holders, r.ID)
		}
	}
	free := map[string]int64{}
	for _, p := range f.cluster.Peers() {
		free[p.ID] = p.Load.FreeBytes()
	}
	var candidates []metadata.NodeRecord
	for _, ni := range f.cluster.Nodes() {
		if !have[ni.Record.ID] && !f.cluster.Dead(ni.Record.ID) {
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
			wg.Go(func() { results[i] = f.pushCopy(ctx, target, tenant, namespace, key, pin) })
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
func (f *fetcher) pushCopy(ctx context.Context, target metadata.NodeRecord, tenant, namespace, key []byte, pin store.Pin) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	addr := target.Addrs[addrGRPC]
	tr, peer := f.transportTo(target)
	pc, _, err := f.peers.Get(ctx, addr)
	if err != nil {
		return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	defer f.peers.Put(addr, pc)
	resp, err := pc.RoundTrip(ctx, &wire.Request{Op: wire.OpReserve, ValueLen: uint64(len(pin.Mem)), Tenant: tenant, Namespace: namespace, Key: key})
	if err != nil {
		return peerError(err)
	}
	handle := resp.Handle
	start := time.Now()
	b, werr := transfer.Run(ctx, tr, []transfer.Op{{Kind: transfer.Write, Peer: peer, Region: arenaRegion, Offset: resp.Offset, Local: pin.Mem}})
	<-b.Done()
	if werr != nil {
		pc.Notify(&wire.Request{Op: wire.OpAbort, Handle: handle}, 5*time.Second)
		return fmt.Errorf("%w: write to %s: %v", api.ErrUnavailable, target.ID, werr)
	}
	f.links.Observe(target.ID, int64(len(pin.Mem)), time.Since(start), f.now())
	_, err = pc.RoundTrip(ctx, &wire.Request{Op: wire.OpCommit, Flags: wire.FlagChecksum, CRC: pin.CRC, Handle: handle})
	if err != nil && !errors.Is(err, api.ErrAlreadyExists) {
		return peerError(err)
	}
	return nil
}

// peerError classifies a failed round trip with a peer: what the peer
// refused comes back as it said it, a broken connection as Unavailable.
func peerError(err error) error {
	var re *api.RemoteError
	if errors.As(err, &re) {
		return err
	}
	return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
}
