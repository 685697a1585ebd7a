package eviction

import (
	"container/heap"
	"math"
	"time"
)

// Request is one request of a trace: the prefix chain of blocks it reads,
// in order, so Blocks[i]'s parent is Blocks[i-1]. Blocks are equal-sized.
type Request struct {
	// At is when the request arrives, since the start of the trace.
	At time.Duration
	// Blocks is the request's chain of block IDs, all nonzero.
	Blocks []ID
}

// ReplayResult counts what a replay saw.
type ReplayResult struct {
	// Requests is the number of requests replayed.
	Requests int
	// Blocks is the number of block lookups: the sum of len(Blocks).
	Blocks int64
	// PrefixHits counts, over requests, the leading blocks present before
	// the request's first miss: what an engine can reuse.
	PrefixHits int64
	// BlockHits counts every block found present, prefix or not.
	BlockHits int64
	// Evictions counts blocks evicted to make room.
	Evictions int64
	// Rejected counts missed blocks not stored: refused by Admit (LFU,
	// Belady's bypass), or no unpinned victim.
	Rejected int64
}

// PrefixHitRatio returns PrefixHits/Blocks, or 0 with no blocks.
func (r ReplayResult) PrefixHitRatio() float64 { return ratio(r.PrefixHits, r.Blocks) }

// BlockHitRatio returns BlockHits/Blocks, or 0 with no blocks.
func (r ReplayResult) BlockHitRatio() float64 { return ratio(r.BlockHits, r.Blocks) }

func ratio(n, d int64) float64 {
	if d == 0 {
		return 0
	}
	return float64(n) / float64(d)
}

// replayEpoch is the wall time of a trace's start in Replay.
var replayEpoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// Replay simulates a cache of capacityBlocks equal-sized blocks ordered by a
// policy of kind k (with Config.Counters = capacityBlocks) over reqs, in
// order.
//
// For each request, every block is looked up in order. A present block is
// a hit, reported by Touch; the leading hits before the first miss are
// prefix hits. A miss is reported by Miss, so LFU's sketch sees misses too. A missing
// block is stored with its parent (the previous block of the request): if
// the cache is full, the policy's Victim is evicted first, unless Admit
// refuses the block, in which case it is not stored. The request's own
// blocks are pinned while it is replayed, as an engine pins the blocks it
// is reading.
//
// ttl, if nonzero, sets each stored block's Expires to its store time plus
// ttl, fixed (hits don't extend it). A lookup of an expired block is a
// miss, and the block is stored again, as if the pool's sweep had removed
// it. Only the TTL policy orders by Expires.
func Replay(reqs []Request, k Kind, capacityBlocks int, ttl time.Duration) ReplayResult {
	var r ReplayResult
	if capacityBlocks <= 0 {
		return r
	}
	c := newReplayCache(k, capacityBlocks)
	for _, req := range reqs {
		now := replayEpoch.Add(req.At)
		c.pin(req.Blocks)
		r.Requests++
		prefix := true
		for i, id := range req.Blocks {
			r.Blocks++
			if c.lookup(id, now) {
				r.BlockHits++
				if prefix {
					r.PrefixHits++
				}
				continue
			}
			prefix = false
			b := chainBlock(req.Blocks, i)
			if ttl > 0 {
				b.Expires = now.Add(ttl)
			}
			victim, stored := c.store(b, now)
			if victim != 0 {
				r.Evictions++
			}
			if !stored {
				r.Rejected++
			}
		}
	}
	return r
}

// replayCache is the cache Replay simulates, and ReplayTiers' memory tier:
// capacity equal-sized blocks ordered by a policy, with the blocks of the
// request being replayed pinned.
type replayCache struct {
	p        Policy
	capacity int // in blocks, > 0
	// expires holds the blocks present and their Expires.
	expires map[ID]time.Time
	// cur holds the blocks of the request being replayed: the pinned ones.
	cur    map[ID]struct{}
	pinned func(ID) bool
}

// newReplayCache returns an empty cache of capacity > 0 blocks ordered by
// a policy of kind k, with Config.Counters = capacity.
func newReplayCache(k Kind, capacity int) *replayCache {
	c := &replayCache{
		p:        New(k, Config{Counters: capacity}),
		capacity: capacity,
		expires:  make(map[ID]time.Time, capacity),
		cur:      make(map[ID]struct{}),
	}
	c.pinned = func(id ID) bool { _, ok := c.cur[id]; return ok }
	return c
}

// pin pins blocks, the request about to be replayed, in place of the
// previous request's.
func (c *replayCache) pin(blocks []ID) {
	clear(c.cur)
	for _, id := range blocks {
		c.cur[id] = struct{}{}
	}
}

// lookup reports whether id is present at now. A present block is touched
// (a hit). An expired block is removed first, so it is missing, as if the
// pool's sweep had removed it. A missing block is reported to Miss: trace
// blocks are added with Hash 0, so a block's key hash is the one derived
// from its ID.
func (c *replayCache) lookup(id ID, now time.Time) bool {
	if exp, ok := c.expires[id]; ok && !exp.IsZero() && !now.Before(exp) {
		c.p.Remove(id)
		delete(c.expires, id)
	}
	if _, ok := c.expires[id]; ok {
		c.p.Touch(id, now)
		return true
	}
	c.p.Miss(hashID(id))
	return false
}

// store adds b, missing, at now. If the cache is full, the policy's
// Victim is evicted first, unless there is none unpinned or Admit refuses
// b: then b is not stored (stored false). victim is the block evicted, 0
// if none.
func (c *replayCache) store(b Block, now time.Time) (victim ID, stored bool) {
	if len(c.expires) >= c.capacity {
		v, ok := c.p.Victim(now, c.pinned)
		if !ok || !c.p.Admit(b, v) {
			return 0, false
		}
		c.p.Remove(v)
		delete(c.expires, v)
		victim = v
	}
	c.p.Add(b, now)
	c.expires[b.ID] = b.Expires
	return victim, true
}

// chainBlock returns the block blocks[i] of a request, with blocks[i-1] as
// its parent.
func chainBlock(blocks []ID, i int) Block {
	b := Block{ID: blocks[i], Bytes: 1}
	if i > 0 {
		b.Parent = blocks[i-1]
	}
	return b
}

// Belady replays reqs like Replay, but with Belady's offline optimum (MIN)
// in place of a policy: on a miss with a full cache it evicts the block
// whose next use is farthest in the future, or stores nothing if the
// missed block's own next use is farther still (bypass). Nothing is pinned
// and nothing expires.
//
// Belady maximises BlockHits over every way of managing the cache, so no
// policy's BlockHits can exceed it. It is not proven optimal for
// PrefixHits, where a hit counts only if all earlier blocks of the request
// hit too, but is a strong reference for them.
func Belady(reqs []Request, capacityBlocks int) ReplayResult {
	var r ReplayResult
	if capacityBlocks <= 0 {
		return r
	}
	// next[i] is the position of the next access to the block accessed at
	// position i (positions number all block accesses in order), or
	// math.MaxInt if none.
	var n int
	for _, req := range reqs {
		n += len(req.Blocks)
	}
	next := make([]int, n)
	last := make(map[ID]int)
	pos := n
	for i := len(reqs) - 1; i >= 0; i-- {
		bs := reqs[i].Blocks
		for j := len(bs) - 1; j >= 0; j-- {
			pos--
			next[pos] = math.MaxInt
			if q, ok := last[bs[j]]; ok {
				next[pos] = q
			}
			last[bs[j]] = pos
		}
	}
	clear(last)
	// cache maps each present block to its item in h, a max-heap by next
	// use.
	cache := make(map[ID]*beladyItem, capacityBlocks)
	var h beladyHeap
	pos = 0
	for _, req := range reqs {
		r.Requests++
		prefix := true
		for _, id := range req.Blocks {
			r.Blocks++
			nu := next[pos]
			pos++
			if it := cache[id]; it != nil {
				r.BlockHits++
				if prefix {
					r.PrefixHits++
				}
				it.next = nu
				heap.Fix(&h, it.idx)
				continue
			}
			prefix = false
			if len(cache) >= capacityBlocks {
				if h[0].next <= nu {
					r.Rejected++
					continue
				}
				v := heap.Pop(&h).(*beladyItem)
				delete(cache, v.id)
				r.Evictions++
			}
			it := &beladyItem{id: id, next: nu}
			cache[id] = it
			heap.Push(&h, it)
		}
	}
	return r
}

type beladyItem struct {
	id   ID
	next int // position of the next access
	idx  int // index in beladyHeap
}

// beladyHeap is a max-heap of cached blocks by next use.
type beladyHeap []*beladyItem

func (h beladyHeap) Len() int           { return len(h) }
func (h beladyHeap) Less(i, j int) bool { return h[i].next > h[j].next }
func (h beladyHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx = i
	h[j].idx = j
}
func (h *beladyHeap) Push(x any) {
	it := x.(*beladyItem)
	it.idx = len(*h)
	*h = append(*h, it)
}
func (h *beladyHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}
