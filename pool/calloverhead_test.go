package pool

import (
	"testing"
	"time"
)

func TestCallOverheads(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	var c callOverheads
	if got := c.beyond(us(7)); got != us(7) {
		t.Fatalf("no reports: beyond(7µs) = %v, want the node's own 7µs", got)
	}
	for _, bad := range []time.Duration{0, -us(5), maxCallOverhead + 1} {
		if c.report(bad) {
			t.Errorf("report(%v) taken", bad)
		}
	}
	c.report(us(80))
	c.report(us(60))
	if _, ok := c.median(); ok {
		t.Fatal("a median from two reports")
	}
	if got := c.beyond(us(7)); got != us(7) {
		t.Fatalf("two reports: beyond = %v, want 7µs", got)
	}
	c.report(us(9000)) // one stalled call
	if got, ok := c.median(); !ok || got != us(80) {
		t.Fatalf("median of 80, 60, 9000 µs = %v, %v; want 80µs", got, ok)
	}
	if got := c.beyond(us(7)); got != us(80) {
		t.Fatalf("beyond = %v, want the reports' 80µs", got)
	}
	// The ring keeps the latest callOverheadReports: after that many
	// reports of 100 µs the earlier three are gone.
	for range callOverheadReports {
		c.report(us(100))
	}
	if got, _ := c.median(); got != us(100) {
		t.Fatalf("median after the ring turned = %v, want 100µs", got)
	}
	// Half the ring and one more at 50 µs move the median there.
	for range callOverheadReports/2 + 1 {
		c.report(us(50))
	}
	if got, _ := c.median(); got != us(50) {
		t.Fatalf("median = %v, want 50µs", got)
	}
}
