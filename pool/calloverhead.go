package pool

import (
	"slices"
	"sync"
	"time"
)

// callOverheadReports is how many of the latest reports callOverheads
// keeps: enough for a median that one stalled call does not move, few
// enough that a change of client shows within a minute of fetches.
const callOverheadReports = 63

// minCallOverheadReports is how many reports it takes before the median
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
// fetch). Safe for concurrent use.
type callOverheads struct {
	mu     sync.Mutex
	latest [callOverheadReports]time.Duration // a ring, written at n % len
	n      int                                // reports taken
	// mid is the median of latest[:min(n, len)], taken as each report
	// comes (the only time it changes), so that reading it, once per
	// fetch, sorts nothing.
	mid time.Duration
}

// report takes one caller's report of d. It returns false, and changes
// nothing, for a report of nothing or an implausible one.
func (c *callOverheads) report(d time.Duration) bool {
	if d <= 0 || d > maxCallOverhead {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.latest[c.n%len(c.latest)] = d
	c.n++
	var buf [callOverheadReports]time.Duration
	kept := buf[:copy(buf[:], c.latest[:min(c.n, len(c.latest))])]
	slices.Sort(kept)
	c.mid = kept[len(kept)/2]
	return true
}

// median returns the median of the latest reports, and false while
// there have been fewer than minCallOverheadReports.
func (c *callOverheads) median() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mid, c.n >= minCallOverheadReports
}

// beyond returns what a fetch cost its caller beyond the node's own
// timing of it: the callers' reported median once there is one, else
// answering, the node's own time to write its answer.
func (c *callOverheads) beyond(answering time.Duration) time.Duration {
	if d, ok := c.median(); ok {
		return d
	}
	return answering
}

// overheadFromMicros converts a report in microseconds, saturating where
// a duration would overflow (report then ignores it as implausible).
func overheadFromMicros(us uint64) time.Duration {
	return time.Duration(min(us, uint64(maxCallOverhead/time.Microsecond)+1)) * time.Microsecond
}
