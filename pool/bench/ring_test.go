package bench

import "testing"

// TestPutRing pins how many frames a put's clients cycle through, which
// the put baseline copies into as many of: each client's share of the
// working set, four at the least, with the removal batch half of it or
// one per 64 MiB, whichever is smaller.
func TestPutRing(t *testing.T) {
	for _, tc := range []struct {
		workingSet  int64
		block       int
		clients     int
		keep, batch int
	}{
		{128 << 20, 2 << 20, 1, 32, 32},      // 64 frames: batch capped at 64 MiB
		{128 << 20, 2 << 20, 4, 8, 8},        // 16 frames each
		{128 << 20, 16 << 20, 1, 4, 4},       // 8 frames, half each
		{128 << 20, 16 << 20, 4, 2, 2},       // 2 frames each, raised to 4
		{1 << 30, 2 << 20, 1, 480, 32},       // a large working set keeps more
		{8 << 20, 1 << 20, 2, 2, 2},          // the smoke test's
		{128 << 20, 64 << 10, 1, 1024, 1024}, // 64 MiB a batch
	} {
		keep, batch := putRing(Config{WorkingSetBytes: tc.workingSet, BlockBytes: tc.block, Clients: tc.clients})
		if keep != tc.keep || batch != tc.batch {
			t.Errorf("putRing(%d MiB working set, %d KiB blocks, %d clients) = keep %d, batch %d; want %d, %d",
				tc.workingSet>>20, tc.block>>10, tc.clients, keep, batch, tc.keep, tc.batch)
		}
	}
}
