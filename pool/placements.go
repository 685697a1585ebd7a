package pool

import (
	"bytes"
	"sync"
	"time"
)

// placements are the requests this node's Plan sent to nodes (PlanRequest
// place) that those nodes' engines have not reported yet. The plans this
// node answers next count each in its node's queue and its chain as about
// to be in that node's cache, so a burst of requests with one new prefix
// is not planned against one stale view: every request of it would
// otherwise see the same idle node. A placement ends when its node's
// engine reports after it (the nodes' clocks are compared: skew only
// lengthens or shortens a placement's life), or after ttl. Safe for
// concurrent use.
type placements struct {
	ttl time.Duration
	max int

	mu   sync.Mutex
	list []placement // oldest first
}

type placement struct {
	node              string
	at                time.Time
	serviceS          float64 // the plan's estimate of its prefill, queue excluded
	tenant, namespace string
	keys              [][]byte
}

func newPlacements(ttl time.Duration) *placements { return &placements{ttl: ttl, max: 4096} }

// add records a placement (keys are copied).
func (ps *placements) add(p placement) {
	p.keys = append([][]byte(nil), p.keys...)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.pruneLocked(p.at)
	if len(ps.list) >= ps.max {
		ps.list = ps.list[1:]
	}
	ps.list = append(ps.list, p)
}

func (ps *placements) pruneLocked(now time.Time) {
	i := 0
	for i < len(ps.list) && now.Sub(ps.list[i].at) > ps.ttl {
		i++
	}
	if i > 0 {
		ps.list = append(ps.list[:0], ps.list[i:]...)
	}
}

// view is what placements add to node's view at now: queue seconds of the
// requests placed there after its engine's last report (reportedAt), and
// the longest prefix of keys (of tenant and namespace) placed there within
// the ttl.
func (ps *placements) view(now time.Time, node string, reportedAt time.Time, tenant, namespace string, keys [][]byte) (queueS float64, prefix int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.pruneLocked(now)
	for _, p := range ps.list {
		if p.node != node {
			continue
		}
		if p.at.After(reportedAt) {
			queueS += p.serviceS
		}
		if p.tenant == tenant && p.namespace == namespace {
			n := 0
			for n < len(keys) && n < len(p.keys) && bytes.Equal(keys[n], p.keys[n]) {
				n++
			}
			prefix = max(prefix, n)
		}
	}
	return queueS, prefix
}
