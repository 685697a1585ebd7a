package pool

import (
	"math/bits"
	"slices"
	"sync"
	"time"
)

// callOverheadReports is how many of the latest reports callOverheads
// keeps of all lengths: enough for a median that one stalled call does
// not move, few enough that a change of client shows within a minute of
// fetches.
const callOverheadReports = 63

// callOverheadClasses is how many chain-length classes callOverheads
// keeps reports for: chains of 1, 2–3, 4–7, … blocks, the last class
// every chain of 2048 blocks and more. callOverheadClassReports is how
// many of the latest reports each keeps.
const (
	callOverheadClasses      = 12
	callOverheadClassReports = 31
)

// minCallOverheadReports is how many reports it takes before their median
// stands in for the node's own timing of its answers.
const minCallOverheadReports = 3

// maxCallOverhead bounds a plausible report. A caller's Fetch costs it
// microseconds beyond the node's fetch (its request's way in, the
// answer's way out, its own wake-up; a gRPC call up to a few
// milliseconds); a longer gap is a stalled client or a broken clock.
// The bound also limits what a caller reporting nonsense can do to the
// plans of the node's other tenants: at worst every fetch looks this
// much dearer, and only while such reports are most of the latest.
const maxCallOverhead = 10 * time.Millisecond

// callOverheads keeps what the node's callers report their Fetch calls
// cost beyond the node's own fetch: the part of the wait the node cannot
// time. The links' fits of fetch costs add the median of the latest
// reports to each fetch they learn from, so that Plan predicts the wait
// a caller sees (on loopback, 80–110 µs of a 2 MiB block's 0.6–0.9 ms
// fetch).
//
// Reports are kept by the length of the call they are of as well: the
// cost grows with the chain (measured on loopback: a median of 190–205
// µs for single blocks, 205–250 for 4, 250–335 for 16 and 305–340 for
// 64), so one median of all lengths overstated short fetches by 5–8 %
// and understated long ones. A fetch learns the median of its own
// class's reports once there are minCallOverheadReports of them, that of
// every length before. Safe for concurrent use.
type callOverheads struct {
	mu      sync.Mutex
	all     overheadRing
	byClass [callOverheadClasses]overheadRing
}

// overheadRing keeps the latest reports, up to callOverheadReports, and
// their median.
type overheadRing struct {
	latest [callOverheadReports]time.Duration // a ring, written at n % keep
	n      int                                // reports taken
	// mid is the median of the kept reports, taken as each report comes
	// (the only time it changes), so that reading it, once per fetch,
	// sorts nothing.
	mid time.Duration
}

// add takes d into a ring that keeps the latest keep reports (keep ≤
// callOverheadReports, the same on every call).
func (r *overheadRing) add(d time.Duration, keep int) {
	r.latest[r.n%keep] = d
	r.n++
	var buf [callOverheadReports]time.Duration
	kept := buf[:copy(buf[:], r.latest[:min(r.n, keep)])]
	slices.Sort(kept)
	r.mid = kept[len(kept)/2]
}

// median returns the ring's median, and false while it has fewer than
// minCallOverheadReports.
func (r *overheadRing) median() (time.Duration, bool) {
	return r.mid, r.n >= minCallOverheadReports
}

// overheadClass is the class of a call of blocks keys (blocks > 0).
func overheadClass(blocks int) int {
	return min(bits.Len(uint(blocks))-1, callOverheadClasses-1)
}

// report takes one caller's report of d for a call of blocks keys (0:
// the caller did not say). It returns false, and changes nothing, for a
// report of nothing or an implausible one.
func (c *callOverheads) report(d time.Duration, blocks int) bool {
	if d <= 0 || d > maxCallOverhead {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all.add(d, callOverheadReports)
	if blocks > 0 {
		c.byClass[overheadClass(blocks)].add(d, callOverheadClassReports)
	}
	return true
}

// median returns the median of the latest reports of every length, and
// false while there have been fewer than minCallOverheadReports.
func (c *callOverheads) median() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.all.median()
}

// beyond returns what a fetch of blocks keys cost its caller beyond the
// node's own timing of it: the median of the reports of calls of its
// length class once there are enough, else of calls of every length,
// else answering, the node's own time to write its answer.
func (c *callOverheads) beyond(answering time.Duration, blocks int) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if blocks > 0 {
		if d, ok := c.byClass[overheadClass(blocks)].median(); ok {
			return d
		}
	}
	if d, ok := c.all.median(); ok {
		return d
	}
	return answering
}

// overheadFromMicros converts a report in microseconds, saturating where
// a duration would overflow (report then ignores it as implausible).
func overheadFromMicros(us uint64) time.Duration {
	return time.Duration(min(us, uint64(maxCallOverhead/time.Microsecond)+1)) * time.Microsecond
}
