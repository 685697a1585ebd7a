package eviction

// link is a block's place on a list: the IDs of its neighbours, 0 for none.
type link struct{ prev, next uint32 }

// linked is a pointer to a node type that holds a link.
type linked[N any] interface {
	*N
	links() *link
}

// list is a doubly linked list of blocks through the links of their nodes
// in a table, by ID. head is the front, the most recently used end, tail the
// back, the least recently used one; 0 means none. A block on no list has a
// zero link. The zero list is empty and ready.
type list struct{ head, tail uint32 }

// lk returns the link of id's node.
func lk[N any, P linked[N]](t *table[N], id uint32) *link { return P(t.at(id)).links() }

// pushFront makes id the front of l. REQUIRES: id is on no list.
func pushFront[N any, P linked[N]](l *list, t *table[N], id uint32) {
	insertFrontOf[N, P](l, t, id, l.head)
}

// insertFrontOf puts id on l just in front of at (towards the front), or at
// the back if at is 0. REQUIRES: id is on no list; at is 0 or on l.
func insertFrontOf[N any, P linked[N]](l *list, t *table[N], id, at uint32) {
	e := lk[N, P](t, id)
	if at == 0 {
		e.prev, e.next = l.tail, 0
	} else {
		e.prev, e.next = lk[N, P](t, at).prev, at
	}
	if e.prev == 0 {
		l.head = id
	} else {
		lk[N, P](t, e.prev).next = id
	}
	if e.next == 0 {
		l.tail = id
	} else {
		lk[N, P](t, e.next).prev = id
	}
}

// remove takes id off l. l is only read when id is its head or tail, so it
// may be nil for a block with both neighbours. REQUIRES: id is on l.
func remove[N any, P linked[N]](l *list, t *table[N], id uint32) {
	e := lk[N, P](t, id)
	if e.prev == 0 {
		l.head = e.next
	} else {
		lk[N, P](t, e.prev).next = e.next
	}
	if e.next == 0 {
		l.tail = e.prev
	} else {
		lk[N, P](t, e.next).prev = e.prev
	}
	*e = link{}
}

// moveToFront makes id, which is on l, the front.
func moveToFront[N any, P linked[N]](l *list, t *table[N], id uint32) {
	if l.head != id {
		remove[N, P](l, t, id)
		pushFront[N, P](l, t, id)
	}
}

// appendBackToFront appends l's IDs from the back, the least recently
// used end, to the front.
func appendBackToFront[N any, P linked[N]](out []ID, l *list, t *table[N]) []ID {
	for id := l.tail; id != 0; id = lk[N, P](t, id).prev {
		out = append(out, ID(id))
	}
	return out
}

// lastUnpinned returns the block nearest the back of l that is not pinned,
// or 0. It costs O(pinned blocks skipped).
func lastUnpinned[N any, P linked[N]](l *list, t *table[N], pinned func(ID) bool) uint32 {
	for id := l.tail; id != 0; id = lk[N, P](t, id).prev {
		if !isPinned(pinned, id) {
			return id
		}
	}
	return 0
}
