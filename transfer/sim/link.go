package sim

import "math"

// Link is a link between two nodes that concurrent fetches share: each of
// n active transfers moves at BytesPerSecond/n (processor sharing, what
// TCP flows on one bottleneck converge to). A transfer's fixed cost (the
// round trip and the pin/reserve/commit work a real fetch pays, as
// `kvpool node bench --remote` measures it) is paid before its bytes
// start moving and does not take bandwidth.
//
// A Link is advanced by the caller's clock: Advance(t) moves every
// transfer forward to time t, and NextDone says when the next one would
// finish if nothing joined. Pure; not safe for concurrent use.
type Link struct {
	// BytesPerSecond is the link's bandwidth. Required, > 0.
	BytesPerSecond float64
	// FixedS is each transfer's fixed cost, in seconds.
	FixedS float64

	now  float64
	busy []*transfer
}

// transfer is one fetch in flight on a link.
type transfer struct {
	id        int
	startsAtS float64 // when its bytes start moving (after the fixed cost)
	left      float64 // bytes still to move
}

// Start adds transfer id of bytes at time now (≥ the link's time): its
// bytes move from now+FixedS.
func (l *Link) Start(now float64, id int, bytes float64) {
	l.Advance(now)
	l.busy = append(l.busy, &transfer{id: id, startsAtS: now + l.FixedS, left: bytes})
}

// moving counts the transfers whose bytes move at time t.
func (l *Link) moving(t float64) int {
	n := 0
	for _, x := range l.busy {
		if x.startsAtS <= t && x.left > 0 {
			n++
		}
	}
	return n
}

// Advance moves every transfer forward to time t. Between events the set
// of moving transfers only changes when one starts moving (its fixed cost
// is paid) or finishes, so Advance steps from one such moment to the next.
func (l *Link) Advance(t float64) {
	for l.now < t {
		// The next moment the moving set changes, or t.
		step := t
		for _, x := range l.busy {
			if x.startsAtS > l.now && x.startsAtS < step {
				step = x.startsAtS
			}
		}
		n := l.moving(l.now)
		if n > 0 {
			rate := l.BytesPerSecond / float64(n)
			for _, x := range l.busy {
				if x.startsAtS <= l.now && x.left > 0 {
					if done := l.now + x.left/rate; done < step {
						step = done
					}
				}
			}
			for _, x := range l.busy {
				if x.startsAtS <= l.now && x.left > 0 {
					x.left = math.Max(0, x.left-rate*(step-l.now))
					// Rounding can leave a remainder too small to move
					// the clock: it is done.
					if x.left < 1e-6 || step+x.left/rate == step {
						x.left = 0
					}
				}
			}
		}
		l.now = step
	}
}

// Done removes and returns the ids of the transfers finished by the
// link's time, in the order they started.
func (l *Link) Done() []int {
	var ids []int
	kept := l.busy[:0]
	for _, x := range l.busy {
		if l.finished(x) {
			ids = append(ids, x.id)
		} else {
			kept = append(kept, x)
		}
	}
	l.busy = kept
	return ids
}

// Cancel drops transfer id (its fetch was given up); it frees its share.
func (l *Link) Cancel(id int) {
	for i, x := range l.busy {
		if x.id == id {
			l.busy = append(l.busy[:i], l.busy[i+1:]...)
			return
		}
	}
}

// NextDone is when the next transfer finishes if no other joins, and ok
// is false when none is in flight.
func (l *Link) NextDone() (atS float64, ok bool) {
	if len(l.busy) == 0 {
		return 0, false
	}
	// Simulate on a copy.
	c := Link{BytesPerSecond: l.BytesPerSecond, FixedS: l.FixedS, now: l.now}
	for _, x := range l.busy {
		y := *x
		c.busy = append(c.busy, &y)
	}
	for {
		for _, x := range c.busy {
			if c.finished(x) {
				return c.now, true
			}
		}
		// Step to the next change of the moving set.
		next := math.Inf(1)
		n := c.moving(c.now)
		for _, x := range c.busy {
			if x.startsAtS > c.now {
				next = math.Min(next, x.startsAtS)
			} else if n > 0 && x.left > 0 {
				next = math.Min(next, c.now+x.left/(c.BytesPerSecond/float64(n)))
			}
		}
		if next <= c.now {
			return c.now, true
		}
		c.Advance(next)
	}
}

// finished reports whether x is done at the link's time: all its bytes
// moved, or so few left that moving them takes no representable time.
func (l *Link) finished(x *transfer) bool {
	if x.startsAtS > l.now {
		return false
	}
	if x.left == 0 {
		return true
	}
	rate := l.BytesPerSecond / float64(max(1, l.moving(l.now)))
	return l.now+x.left/rate == l.now
}

// Busy is how many transfers are in flight.
func (l *Link) Busy() int { return len(l.busy) }
