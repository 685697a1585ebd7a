package api

import (
	"math"
	"testing"
	"time"
)

// A fetch report packs the previous call's overhead and length into the
// word the data channel's header carries, each saturating in its 32 bits
// rather than spilling into the other.
func TestFetchReport(t *testing.T) {
	for _, tc := range []struct {
		overhead   time.Duration
		blocks     int
		wantUs     uint64
		wantBlocks uint32
	}{
		{0, 0, 0, 0},
		{250 * time.Microsecond, 1, 250, 1},
		{1500 * time.Nanosecond, 64, 1, 64}, // whole microseconds
		{-time.Second, 3, 0, 3},
		{time.Duration(math.MaxInt64), math.MaxInt, math.MaxUint32, math.MaxUint32},
		{5 * time.Millisecond, -1, 5000, 0},
	} {
		r := newFetchReport(tc.overhead, tc.blocks)
		if r.overheadUs() != tc.wantUs || r.blocks() != tc.wantBlocks {
			t.Errorf("newFetchReport(%v, %d) = %d µs, %d blocks; want %d, %d", tc.overhead, tc.blocks, r.overheadUs(), r.blocks(), tc.wantUs, tc.wantBlocks)
		}
	}
}
