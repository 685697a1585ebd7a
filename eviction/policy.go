package eviction

import (
	"fmt"
	"strings"
	"time"
)

// ID names a block; the caller assigns it. IDs must be nonzero and at most
// MaxID, and should be dense: a policy keeps per-block state in tables
// indexed by ID, so its memory is proportional to the largest ID it has seen
// (Block.ID or Block.Parent), not to the number of blocks it holds. The pool
// uses its block table index plus one.
type ID uint64

// MaxID is the largest valid ID: policies link blocks by 32-bit IDs.
const MaxID ID = 1<<32 - 1

// MaxBytes is the largest valid Block.Bytes: policies keep a block's size in
// 32 bits, as Bytes+1 so that 0 can mean "no block".
const MaxBytes = 1<<32 - 2

// Block is what a policy knows about a block.
type Block struct {
	// ID names the block: 1 ≤ ID ≤ MaxID.
	ID ID
	// Bytes is the block's size, 0 ≤ Bytes ≤ MaxBytes (4 GiB − 2); it is
	// only summed by Policy.Bytes.
	Bytes int64
	// Parent is the previous block of its prefix chain; 0 = none or unknown.
	// At most MaxID. Only PrefixLRU reads it. A Parent equal to ID is
	// treated as 0.
	Parent ID
	// Expires is when the block's lease on the cache ends; zero = never.
	// Only TTL reads it. TTL keeps it as Unix nanoseconds, so it compares
	// expiries by wall clock (a monotonic reading is dropped), and clamps
	// times outside UnixNano's range (years 1678 to 2262) to its ends.
	Expires time.Time
	// Hash is a stable hash of the block's key, for frequency estimates; 0
	// means derive it from ID. Only LFU reads it. Set it when IDs are
	// reused for other keys (as the pool reuses table slots), so that
	// TinyLFU remembers keys, not slots.
	Hash uint64
}

// Kind names a policy. The zero value is invalid.
type Kind uint8

// The policies.
const (
	// LRU evicts the least recently added or touched block.
	LRU Kind = iota + 1
	// LFU evicts the block with the lowest estimated access frequency (ties by
	// LRU) and guards admission with TinyLFU.
	LFU
	// FIFO evicts the first added block; touches don't matter.
	FIFO
	// TTL evicts the earliest-expiring block (so expired blocks first), then
	// blocks that never expire in LRU order.
	TTL
	// PrefixLRU evicts orphans (blocks whose parent is gone) first, then
	// leaves of prefix chains, each in LRU order.
	PrefixLRU
)

// kinds lists every valid Kind in order.
var kinds = []Kind{LRU, LFU, FIFO, TTL, PrefixLRU}

var kindNames = [...]string{
	LRU:       "lru",
	LFU:       "lfu",
	FIFO:      "fifo",
	TTL:       "ttl",
	PrefixLRU: "prefix-lru",
}

// String returns the name ParseKind accepts, or "Kind(n)" for an invalid
// Kind.
func (k Kind) String() string {
	if k == 0 || int(k) >= len(kindNames) {
		return fmt.Sprintf("Kind(%d)", uint8(k))
	}
	return kindNames[k]
}

// ParseKind returns the Kind named s ("lru", "lfu", "fifo", "ttl",
// "prefix-lru"). The error lists the valid names.
func ParseKind(s string) (Kind, error) {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		if s == k.String() {
			return k, nil
		}
		names[i] = k.String()
	}
	return 0, fmt.Errorf("eviction: unknown policy %q (valid: %s)", s, strings.Join(names, ", "))
}

// MarshalText writes k by name, so a Kind can be a flag or a config value.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText parses a name as ParseKind does.
func (k *Kind) UnmarshalText(b []byte) error {
	v, err := ParseKind(string(b))
	if err == nil {
		*k = v
	}
	return err
}

// DefaultCounters is the default of Config.Counters.
const DefaultCounters = 4096

// Config tunes a policy. The zero value is valid and means the defaults.
type Config struct {
	// Counters is a capacity hint in blocks for LFU's frequency sketch: the
	// sketch has about this many counters per row, and ages (halves every
	// counter) after 10×Counters recorded accesses. Values ≤ 0 mean
	// DefaultCounters (4096). Other policies ignore it.
	Counters int
}

// Policy orders one tenant's blocks for eviction.
//
// A Policy only orders blocks: it never evicts on its own, holds no bytes and
// knows no capacity. The caller asks for a Victim, removes it from its own
// store, then calls Remove.
//
// IDs are table indexes: see ID. A policy's memory is proportional to the
// largest ID it has seen and never shrinks: per ID up to it, about 12 bytes
// for LRU and FIFO, 24 for LFU (plus its sketch), 24 for TTL and 32 for
// PrefixLRU, with no pointers for the garbage collector to scan.
//
// Not safe for concurrent use: the caller serializes. Policies start no
// goroutines, do no I/O and read no clock; time is passed in.
type Policy interface {
	// Kind returns the policy's Kind.
	Kind() Kind
	// Add records a newly stored block as the most recently used. Adding an
	// ID already present replaces it. Add panics if b.ID is 0, if b.ID or
	// b.Parent exceeds MaxID, or if b.Bytes is negative or exceeds
	// MaxBytes.
	Add(b Block, now time.Time)
	// Touch records a read of id (a hit). Unknown ids are ignored, except
	// that LFU counts an access to the hash derived from id (as for a block
	// added with Hash 0) in its sketch. A caller that sets Block.Hash should
	// call Miss on misses instead, and Touch only on hits.
	Touch(id ID, now time.Time)
	// Miss records an access to a key that is not stored, by its hash (see
	// Block.Hash). LFU counts it in its sketch, so a key missed often is
	// admitted; other policies ignore it. Call it on every miss, before
	// Admit and Add.
	Miss(hash uint64)
	// Remove forgets id (deleted or evicted). Unknown ids are ignored.
	Remove(id ID)
	// Victim returns the block to evict next, never one for which pinned(id)
	// is true (pinned may be nil). Pinned blocks stay in the policy. ok is
	// false when every block is pinned or there are none. Victim does not
	// remove the block: call Remove once it is evicted.
	Victim(now time.Time, pinned func(ID) bool) (id ID, ok bool)
	// Admit reports whether candidate (not yet added) should be stored when
	// storing it means evicting victim. LFU uses TinyLFU: the estimated
	// frequency of candidate's key (Hash, or derived from ID when 0) must
	// exceed that of victim's. Every other policy returns true.
	Admit(candidate Block, victim ID) bool
	// Rank appends every block held to out, coldest first, and returns
	// it: the order Victim would take them in with nothing pinned, were
	// nothing touched or removed meanwhile. LFU orders by estimated
	// frequency now, then by last use (Victim notices an estimate that
	// aging lowered only when it reaches the block's bucket, so it may
	// differ); PrefixLRU by its classes as they
	// stand (removing a block can change its neighbours' classes). Rank
	// does not change the policy; it costs O(n log n). A drain hands off
	// the hottest blocks first: Rank's order, read from the back.
	Rank(out []ID) []ID
	// Len returns the number of blocks held.
	Len() int
	// Bytes returns the sum of Block.Bytes over the blocks held.
	Bytes() int64
}

// New returns an empty policy of kind k. It panics if k is invalid; use
// ParseKind to validate names.
func New(k Kind, cfg Config) Policy {
	switch k {
	case LRU:
		return newLRU(LRU)
	case FIFO:
		return newLRU(FIFO)
	case LFU:
		return newLFU(cfg)
	case TTL:
		return newTTL()
	case PrefixLRU:
		return newPrefix()
	}
	panic(fmt.Sprintf("eviction: New with invalid %v", k))
}

// counts holds the accounting every policy shares.
type counts struct {
	n     int
	bytes int64
}

// Len implements Policy.
func (c *counts) Len() int { return c.n }

// Bytes implements Policy.
func (c *counts) Bytes() int64 { return c.bytes }

// add counts a block of encoded size size (see checkBlock).
func (c *counts) add(size uint32) {
	c.n++
	c.bytes += int64(size) - 1
}

// sub uncounts a block of encoded size size.
func (c *counts) sub(size uint32) {
	c.n--
	c.bytes -= int64(size) - 1
}

// checkBlock validates b for Add and returns its ID and Parent as table
// indexes (parent 0 when b.Parent is 0 or b.ID) and its size encoded as
// Bytes+1, so that a zero size means "no block".
func checkBlock(b *Block) (id, parent, size uint32) {
	switch {
	case b.ID == 0:
		panic("eviction: Add with zero ID")
	case b.ID > MaxID:
		panic(fmt.Sprintf("eviction: Add with ID %d > MaxID", b.ID))
	case b.Parent > MaxID:
		panic(fmt.Sprintf("eviction: Add of %d with Parent %d > MaxID", b.ID, b.Parent))
	case b.Bytes < 0 || b.Bytes > MaxBytes:
		panic(fmt.Sprintf("eviction: Add of %d with Bytes %d outside [0, MaxBytes]", b.ID, b.Bytes))
	}
	id = uint32(b.ID)
	if b.Parent != b.ID {
		parent = uint32(b.Parent)
	}
	return id, parent, uint32(b.Bytes) + 1
}

// index returns id as a table index, or ok false if no block can have it.
func index(id ID) (i uint32, ok bool) {
	return uint32(id), id != 0 && id <= MaxID
}

// isPinned calls pinned, which may be nil.
func isPinned(pinned func(ID) bool, id uint32) bool {
	return pinned != nil && pinned(ID(id))
}
