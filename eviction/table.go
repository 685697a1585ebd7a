package eviction

import (
	"fmt"
	"slices"
)

// The pages of a table.
const (
	pageShift = 12
	// pageLen is the number of slots of a full page.
	pageLen  = 1 << pageShift
	pageMask = pageLen - 1
	// firstPageLen is the length of a new page that is not needed full yet.
	firstPageLen = 16
)

// table is a T per uint32 index (a block ID, or a heap position), the
// storage of every policy. T must hold no pointers, so the garbage collector
// scans only the page directory, one pointer per pageLen slots.
//
// Slots live in pages of pageLen, allocated as larger indexes are grown to;
// a page grows by doubling up to pageLen, so a table of many blocks wastes
// at most part of one page. Unlike one flat slice grown geometrically, a
// table never copies more than a page at once, and its memory stays close
// to (largest index) × size of T. Pages are never freed. The zero table is
// empty and ready.
type table[T any] struct {
	pages [][]T
}

// get returns the slot of i, or nil if i was never grown to (so its slot
// would be zero).
func (t *table[T]) get(i uint32) *T {
	p, s := int(i>>pageShift), int(i&pageMask)
	if p >= len(t.pages) || s >= len(t.pages[p]) {
		return nil
	}
	return &t.pages[p][s]
}

// at returns the slot of i. REQUIRES: i was grown to.
func (t *table[T]) at(i uint32) *T {
	return &t.pages[i>>pageShift][i&pageMask]
}

// grow makes room for i and returns its slot, zero if new.
func (t *table[T]) grow(i uint32) *T {
	p, s := int(i>>pageShift), int(i&pageMask)
	for len(t.pages) <= p {
		t.pages = append(t.pages, nil)
	}
	pg := t.pages[p]
	if s >= len(pg) {
		n := min(pageLen, max(s+1, 2*len(pg), firstPageLen))
		pg = append(make([]T, 0, n), pg...)[:n]
		t.pages[p] = pg
	}
	return &pg[s]
}

// sized is a pointer to a node type that holds a block's encoded size (see
// checkBlock), zero when its ID holds no block.
type sized[N any] interface {
	*N
	blockSize() uint32
}

// held returns id's index and node if id is held, or a nil node.
func held[N any, P sized[N]](t *table[N], id ID) (uint32, P) {
	i, ok := index(id)
	if !ok {
		return 0, nil
	}
	if n := P(t.get(i)); n != nil && n.blockSize() != 0 {
		return i, n
	}
	return 0, nil
}

// seqClock is the logical time of a policy that orders blocks by last use:
// it ticks on every Add and every Touch of a held block. Times are 32-bit;
// when the clock reaches limit the policy renumbers the times it holds
// 1, 2, …, n in the same order, so comparisons never see a wrap.
type seqClock struct {
	now uint32
	// limit is the last time before renumbering: math.MaxUint32, or less
	// when a policy packs other bits with its times (and in tests).
	limit uint32
}

// due reports whether the policy must renumber before the next tick.
func (c *seqClock) due() bool { return c.now >= c.limit }

// tick advances the clock and returns the new time. REQUIRES: !c.due().
func (c *seqClock) tick() uint32 {
	c.now++
	return c.now
}

// stamp is a held block's time, for renumbering.
type stamp struct{ seq, id uint32 }

// renumber sorts stamps (every held time) by seq and calls set(id, rank)
// with rank 1, 2, … in order, then restarts the clock after the last rank.
// It panics if that leaves no room before the limit.
func (c *seqClock) renumber(stamps []stamp, set func(id, seq uint32)) {
	if uint64(len(stamps)) >= uint64(c.limit) {
		panic(fmt.Sprintf("eviction: %d blocks overflow a logical clock of %d ticks", len(stamps), c.limit))
	}
	slices.SortFunc(stamps, func(a, b stamp) int {
		switch {
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	for i, s := range stamps {
		set(s.id, uint32(i+1))
	}
	c.now = uint32(len(stamps))
}
