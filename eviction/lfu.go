package eviction

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/dgraph-io/ristretto/v2/z"
)

// maxFreq is the largest estimate: a saturated sketch counter plus the
// doorkeeper's bit.
const maxFreq = counterMax + 1

// lfuNode is what LFU keeps per ID: 24 bytes.
type lfuNode struct {
	// link places the block in its bucket. NB: the node does not record
	// which bucket (there is no room in 24 bytes); only a block at an end
	// of its bucket needs to know, and finds it with bucketOf.
	link
	// size is Bytes+1; 0 means no block.
	size uint32
	// seq is the logical time of the block's last Add or Touch.
	seq uint32
	// hash is the block's key hash: Block.Hash, or hashID(ID) if that was
	// 0. Frequencies are the key's, not the ID's.
	hash uint64
}

func (n *lfuNode) links() *link      { return &n.link }
func (n *lfuNode) blockSize() uint32 { return n.size }

// lfu is LFU with TinyLFU admission.
//
// Frequencies are estimated, not kept per block, and belong to keys (by
// hash), not IDs: every access (Touch of a held block, or Miss) is recorded
// first in the doorkeeper, a Bloom filter, and only from the second access
// on in the count-min sketch; the estimate is the sketch's plus one if the
// doorkeeper has the key. After 10×Counters recorded accesses the sketch is
// halved and the doorkeeper cleared, so old popularity fades. Add records
// nothing, as in ristretto: the access that led to storing a block was
// recorded by the Miss.
//
// Blocks sit in buckets by estimate, each an LRU list, so Victim takes the
// back of the lowest nonempty bucket: the lowest estimate, ties by LRU.
// A block's bucket is set when it is added or touched, and every block is
// re-bucketed when the sketch ages. Between agings an estimate can still
// grow through sketch collisions with other keys; Victim checks each
// candidate's estimate and moves a stale one up to its bucket (by recency)
// before going on, so the answer is exact.
type lfu struct {
	counts
	clock  seqClock
	nodes  table[lfuNode]
	sketch sketch
	door   *z.Bloom
	// buckets[f] holds the blocks whose estimate was f when last placed,
	// most recently used in front. INVARIANT: each bucket is ordered by
	// seq, and a block's estimate is at least its bucket (estimates only
	// grow between agings, and aging re-buckets every block).
	buckets [maxFreq + 1]list
	// recorded counts accesses since the last aging; at ageAt the sketch
	// ages.
	recorded, ageAt int
}

func newLFU(cfg Config) *lfu {
	n := cfg.Counters
	if n <= 0 {
		n = DefaultCounters
	}
	return &lfu{
		clock:  seqClock{limit: math.MaxUint32},
		sketch: newSketch(n),
		door:   z.NewBloomFilter(float64(n), 0.01),
		ageAt:  10 * n,
	}
}

// Kind implements Policy.
func (p *lfu) Kind() Kind { return LFU }

// estimate returns the estimated frequency of h.
func (p *lfu) estimate(h uint64) uint8 {
	f := p.sketch.estimate(h)
	if p.door.Has(h) {
		f++
	}
	return f
}

// record counts one access to h, ageing the sketch when due.
func (p *lfu) record(h uint64) {
	if !p.door.AddIfNotHas(h) {
		p.sketch.increment(h)
	}
	p.recorded++
	if p.recorded >= p.ageAt {
		p.age()
	}
}

// age halves the sketch, clears the doorkeeper and re-buckets every block
// by its new estimate, keeping LRU order within buckets: it merges the old
// buckets oldest first, which needs no scratch memory.
func (p *lfu) age() {
	p.recorded = 0
	p.sketch.halve()
	p.door.Clear()
	old := p.buckets
	p.buckets = [maxFreq + 1]list{}
	for {
		f := -1
		for i := range old {
			if t := old[i].tail; t != 0 && (f < 0 || p.nodes.at(t).seq < p.nodes.at(old[f].tail).seq) {
				f = i
			}
		}
		if f < 0 {
			return
		}
		id := old[f].tail
		remove(&old[f], &p.nodes, id)
		pushFront(&p.buckets[p.estimate(p.nodes.at(id).hash)], &p.nodes, id)
	}
}

// tick advances the logical clock, renumbering first if it is full.
func (p *lfu) tick() uint32 {
	if p.clock.due() {
		stamps := make([]stamp, 0, p.n)
		for f := range p.buckets {
			for id := p.buckets[f].head; id != 0; id = p.nodes.at(id).next {
				stamps = append(stamps, stamp{p.nodes.at(id).seq, id})
			}
		}
		p.clock.renumber(stamps, func(id, seq uint32) { p.nodes.at(id).seq = seq })
	}
	return p.clock.tick()
}

// bucketOf returns the bucket of id, found among the buckets' ends.
// REQUIRES: id is the head or the tail of its bucket.
func (p *lfu) bucketOf(id uint32) int {
	for f := range p.buckets {
		if b := &p.buckets[f]; b.head == id || b.tail == id {
			return f
		}
	}
	panic("eviction: LFU block at no bucket's end")
}

// unbucket takes id off its bucket. REQUIRES: id is held.
func (p *lfu) unbucket(id uint32) {
	var b *list // only needed at an end of the bucket
	if e := p.nodes.at(id).link; e.prev == 0 || e.next == 0 {
		b = &p.buckets[p.bucketOf(id)]
	}
	remove(b, &p.nodes, id)
}

// Add implements Policy.
func (p *lfu) Add(b Block, _ time.Time) {
	id, _, size := checkBlock(&b)
	p.Remove(b.ID)
	h := b.Hash
	if h == 0 {
		h = hashID(b.ID)
	}
	seq := p.tick()
	*p.nodes.grow(id) = lfuNode{size: size, seq: seq, hash: h}
	p.add(size)
	pushFront(&p.buckets[p.estimate(h)], &p.nodes, id)
}

// Touch implements Policy.
func (p *lfu) Touch(id ID, _ time.Time) {
	i, n := held(&p.nodes, id)
	if n == nil {
		p.record(hashID(id))
		return
	}
	p.record(n.hash)
	n.seq = p.tick()
	p.unbucket(i)
	pushFront(&p.buckets[p.estimate(n.hash)], &p.nodes, i)
}

// Miss implements Policy.
func (p *lfu) Miss(hash uint64) { p.record(hash) }

// Remove implements Policy.
func (p *lfu) Remove(id ID) {
	if i, n := held(&p.nodes, id); n != nil {
		p.unbucket(i)
		p.sub(n.size)
		*n = lfuNode{}
	}
}

// Victim implements Policy.
func (p *lfu) Victim(_ time.Time, pinned func(ID) bool) (ID, bool) {
	for f := range p.buckets {
		b := &p.buckets[f]
		for id := b.tail; id != 0; {
			next := p.nodes.at(id).prev
			if !isPinned(pinned, id) {
				est := p.estimate(p.nodes.at(id).hash)
				if int(est) <= f {
					return ID(id), true
				}
				p.rebucket(id, f, est)
			}
			id = next
		}
	}
	return 0, false
}

// Rank implements Policy: by estimate now (which aging may have lowered
// below a block's bucket), then the older use first, as Victim takes them.
func (p *lfu) Rank(out []ID) []ID {
	start := len(out)
	for f := range p.buckets {
		out = appendBackToFront(out, &p.buckets[f], &p.nodes)
	}
	slices.SortStableFunc(out[start:], func(a, b ID) int {
		na, nb := p.nodes.at(uint32(a)), p.nodes.at(uint32(b))
		if c := cmp.Compare(p.estimate(na.hash), p.estimate(nb.hash)); c != 0 {
			return c
		}
		return cmp.Compare(na.seq, nb.seq)
	})
	return out
}

// rebucket moves id from bucket from to bucket to, keeping that bucket
// ordered by seq. It walks from the back, where the stale blocks Victim
// finds usually belong.
func (p *lfu) rebucket(id uint32, from int, to uint8) {
	remove(&p.buckets[from], &p.nodes, id)
	b := &p.buckets[to]
	seq := p.nodes.at(id).seq
	// at becomes the most recent block older than id, or 0 if none.
	var at uint32
	for x := b.tail; x != 0 && p.nodes.at(x).seq < seq; x = p.nodes.at(x).prev {
		at = x
	}
	insertFrontOf(b, &p.nodes, id, at)
}

// Admit implements Policy: TinyLFU admits candidate only if its key's
// estimated frequency exceeds that of victim's key (victim's stored hash if
// held, else one derived from the ID).
func (p *lfu) Admit(candidate Block, victim ID) bool {
	ch := candidate.Hash
	if ch == 0 {
		ch = hashID(candidate.ID)
	}
	return p.estimate(ch) > p.estimate(p.keyHash(victim))
}

// keyHash returns the key hash of id: the stored one if id is held, else
// the one derived from id.
func (p *lfu) keyHash(id ID) uint64 {
	if _, n := held(&p.nodes, id); n != nil {
		return n.hash
	}
	return hashID(id)
}
