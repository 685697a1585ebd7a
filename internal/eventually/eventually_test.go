package eventually

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestWithin runs on synctest's fake clock: the waits take no real time,
// and the deadline is exact.
func TestWithin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		start := time.Now()
		if !Within(time.Second, func() bool { return n.Add(1) == 5 }) {
			t.Fatal("a condition that turns true after 5 checks was not seen")
		}
		if el := time.Since(start); el != 4*Poll {
			t.Fatalf("5 checks took %v, want 4 polls (%v)", el, 4*Poll)
		}
		start = time.Now()
		if Within(time.Minute, func() bool { return false }) {
			t.Fatal("a condition that never holds was reported as holding")
		}
		if el := time.Since(start); el < time.Minute || el > time.Minute+Poll {
			t.Fatalf("gave up after %v, want the 1m deadline", el)
		}
	})
}
