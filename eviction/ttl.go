package eviction

import (
	"math"
	"time"
)

// ttlNode is what TTL keeps per ID: 20 bytes, plus 4 in the heap.
type ttlNode struct {
	// link places a block that never expires on the never list. For a
	// block that expires, link.prev is its heap position and link.next its
	// seq, the logical time of its last Add or Touch.
	link link
	// size is Bytes+1; 0 means no block.
	size uint32
	// expHi and expLo are the halves of the block's expiry (see expiry); 0
	// means never. Halves keep the node 4-aligned, so 20 bytes, not 24.
	expHi, expLo uint32
}

func (n *ttlNode) links() *link      { return &n.link }
func (n *ttlNode) blockSize() uint32 { return n.size }
func (n *ttlNode) heapPos() *uint32  { return &n.link.prev }
func (n *ttlNode) exp() uint64       { return uint64(n.expHi)<<32 | uint64(n.expLo) }

// before orders the heap by expiry, then by last use.
func (n *ttlNode) before(o *ttlNode) bool {
	if a, b := n.exp(), o.exp(); a != b {
		return a < b
	}
	return n.link.next < o.link.next
}

// The expiries that fit an int64 of Unix nanoseconds.
var (
	minExpiry = time.Unix(0, math.MinInt64+1)
	maxExpiry = time.Unix(0, math.MaxInt64)
)

// expiry encodes t as a uint64 in t's order: 0 for the zero time (never),
// else t's Unix time in nanoseconds, clamped to [minExpiry, maxExpiry] and
// offset by 2^63.
func expiry(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	var ns int64
	switch {
	case t.Before(minExpiry):
		ns = math.MinInt64 + 1
	case t.After(maxExpiry):
		ns = math.MaxInt64
	default:
		ns = t.UnixNano()
	}
	return uint64(ns) ^ 1<<63
}

// ttl orders blocks that expire by (Expires, last use) in a heap, and
// blocks that never expire in an LRU list behind them.
//
// NB: expired blocks are exactly the ones at the head of the expiry order
// (Expires ≤ now < every other Expires), so "expired first, earliest expiry
// first, then earliest expiring" is one order and Victim need not read now.
type ttl struct {
	counts
	clock    seqClock
	nodes    table[ttlNode]
	expiring idHeap[ttlNode, *ttlNode]
	never    list
}

func newTTL() *ttl {
	p := &ttl{clock: seqClock{limit: math.MaxUint32}}
	p.expiring.nodes = &p.nodes
	return p
}

// Kind implements Policy.
func (p *ttl) Kind() Kind { return TTL }

// tick advances the logical clock, renumbering first if it is full.
func (p *ttl) tick() uint32 {
	if p.clock.due() {
		stamps := make([]stamp, 0, p.expiring.len())
		for i := range uint32(p.expiring.len()) {
			id := p.expiring.id(i)
			stamps = append(stamps, stamp{p.nodes.at(id).link.next, id})
		}
		p.clock.renumber(stamps, func(id, seq uint32) { p.nodes.at(id).link.next = seq })
	}
	return p.clock.tick()
}

// Add implements Policy.
func (p *ttl) Add(b Block, _ time.Time) {
	id, _, size := checkBlock(&b)
	p.Remove(b.ID)
	seq := p.tick()
	exp := expiry(b.Expires)
	*p.nodes.grow(id) = ttlNode{size: size, expHi: uint32(exp >> 32), expLo: uint32(exp)}
	p.add(size)
	if exp == 0 {
		pushFront(&p.never, &p.nodes, id)
	} else {
		p.nodes.at(id).link.next = seq
		p.expiring.push(id)
	}
}

// Touch implements Policy.
func (p *ttl) Touch(id ID, _ time.Time) {
	i, n := held(&p.nodes, id)
	if n == nil {
		return
	}
	seq := p.tick()
	if n.exp() != 0 {
		n.link.next = seq
		p.expiring.fix(i)
	} else {
		moveToFront(&p.never, &p.nodes, i)
	}
}

// Miss implements Policy: a no-op.
func (p *ttl) Miss(uint64) {}

// Remove implements Policy.
func (p *ttl) Remove(id ID) {
	i, n := held(&p.nodes, id)
	if n == nil {
		return
	}
	if n.exp() != 0 {
		p.expiring.remove(i)
	} else {
		remove(&p.never, &p.nodes, i)
	}
	p.sub(n.size)
	*n = ttlNode{}
}

// Victim implements Policy.
func (p *ttl) Victim(_ time.Time, pinned func(ID) bool) (ID, bool) {
	if i := p.expiring.minUnpinned(pinned); i != 0 {
		return ID(i), true
	}
	if i := lastUnpinned(&p.never, &p.nodes, pinned); i != 0 {
		return ID(i), true
	}
	return 0, false
}

// Rank implements Policy: the blocks that expire, soonest first, then
// the others from the back of their list.
func (p *ttl) Rank(out []ID) []ID {
	return appendBackToFront(p.expiring.appendOrdered(out), &p.never, &p.nodes)
}

// Admit implements Policy: always true.
func (p *ttl) Admit(Block, ID) bool { return true }
