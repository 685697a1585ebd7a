package eviction

import "time"

// The classes of a PrefixLRU block, in eviction order.
const (
	// orphan: Parent is nonzero but not present, so the block can never be
	// part of a prefix hit again.
	orphan uint32 = iota
	// leaf: not an orphan, and no present block names it as Parent.
	leaf
	// interior: not an orphan, with at least one present child.
	interior
)

// A prefixNode's key packs its class above its seq.
const (
	classShift = 30
	seqMask    = 1<<classShift - 1
)

// prefixNode is what PrefixLRU keeps per ID: 28 bytes, plus 4 in the heap.
type prefixNode struct {
	// parent is the block's Parent, 0 if none.
	parent uint32
	// sibs links the block among the present blocks with the same parent.
	sibs link
	// firstChild is the first present block whose Parent is this ID, 0 if
	// none. NB: it is kept whether or not this ID is held, so that a block
	// added later finds its children.
	firstChild uint32
	// pos is the block's heap position.
	pos uint32
	// key orders the heap: class<<classShift | seq, where seq is the
	// logical time of the block's last Add or Touch.
	key uint32
	// size is Bytes+1; 0 means no block.
	size uint32
}

func (n *prefixNode) blockSize() uint32         { return n.size }
func (n *prefixNode) heapPos() *uint32          { return &n.pos }
func (n *prefixNode) before(o *prefixNode) bool { return n.key < o.key }
func (n *prefixNode) class() uint32             { return n.key >> classShift }
func (n *prefixNode) setSeq(seq uint32)         { n.key = n.key&^seqMask | seq }
func (n *prefixNode) setClass(c uint32)         { n.key = c<<classShift | n.key&seqMask }

// prefix is prefix-aware LRU. Blocks sit in one heap ordered by (class,
// last use): Victim takes the least recently used unpinned orphan, else
// leaf, else, when every orphan and leaf is pinned, interior block, so
// Victim is O(1), or O(p log p) when it skips p pinned blocks. Within a
// chain the deepest block is the only leaf, so chains are shortened from the
// tail and their prefixes stay usable.
//
// Every present block with a Parent is on the list of children of that
// Parent's ID (firstChild, then sibs), whether the parent is present or not:
// when a parent is removed its children become orphans, when it is
// (re)added they are adopted again.
type prefix struct {
	counts
	clock seqClock
	nodes table[prefixNode]
	heap  idHeap[prefixNode, *prefixNode]
}

func newPrefix() *prefix {
	p := &prefix{clock: seqClock{limit: seqMask}}
	p.heap.nodes = &p.nodes
	return p
}

// Kind implements Policy.
func (p *prefix) Kind() Kind { return PrefixLRU }

// isHeld reports whether the block at index i is present.
func (p *prefix) isHeld(i uint32) bool {
	n := p.nodes.get(i)
	return n != nil && n.size != 0
}

// tick advances the logical clock, renumbering first if it is full.
func (p *prefix) tick() uint32 {
	if p.clock.due() {
		stamps := make([]stamp, 0, p.heap.len())
		for i := range uint32(p.heap.len()) {
			id := p.heap.id(i)
			stamps = append(stamps, stamp{p.nodes.at(id).key & seqMask, id})
		}
		p.clock.renumber(stamps, func(id, seq uint32) { p.nodes.at(id).setSeq(seq) })
	}
	return p.clock.tick()
}

// classOf computes id's class from the present blocks. REQUIRES: id is held.
func (p *prefix) classOf(id uint32) uint32 {
	switch n := p.nodes.at(id); {
	case n.parent != 0 && !p.isHeld(n.parent):
		return orphan
	case n.firstChild == 0:
		return leaf
	}
	return interior
}

// reclass moves id to its current class.
func (p *prefix) reclass(id uint32) {
	if n, c := p.nodes.at(id), p.classOf(id); c != n.class() {
		n.setClass(c)
		p.heap.fix(id)
	}
}

// Add implements Policy.
func (p *prefix) Add(b Block, _ time.Time) {
	id, par, size := checkBlock(&b)
	p.Remove(b.ID)
	seq := p.tick()
	// NB: grow both before taking pointers: growing may move a page.
	p.nodes.grow(id)
	if par != 0 {
		p.nodes.grow(par)
	}
	n := p.nodes.at(id)
	n.parent, n.size, n.key = par, size, seq // firstChild stays
	p.add(size)
	if par != 0 {
		pn := p.nodes.at(par)
		if h := pn.firstChild; h != 0 {
			p.nodes.at(h).sibs.prev = id
			n.sibs.next = h
		}
		pn.firstChild = id
	}
	n.setClass(p.classOf(id))
	p.heap.push(id)
	// Adopt the children already present; they were orphans.
	for c := n.firstChild; c != 0; c = p.nodes.at(c).sibs.next {
		p.reclass(c)
	}
	if par != 0 && p.isHeld(par) {
		p.reclass(par)
	}
}

// Touch implements Policy.
func (p *prefix) Touch(id ID, _ time.Time) {
	if i, n := held(&p.nodes, id); n != nil {
		n.setSeq(p.tick())
		p.heap.fix(i)
	}
}

// Miss implements Policy: a no-op.
func (p *prefix) Miss(uint64) {}

// Remove implements Policy.
func (p *prefix) Remove(id ID) {
	i, n := held(&p.nodes, id)
	if n == nil {
		return
	}
	p.sub(n.size)
	p.heap.remove(i)
	par, s := n.parent, n.sibs
	*n = prefixNode{firstChild: n.firstChild}
	if par != 0 {
		if s.prev != 0 {
			p.nodes.at(s.prev).sibs.next = s.next
		} else {
			p.nodes.at(par).firstChild = s.next
		}
		if s.next != 0 {
			p.nodes.at(s.next).sibs.prev = s.prev
		}
		if p.isHeld(par) {
			p.reclass(par)
		}
	}
	// The children are orphans now.
	for c := n.firstChild; c != 0; c = p.nodes.at(c).sibs.next {
		p.reclass(c)
	}
}

// Victim implements Policy.
func (p *prefix) Victim(_ time.Time, pinned func(ID) bool) (ID, bool) {
	if i := p.heap.minUnpinned(pinned); i != 0 {
		return ID(i), true
	}
	return 0, false
}

// Rank implements Policy: the heap in order.
func (p *prefix) Rank(out []ID) []ID { return p.heap.appendOrdered(out) }

// Admit implements Policy: always true.
func (p *prefix) Admit(Block, ID) bool { return true }
