package eviction

import "slices"

// heaped is a pointer to a node type that can sit in an idHeap.
type heaped[N any] interface {
	*N
	// heapPos is the node's position in its heap.
	heapPos() *uint32
	// before orders the heap. It must be a strict total order on the
	// nodes of a heap (ties broken by a unique time), so that the least
	// unpinned node is unique whatever the heap's shape.
	before(o *N) bool
}

// idHeap is an indexed binary min-heap of block IDs ordered by their nodes
// in a table; each node keeps its position, so it can be fixed or removed in
// O(log n). Positions live in a table too, 4 bytes a block.
type idHeap[N any, P heaped[N]] struct {
	nodes *table[N]
	// ids holds the heap: ids[0] is the least.
	ids table[uint32]
	n   uint32
	// scratch is reused by minUnpinned.
	scratch []uint32
}

func (h *idHeap[N, P]) len() int { return int(h.n) }

// id returns the ID at position i.
func (h *idHeap[N, P]) id(i uint32) uint32 { return *h.ids.at(i) }

func (h *idHeap[N, P]) node(i uint32) P { return P(h.nodes.at(h.id(i))) }

func (h *idHeap[N, P]) less(i, j uint32) bool { return h.node(i).before(h.nodes.at(h.id(j))) }

// push adds id. REQUIRES: id's node is set and in no heap.
func (h *idHeap[N, P]) push(id uint32) {
	i := h.n
	*h.ids.grow(i) = id
	*P(h.nodes.at(id)).heapPos() = i
	h.n++
	h.up(i)
}

// remove takes id off h. REQUIRES: id is on h.
func (h *idHeap[N, P]) remove(id uint32) {
	i, last := *P(h.nodes.at(id)).heapPos(), h.n-1
	if i != last {
		h.swap(i, last)
	}
	*h.ids.at(last) = 0
	h.n--
	if i != last {
		h.fixAt(i)
	}
}

// fix restores the order after id's key changed. REQUIRES: id is on h.
func (h *idHeap[N, P]) fix(id uint32) { h.fixAt(*P(h.nodes.at(id)).heapPos()) }

func (h *idHeap[N, P]) fixAt(i uint32) {
	if !h.down(i) {
		h.up(i)
	}
}

// appendOrdered appends h's IDs to out, least first, without changing h.
func (h *idHeap[N, P]) appendOrdered(out []ID) []ID {
	start := len(out)
	for i := range h.n {
		out = append(out, ID(h.id(i)))
	}
	slices.SortFunc(out[start:], func(a, b ID) int {
		switch na, nb := P(h.nodes.at(uint32(a))), P(h.nodes.at(uint32(b))); {
		case na.before(nb):
			return -1
		case nb.before(na):
			return 1
		}
		return 0
	})
	return out
}

// minUnpinned returns the least block that is not pinned, or 0, without
// changing h. It explores the heap best-first from the root, descending only
// below pinned blocks, so it costs O(1) with no pins and O(p log p) when it
// must skip p pinned blocks.
func (h *idHeap[N, P]) minUnpinned(pinned func(ID) bool) uint32 {
	if h.n == 0 {
		return 0
	}
	if id := h.id(0); !isPinned(pinned, id) {
		return id
	}
	// frontier is a min-heap of positions in h, by h.less.
	frontier := append(h.scratch[:0], 0)
	defer func() { h.scratch = frontier[:0] }()
	lessAt := func(a, b int) bool { return h.less(frontier[a], frontier[b]) }
	for len(frontier) > 0 {
		// Pop the least position.
		i := frontier[0]
		last := len(frontier) - 1
		frontier[0] = frontier[last]
		frontier = frontier[:last]
		for j := 0; ; {
			c := 2*j + 1
			if c >= len(frontier) {
				break
			}
			if c+1 < len(frontier) && lessAt(c+1, c) {
				c++
			}
			if !lessAt(c, j) {
				break
			}
			frontier[j], frontier[c] = frontier[c], frontier[j]
			j = c
		}
		if id := h.id(i); !isPinned(pinned, id) {
			return id
		}
		for _, c := range [2]uint64{2*uint64(i) + 1, 2*uint64(i) + 2} {
			if c >= uint64(h.n) {
				continue
			}
			frontier = append(frontier, uint32(c))
			for j := len(frontier) - 1; j > 0; {
				p := (j - 1) / 2
				if !lessAt(j, p) {
					break
				}
				frontier[j], frontier[p] = frontier[p], frontier[j]
				j = p
			}
		}
	}
	return 0
}

func (h *idHeap[N, P]) swap(i, j uint32) {
	a, b := h.ids.at(i), h.ids.at(j)
	*a, *b = *b, *a
	*P(h.nodes.at(*a)).heapPos() = i
	*P(h.nodes.at(*b)).heapPos() = j
}

func (h *idHeap[N, P]) up(j uint32) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

// down sifts the block at i0 down and reports whether it moved.
func (h *idHeap[N, P]) down(i0 uint32) bool {
	i := i0
	for {
		c64 := 2*uint64(i) + 1
		if c64 >= uint64(h.n) {
			break
		}
		c := uint32(c64)
		if c64+1 < uint64(h.n) && h.less(c+1, c) {
			c++
		}
		if !h.less(c, i) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > i0
}
