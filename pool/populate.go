package pool

import (
	"context"
	"errors"
	"time"
)

// populateChunkBytes is how much of the arena one populate call takes:
// small enough that the node's own work never waits long behind it (the
// call runs on a thread of its own, but takes the kernel's locks on the
// pages it allocates), large enough that the calls cost nothing.
const populateChunkBytes = 8 << 20

// populateShare is the most of one core the population takes: after a
// chunk that took d it rests at least d·(1/share − 1), so on a machine
// where allocating pages is slow (a VM faulting in guest memory: 8 MiB in
// 4.5 ms here) it goes slower than the rate rather than crowd out the
// node's work.
const populateShare = 0.25

// populateArena allocates the arena's pages in the background at
// Config.PopulateBytesPerSecond (see there), and with at most
// populateShare of a core, in order, until it is done,
// ctx ends, or the kernel refuses (one without MADV_POPULATE_WRITE, older
// than Linux 5.14; a full tmpfs under --segment-path): then the pages are
// allocated on their first write, as before, and the node says so once.
// kvpool_pool_arena_populated_bytes shows how far it got.
func (n *Node) populateArena(ctx context.Context) {
	rate := n.cfg.PopulateBytesPerSecond
	size := n.cfg.CapacityBytes // the arena's length; not read from seg, which Close may be unmapping
	start := time.Now()
	var done int64
	for done < size && ctx.Err() == nil {
		k := min(populateChunkBytes, size-done)
		t0 := time.Now()
		if err := n.populateChunk(done, k); errors.Is(err, errSegmentClosed) {
			return
		} else if err != nil {
			n.log.Info("the arena's pages are allocated as they are first written: populating them in the background failed",
				"populated_bytes", done, "err", err)
			return
		}
		done += k
		n.metrics.arenaPopulated.Set(float64(done))
		// Pace: the chunks so far should have taken done/rate, and this
		// one's work at most populateShare of the time.
		took := time.Since(t0)
		wait := max(time.Duration(float64(done)/float64(rate)*float64(time.Second))-time.Since(start),
			time.Duration(float64(took)*(1/populateShare-1)))
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
	if done == size {
		n.log.Debug("arena populated", "bytes", size, "took", time.Since(start))
	}
}

// errSegmentClosed ends the population of a node closed while it ran.
var errSegmentClosed = errors.New("pool: the arena is unmapped")

// populateChunk populates [off, off+k) of the arena unless Close has
// unmapped it.
func (n *Node) populateChunk(off, k int64) error {
	n.segMu.Lock()
	defer n.segMu.Unlock()
	if n.segClosed {
		return errSegmentClosed
	}
	return n.seg.populate(off, k)
}
