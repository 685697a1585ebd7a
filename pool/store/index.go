package store

import (
	"bytes"
	"fmt"
	"hash/maphash"
)

// The block index is built to hold millions of small blocks without
// slowing the garbage collector: every structure below is a slice of
// pointer-free values, so the collector never scans it, and a block costs
// about 100 bytes of Go heap in all (measured by BenchmarkIndexMemory):
//
//	entry            40 B   (entries, in chunks of 4096)
//	table slot       8 B    at a load factor between 3/8 and 3/4
//	key bytes        len(key) rounded up to 8
//	allocator        16 B per arena page
//
// NB: nothing here is safe for concurrent use; the Store's mutex guards it.

// entry is one block: committed and indexed, or removed but still pinned
// by readers (state dead), in which case its pages are freed on the last
// release.
type entry struct {
	hash   uint64 // of (namespace id, key); the table's home slot
	page   uint32 // first arena page of the value
	size   uint32 // value length in bytes
	crc    uint32 // CRC-32C of the value, taken at commit
	keyRef uint32 // slot in the key arena's class for keyLen
	ns     uint32 // namespace id
	gen    uint32 // bumped on reuse, so stale pin handles are caught
	pins   uint16 // readers holding the value's bytes
	keyLen uint8
	state  uint8
	// parent is the eviction id (index+1) of the block before this one in
	// its prefix chain, 0 if unknown (learned by Store.Locate).
	parent uint32
	// reads counts the block's reads in its low 7 bits (saturating) for
	// the disk tier's admission; readsOffered is set once the block was
	// offered to the disk. The entry is 48 bytes.
	reads uint8
}

const (
	readsMask    = 0x7f
	readsOffered = 0x80
)

const (
	stateFree uint8 = iota
	stateLive
	stateDead
)

const entryChunk = 4096

// entryTable stores entries in fixed chunks so growth never copies them and
// never leaves a doubled backing array behind.
type entryTable struct {
	chunks [][]entry
	free   []uint32 // recycled indexes
	n      uint32   // indexes handed out
}

func (t *entryTable) alloc() uint32 {
	if k := len(t.free); k > 0 {
		i := t.free[k-1]
		t.free = t.free[:k-1]
		return i
	}
	if int(t.n/entryChunk) == len(t.chunks) {
		t.chunks = append(t.chunks, make([]entry, entryChunk))
	}
	i := t.n
	t.n++
	return i
}

func (t *entryTable) at(i uint32) *entry { return &t.chunks[i/entryChunk][i%entryChunk] }

func (t *entryTable) release(i uint32) {
	e := t.at(i)
	gen := e.gen + 1
	*e = entry{gen: gen}
	t.free = append(t.free, i)
}

// keyArena stores keys by size class: class c holds keys of 8c+1..8c+8
// bytes in slots of 8c+8 bytes.
type keyArena struct {
	classes [MaxKeyClasses]keyClass
}

// MaxKeyClasses covers keys up to api.MaxKeyBytes (128) in steps of 8.
const MaxKeyClasses = 16

type keyClass struct {
	chunks [][]byte
	free   []uint32
	n      uint32
}

const keyChunkBytes = 64 << 10

func keyClassOf(n int) (class, slot int) { c := (n - 1) / 8; return c, 8 * (c + 1) }

func (a *keyArena) store(key []byte) uint32 {
	c, slot := keyClassOf(len(key))
	kc := &a.classes[c]
	var ref uint32
	if k := len(kc.free); k > 0 {
		ref = kc.free[k-1]
		kc.free = kc.free[:k-1]
	} else {
		perChunk := uint32(keyChunkBytes / slot)
		if int(kc.n/perChunk) == len(kc.chunks) {
			kc.chunks = append(kc.chunks, make([]byte, int(perChunk)*slot))
		}
		ref = kc.n
		kc.n++
	}
	copy(a.slot(len(key), ref), key)
	return ref
}

// slot returns the bytes of key ref of length n.
func (a *keyArena) slot(n int, ref uint32) []byte {
	c, slot := keyClassOf(n)
	perChunk := uint32(keyChunkBytes / slot)
	chunk := a.classes[c].chunks[ref/perChunk]
	off := int(ref%perChunk) * slot
	return chunk[off : off+n : off+n]
}

func (a *keyArena) release(n int, ref uint32) {
	c, _ := keyClassOf(n)
	a.classes[c].free = append(a.classes[c].free, ref)
}

// index maps (namespace id, key) to an entry: open addressing with linear
// probing and backward-shift deletion (no tombstones). A slot holds the
// upper 32 bits of the hash as a tag and the entry index plus one; zero is
// an empty slot.
type index struct {
	seed    maphash.Seed
	slots   []uint64
	mask    uint64
	count   int
	entries entryTable
	keys    keyArena
}

const minIndexSlots = 1024

func newIndex() *index {
	return &index{seed: maphash.MakeSeed(), slots: make([]uint64, minIndexSlots), mask: minIndexSlots - 1}
}

func (x *index) hash(ns uint32, key []byte) uint64 {
	h := maphash.Bytes(x.seed, key)
	h ^= uint64(ns) * 0x9e3779b97f4a7c15
	h ^= h >> 29
	return h
}

func slotOf(hash uint64, idx uint32) uint64 { return hash&^0xffffffff | uint64(idx+1) }

// lookup returns the entry index holding (ns, key).
func (x *index) lookup(ns uint32, key []byte) (uint32, bool) {
	h := x.hash(ns, key)
	tag := h &^ 0xffffffff
	for i := h & x.mask; ; i = (i + 1) & x.mask {
		s := x.slots[i]
		if s == 0 {
			return 0, false
		}
		if s&^0xffffffff != tag {
			continue
		}
		idx := uint32(s) - 1
		e := x.entries.at(idx)
		if e.ns == ns && int(e.keyLen) == len(key) && bytes.Equal(x.keys.slot(len(key), e.keyRef), key) {
			return idx, true
		}
	}
}

// insert adds a new entry for (ns, key), which must not be present, and
// returns its index.
func (x *index) insert(ns uint32, key []byte) uint32 {
	if (x.count+1)*4 > len(x.slots)*3 {
		x.grow()
	}
	idx := x.entries.alloc()
	e := x.entries.at(idx)
	e.hash = x.hash(ns, key)
	e.ns = ns
	e.keyLen = uint8(len(key))
	e.keyRef = x.keys.store(key)
	x.place(e.hash, idx)
	x.count++
	return idx
}

func (x *index) place(hash uint64, idx uint32) {
	i := hash & x.mask
	for x.slots[i] != 0 {
		i = (i + 1) & x.mask
	}
	x.slots[i] = slotOf(hash, idx)
}

func (x *index) grow() {
	old := x.slots
	x.slots = make([]uint64, 2*len(old))
	x.mask = uint64(len(x.slots) - 1)
	for _, s := range old {
		if s != 0 {
			idx := uint32(s) - 1
			x.place(x.entries.at(idx).hash, idx)
		}
	}
}

// unlink removes entry idx from the table; the entry itself stays until
// releaseEntry, because pinned readers may still use it.
func (x *index) unlink(idx uint32) {
	e := x.entries.at(idx)
	want := slotOf(e.hash, idx)
	i := e.hash & x.mask
	for x.slots[i] != want {
		if x.slots[i] == 0 {
			panic(fmt.Sprintf("store: index entry %d missing from its table", idx))
		}
		i = (i + 1) & x.mask
	}
	// Backward-shift: pull later members of the probe run into the hole
	// when the hole lies between their home slot and where they sit.
	for {
		x.slots[i] = 0
		j := i
		for {
			j = (j + 1) & x.mask
			s := x.slots[j]
			if s == 0 {
				x.count--
				return
			}
			home := x.entries.at(uint32(s)-1).hash & x.mask
			// Move s into the hole at i unless its home lies cyclically in (i, j].
			if (j-home)&x.mask >= (j-i)&x.mask {
				x.slots[i] = s
				i = j
				break
			}
		}
	}
}

// releaseEntry frees an unlinked entry and its key bytes.
func (x *index) releaseEntry(idx uint32) {
	e := x.entries.at(idx)
	x.keys.release(int(e.keyLen), e.keyRef)
	x.entries.release(idx)
}

// key returns the stored key bytes of entry idx.
func (x *index) key(idx uint32) []byte {
	e := x.entries.at(idx)
	return x.keys.slot(int(e.keyLen), e.keyRef)
}
