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
	// Evictions counts the blocks evicted so far.
	Evictions int

	policy eviction.Policy
	held   map[uint64]bool
	pins   map[uint64]int
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
	pinned := func(x eviction.ID) bool { return t.pins[uint64(x-1)] > 0 }
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
		for len(t.held) >= t.Capacity {
			victim, ok := t.policy.Victim(now, pinned)
			if !ok || !t.policy.Admit(blk, victim) {
				return i
			}
			t.policy.Remove(victim)
			delete(t.held, uint64(victim-1))
			t.Evictions++
		}
		t.policy.Add(blk, now)
		t.held[b] = true
	}
	return len(chain)
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
