package eviction

import (
	"fmt"
)

// checkInvariants verifies p's internal structure against its table of
// nodes, recomputing from scratch what the policy maintains incrementally.
// It returns nil or the first violation.
func checkInvariants(p Policy) error {
	switch p := p.(type) {
	case *lru:
		held, err := checkTable(&p.nodes, &p.counts)
		if err != nil {
			return err
		}
		ids, err := checkList(&p.l, &p.nodes)
		if err != nil {
			return err
		}
		return sameSet(ids, held, "list")
	case *lfu:
		held, err := checkTable(&p.nodes, &p.counts)
		if err != nil {
			return err
		}
		var all []uint32
		seqs := make(map[uint32]uint32)
		for f := range p.buckets {
			ids, err := checkList(&p.buckets[f], &p.nodes)
			if err != nil {
				return fmt.Errorf("bucket %d: %w", f, err)
			}
			for j, id := range ids {
				n := p.nodes.at(id)
				if est := p.estimate(n.hash); f > int(est) {
					return fmt.Errorf("%d: in bucket %d > estimate %d", id, f, est)
				}
				if j > 0 && n.seq >= p.nodes.at(ids[j-1]).seq {
					return fmt.Errorf("bucket %d: %d (seq %d) behind %d (seq %d)", f, id, n.seq, ids[j-1], p.nodes.at(ids[j-1]).seq)
				}
				if (n.prev == 0 || n.next == 0) && p.bucketOf(id) != f {
					return fmt.Errorf("%d: bucketOf = %d, in %d", id, p.bucketOf(id), f)
				}
				seqs[id] = n.seq
			}
			all = append(all, ids...)
		}
		if err := checkSeqs(seqs, &p.clock); err != nil {
			return err
		}
		return sameSet(all, held, "buckets")
	case *ttl:
		held, err := checkTable(&p.nodes, &p.counts)
		if err != nil {
			return err
		}
		never, err := checkList(&p.never, &p.nodes)
		if err != nil {
			return err
		}
		for _, id := range never {
			if p.nodes.at(id).exp() != 0 {
				return fmt.Errorf("%d: expires but on the never list", id)
			}
		}
		expiring, err := checkHeap(&p.expiring)
		if err != nil {
			return err
		}
		seqs := make(map[uint32]uint32)
		for _, id := range expiring {
			n := p.nodes.at(id)
			if n.exp() == 0 {
				return fmt.Errorf("%d: never expires but in the heap", id)
			}
			seqs[id] = n.link.next
		}
		if err := checkSeqs(seqs, &p.clock); err != nil {
			return err
		}
		return sameSet(append(never, expiring...), held, "list and heap")
	case *prefix:
		held, err := checkTable(&p.nodes, &p.counts)
		if err != nil {
			return err
		}
		ids, err := checkHeap(&p.heap)
		if err != nil {
			return err
		}
		if err := sameSet(ids, held, "heap"); err != nil {
			return err
		}
		seqs := make(map[uint32]uint32)
		children := make(map[uint32]int)
		withParent := 0
		for _, id := range ids {
			n := p.nodes.at(id)
			seqs[id] = n.key & seqMask
			if n.parent == id {
				return fmt.Errorf("%d: its own parent", id)
			}
			if n.parent != 0 {
				children[n.parent]++
				withParent++
			}
		}
		if err := checkSeqs(seqs, &p.clock); err != nil {
			return err
		}
		for _, id := range ids {
			n := p.nodes.at(id)
			if got, want := n.firstChild != 0, children[id] > 0; got != want {
				return fmt.Errorf("%d: firstChild %d, %d children", id, n.firstChild, children[id])
			}
			if want := p.classOf(id); n.class() != want {
				return fmt.Errorf("%d: class %d, want %d", id, n.class(), want)
			}
		}
		// Every slot's children list, held or not.
		linked := 0
		for pg, page := range p.nodes.pages {
			for s := range page {
				par := uint32(pg<<pageShift | s)
				prev := uint32(0)
				for k := page[s].firstChild; k != 0; k = p.nodes.at(k).sibs.next {
					kn := p.nodes.at(k)
					if kn.size == 0 || kn.parent != par {
						return fmt.Errorf("children of %d: %d (held %t, parent %d)", par, k, kn.size != 0, kn.parent)
					}
					if kn.sibs.prev != prev {
						return fmt.Errorf("children of %d: %d has sibs.prev %d, want %d", par, k, kn.sibs.prev, prev)
					}
					prev = k
					if linked++; linked > withParent {
						return fmt.Errorf("children of %d: a cycle", par)
					}
				}
				if page[s].size == 0 && page[s] != (prefixNode{firstChild: page[s].firstChild}) {
					return fmt.Errorf("%d: not held but %+v", par, page[s])
				}
			}
		}
		if linked != withParent {
			return fmt.Errorf("children lists link %d blocks, %d have a parent", linked, withParent)
		}
		return nil
	}
	return fmt.Errorf("unknown policy %T", p)
}

// checkTable returns the held blocks of t and checks them against c.
func checkTable[N any, P sized[N]](t *table[N], c *counts) (map[uint32]bool, error) {
	held := make(map[uint32]bool)
	var bytes int64
	for pg, page := range t.pages {
		if len(page) > pageLen {
			return nil, fmt.Errorf("page %d: %d slots", pg, len(page))
		}
		for s := range page {
			if size := P(&page[s]).blockSize(); size != 0 {
				id := uint32(pg<<pageShift | s)
				if id == 0 {
					return nil, fmt.Errorf("ID 0 held")
				}
				held[id] = true
				bytes += int64(size) - 1
			}
		}
	}
	if len(held) != c.n || bytes != c.bytes {
		return nil, fmt.Errorf("table holds %d blocks of %d bytes; counts say %d, %d", len(held), bytes, c.n, c.bytes)
	}
	return held, nil
}

// checkList verifies l's links and returns its blocks, front first.
func checkList[N any, P interface {
	linked[N]
	sized[N]
}](l *list, t *table[N]) ([]uint32, error) {
	var ids []uint32
	prev := uint32(0)
	for id := l.head; id != 0; id = lk[N, P](t, id).next {
		if P(t.get(id)) == nil || P(t.at(id)).blockSize() == 0 {
			return nil, fmt.Errorf("%d: listed but not held", id)
		}
		if got := lk[N, P](t, id).prev; got != prev {
			return nil, fmt.Errorf("%d: prev %d, want %d", id, got, prev)
		}
		ids = append(ids, id)
		prev = id
		if len(ids) > 1<<24 {
			return nil, fmt.Errorf("a cycle")
		}
	}
	if l.tail != prev {
		return nil, fmt.Errorf("tail %d, want %d", l.tail, prev)
	}
	return ids, nil
}

// checkHeap verifies h's order and positions and returns its blocks.
func checkHeap[N any, P interface {
	heaped[N]
	sized[N]
}](h *idHeap[N, P]) ([]uint32, error) {
	var ids []uint32
	for i := range uint32(h.len()) {
		id := h.id(i)
		n := P(h.nodes.get(id))
		if n == nil || n.blockSize() == 0 {
			return nil, fmt.Errorf("%d: in heap but not held", id)
		}
		if *n.heapPos() != i {
			return nil, fmt.Errorf("%d: pos %d at %d", id, *n.heapPos(), i)
		}
		if i > 0 && n.before(h.nodes.at(h.id((i-1)/2))) {
			return nil, fmt.Errorf("%d: before its heap parent", id)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// checkSeqs verifies that the held times are distinct and not ahead of the
// clock.
func checkSeqs(seqs map[uint32]uint32, c *seqClock) error {
	by := make(map[uint32]uint32)
	for id, s := range seqs {
		if s == 0 || s > c.now || s > c.limit {
			return fmt.Errorf("%d: seq %d, clock %d, limit %d", id, s, c.now, c.limit)
		}
		if o, dup := by[s]; dup {
			return fmt.Errorf("%d and %d: seq %d", id, o, s)
		}
		by[s] = id
	}
	return nil
}

// sameSet reports whether ids (no repeats) are exactly held.
func sameSet(ids []uint32, held map[uint32]bool, what string) error {
	seen := make(map[uint32]bool)
	for _, id := range ids {
		if seen[id] {
			return fmt.Errorf("%s: %d twice", what, id)
		}
		seen[id] = true
		if !held[id] {
			return fmt.Errorf("%s: %d not held", what, id)
		}
	}
	if len(seen) != len(held) {
		return fmt.Errorf("%s: %d blocks, %d held", what, len(seen), len(held))
	}
	return nil
}
