package pool

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
	"github.com/kvpool/kvpool/pool/store"
	"github.com/kvpool/kvpool/transfer"
)

// grants are what each peer node may touch of this node's arena through
// a transport, scoped like RDMA rkeys: a read of a block it pinned (View
// on the data channel), a write into a reservation it made for a
// replica. A grant lives as long as its pin or reservation. Only a secured
// node keeps them: an open one lets every caller read and write anything.
// Safe for concurrent use.
type grants struct {
	// open reports whether a reservation is still open: a write grant
	// ends with its reservation, also when the node reclaims it (past the
	// reservation timeout) and its pages go to another block.
	open func(handle uint64) bool

	mu     sync.Mutex
	byNode map[string]map[grant]int // node id -> grant -> holds
}

// grant is one range of the arena and the direction it may move; a write
// grant names its reservation.
type grant struct {
	offset, length uint64
	write          bool
	reservation    uint64
}

func (g *grants) add(node string, gr grant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.byNode == nil {
		g.byNode = map[string]map[grant]int{}
	}
	m := g.byNode[node]
	if m == nil {
		m = map[grant]int{}
		g.byNode[node] = m
	}
	m[gr]++
}

func (g *grants) remove(node string, gr grant) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.byNode[node]
	if m[gr]--; m[gr] <= 0 {
		delete(m, gr)
	}
	if len(m) == 0 {
		delete(g.byNode, node)
	}
}

// allows reports whether node holds a grant covering [offset, +length)
// in direction write.
func (g *grants) allows(node string, write bool, offset, length uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for gr := range g.byNode[node] {
		if gr.write == write && offset >= gr.offset && length <= gr.length && offset-gr.offset <= gr.length-length &&
			(!gr.write || g.open == nil || g.open(gr.reservation)) {
			return true
		}
	}
	return false
}

// held counts the grants in force, for tests and stats.
func (g *grants) held() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, m := range g.byNode {
		n += len(m)
	}
	return n
}

// access is the transports' check of one served request from node:
// only the arena, only within a grant. nil when the node runs open.
func (g *grants) access(node string) transfer.Access {
	return func(_ context.Context, kind transfer.Kind, region transfer.RegionID, offset, length uint64) error {
		if region != arenaRegion || !g.allows(node, kind == transfer.Write, offset, length) {
			return fmt.Errorf("%w: node %s holds no grant to %v region %d [%d, +%d)", api.ErrPermissionDenied, node, kind, region, offset, length)
		}
		return nil
	}
}

// blockPinner is what serving named reads needs of the store. *store.Store
// (and *tiers, which promotes from disk) implement it.
type blockPinner interface {
	Acquire(tenant, ns, key []byte) (store.Pin, error)
	ReleaseHandle(h uint64) error
}

// namedBlocks serves one peer node's named reads over the tcp transport
// (transfer.BlockSource): a block of a tenant the caller may read, pinned
// while its bytes are sent, the way a View on the data channel pins it
// for the caller's pull. It holds no grant: the read names the block, not
// a range. Safe for concurrent use.
type namedBlocks struct {
	store  blockPinner
	gate   *gatekeeper // nil: every caller may read every tenant
	caller auth.Identity
}

var _ transfer.BlockSource = (*namedBlocks)(nil)

// PinBlock implements transfer.BlockSource.
func (b *namedBlocks) PinBlock(name transfer.BlockName) (transfer.PinnedBlock, error) {
	if b.gate != nil && !b.gate.open {
		if err := b.gate.check(b.caller, auth.OpRead, string(name.Tenant)); err != nil {
			return transfer.PinnedBlock{}, err
		}
	}
	pin, err := b.store.Acquire(name.Tenant, name.Namespace, name.Key)
	if err != nil {
		return transfer.PinnedBlock{}, err
	}
	return transfer.PinnedBlock{Mem: pin.Mem, CRC: pin.CRC, Handle: pin.Handle()}, nil
}

// UnpinBlock implements transfer.BlockSource.
func (b *namedBlocks) UnpinBlock(p transfer.PinnedBlock) { b.store.ReleaseHandle(p.Handle) }
