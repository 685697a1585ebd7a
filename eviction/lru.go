package eviction

import "time"

// lruNode is what LRU and FIFO keep per ID: 12 bytes.
type lruNode struct {
	link
	// size is Bytes+1; 0 means no block.
	size uint32
}

func (n *lruNode) links() *link      { return &n.link }
func (n *lruNode) blockSize() uint32 { return n.size }

// lru implements LRU and FIFO: one list, front = newest. For LRU a Touch
// moves the block to the front; for FIFO it does nothing.
type lru struct {
	counts
	kind  Kind
	nodes table[lruNode]
	l     list
}

func newLRU(k Kind) *lru { return &lru{kind: k} }

// Kind implements Policy.
func (p *lru) Kind() Kind { return p.kind }

// Add implements Policy.
func (p *lru) Add(b Block, _ time.Time) {
	id, _, size := checkBlock(&b)
	p.Remove(b.ID)
	p.nodes.grow(id).size = size
	p.add(size)
	pushFront(&p.l, &p.nodes, id)
}

// Touch implements Policy.
func (p *lru) Touch(id ID, _ time.Time) {
	if p.kind == FIFO {
		return
	}
	if i, n := held(&p.nodes, id); n != nil {
		moveToFront(&p.l, &p.nodes, i)
	}
}

// Miss implements Policy: a no-op.
func (p *lru) Miss(uint64) {}

// Remove implements Policy.
func (p *lru) Remove(id ID) {
	if i, n := held(&p.nodes, id); n != nil {
		remove(&p.l, &p.nodes, i)
		p.sub(n.size)
		*n = lruNode{}
	}
}

// Victim implements Policy.
func (p *lru) Victim(_ time.Time, pinned func(ID) bool) (ID, bool) {
	if i := lastUnpinned(&p.l, &p.nodes, pinned); i != 0 {
		return ID(i), true
	}
	return 0, false
}

// Rank implements Policy: the list from its back.
func (p *lru) Rank(out []ID) []ID { return appendBackToFront(out, &p.l, &p.nodes) }

// Admit implements Policy: always true.
func (p *lru) Admit(Block, ID) bool { return true }
