package sim

import (
	"time"

	"github.com/kvpool/kvpool/eviction"
)

// Tier is one cache tier of a node, GPU memory or the node's kvpool host
// memory: up to Capacity blocks, evicted in the order an eviction policy
// (package eviction, the daemons' own) gives. Blocks in use by a running
// request are pinned and never evicted. Not safe for concurrent use.
type Tier struct {
	// Capacity is how many blocks fit.
	Capacity int
	// Evictions and Insertions count the blocks evicted and stored so
	// far: what an engine's KV events would announce.
	Evictions, Insertions int

	policy eviction.Policy
	held   map[uint64]bool
	pins   map[uint64]int
	// reserved blocks are memory running requests use beyond the chain
	// blocks they pin (their answers and the prompt's partial last block).
	reserved int
}

// NewTier returns an empty tier of capacity blocks under policy kind.
func NewTier(capacity int, kind eviction.Kind) *Tier {
	return &Tier{Capacity: capacity, policy: eviction.New(kind, eviction.Config{Counters: max(capacity, 64)}),
		held: map[uint64]bool{}, pins: map[uint64]int{}}
}

// at is simulated time as the eviction policies take it. Their only use
// of it is ordering (and TTL expiries), so the epoch does not matter.
func at(s float64) time.Time { return time.Unix(0, int64(s*1e9)) }

// id maps a trace block id to a policy id (policies reserve 0).
func id(b uint64) eviction.ID { return eviction.ID(b + 1) }

// Len is how many blocks the tier holds.
func (t *Tier) Len() int { return len(t.held) }

// Has reports whether the tier holds block b.
func (t *Tier) Has(b uint64) bool { return t.held[b] }

// Held returns how many leading blocks of chain the tier holds, without
// recording an access: what a router sees.
func (t *Tier) Held(chain []uint64) int {
	for i, b := range chain {
		if !t.held[b] {
			return i
		}
	}
	return len(chain)
}

// Prefix returns how many leading blocks of chain the tier holds, and
// records a read of each (a hit) and a miss of the first it lacks.
func (t *Tier) Prefix(chain []uint64, nowS float64) int {
	for i, b := range chain {
		if !t.held[b] {
			t.policy.Miss(uint64(id(b)))
			return i
		}
		t.policy.Touch(id(b), at(nowS))
	}
	return len(chain)
}

// Insert stores the blocks of chain from index from on (those it lacks),
// evicting unpinned blocks as the policy orders them. It stops at the
// first block it cannot make room for (every block pinned, or the policy
// refuses admission) and returns how many leading blocks of chain the
// tier then holds.
func (t *Tier) Insert(chain []uint64, from int, nowS float64) int {
	now := at(nowS)
	for i := from; i < len(chain); i++ {
		b := chain[i]
		if t.held[b] {
			continue
		}
		var parent eviction.ID
		if i > 0 {
			parent = id(chain[i-1])
		}
		blk := eviction.Block{ID: id(b), Parent: parent, Bytes: 1, Hash: uint64(id(b))}
		if !t.evict(now, &blk, 1) {
			return i
		}
		t.policy.Add(blk, now)
		t.held[b] = true
		t.Insertions++
	}
	return len(chain)
}

// evict evicts unpinned blocks until need more fit, for candidate (nil:
// for a reservation, which the policy does not judge). It reports false
// when it cannot: every block left is pinned, or the policy will not
// admit candidate over its victim.
func (t *Tier) evict(now time.Time, candidate *eviction.Block, need int) bool {
	pinned := func(x eviction.ID) bool { return t.pins[uint64(x-1)] > 0 }
	for len(t.held)+t.reserved+need > t.Capacity {
		victim, ok := t.policy.Victim(now, pinned)
		if !ok || (candidate != nil && !t.policy.Admit(*candidate, victim)) {
			return false
		}
		t.policy.Remove(victim)
		delete(t.held, uint64(victim-1))
		t.Evictions++
	}
	return true
}

// Reserve sets n blocks of memory aside, evicting unpinned blocks for
// them; it reports false, reserving nothing, when that would need
// evicting a pinned block.
func (t *Tier) Reserve(n int, nowS float64) bool {
	if len(t.pins)+t.reserved+n > t.Capacity {
		return false
	}
	if !t.evict(at(nowS), nil, n) {
		return false
	}
	t.reserved += n
	return true
}

// Release returns n reserved blocks.
func (t *Tier) Release(n int) { t.reserved -= n }

// Fits reports whether n more blocks could be reserved and extra chain
// blocks pinned without evicting a pinned block.
func (t *Tier) Fits(n int) bool { return len(t.pins)+t.reserved+n <= t.Capacity }

// Unpinned counts the blocks of chain[:n] that are not pinned.
func (t *Tier) Unpinned(chain []uint64) int {
	c := 0
	for _, b := range chain {
		if t.pins[b] == 0 {
			c++
		}
	}
	return c
}

// Pin keeps the leading n blocks of chain from eviction until Unpin.
func (t *Tier) Pin(chain []uint64, n int) {
	for _, b := range chain[:n] {
		t.pins[b]++
	}
}

// Unpin undoes Pin.
func (t *Tier) Unpin(chain []uint64, n int) {
	for _, b := range chain[:n] {
		if t.pins[b]--; t.pins[b] <= 0 {
			delete(t.pins, b)
		}
	}
}
