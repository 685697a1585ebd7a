package store

import (
	"fmt"
	"math/bits"
)

// allocator hands out runs of pages from the arena. It is a two-level
// segregated-fit allocator (TLSF, Masmano et al. 2004) over page numbers:
// free runs sit in 16 bins per power of two of their length, two bitmaps
// find a non-empty bin in O(1), and a freed run merges with free neighbours
// at once, so free space never holds two adjacent free runs.
//
// All bookkeeping lives in four flat []uint32 slices indexed by page number
// (16 bytes per page, no pointers, so the garbage collector never scans
// it) and nothing is kept inside the arena, which clients map writable.
// Allocated runs carry no header: the caller passes the run's length back to
// free.
//
// NB: not safe for concurrent use; the store guards it with its mutex.
type allocator struct {
	pages uint32

	// freeHead[p] is the length of the free run starting at p, 0 if none.
	// freeTail[p] is the length of the free run ending at p, 0 if none.
	freeHead, freeTail []uint32
	// next and prev link the free runs of one bin, indexed by a run's
	// first page; noPage ends a list.
	next, prev []uint32

	bins     [flCount][slCount]uint32 // first run of each bin, or noPage
	flBitmap uint32                   // bit f set: some bin in row f is non-empty
	slBitmap [flCount]uint16          // bit s of row f set: bin (f, s) is non-empty

	freePages uint64
	freeRuns  uint64
}

const (
	slLog2  = 4
	slCount = 1 << slLog2
	// flCount rows: row 0 holds runs of 1..15 pages exactly, row f ≥ 1
	// holds lengths in [2^(f+3), 2^(f+4)), cut into 16 bins.
	flCount = 32 - slLog2 + 1
	noPage  = ^uint32(0)
	// maxPages keeps page numbers below noPage.
	maxPages = 1<<32 - 2
)

func newAllocator(pages uint32) *allocator {
	if pages == 0 || pages > maxPages {
		panic(fmt.Sprintf("store: allocator of %d pages", pages))
	}
	a := &allocator{
		pages:    pages,
		freeHead: make([]uint32, pages),
		freeTail: make([]uint32, pages),
		next:     make([]uint32, pages),
		prev:     make([]uint32, pages),
	}
	for f := range a.bins {
		for s := range a.bins[f] {
			a.bins[f][s] = noPage
		}
	}
	a.insert(0, pages)
	return a
}

// binOf maps a run length to the bin that stores it.
func binOf(n uint32) (f, s int) {
	if n < slCount {
		return 0, int(n)
	}
	top := bits.Len32(n) - 1 // ≥ slLog2
	return top - slLog2 + 1, int(n>>(top-slLog2)) & (slCount - 1)
}

// binAtLeast returns the first bin whose every run is at least n pages
// long: n rounded up to its bin's upper edge.
func binAtLeast(n uint32) (f, s int) {
	if n < slCount {
		return 0, int(n)
	}
	top := bits.Len32(n) - 1
	round := uint64(1)<<(top-slLog2) - 1
	r := uint64(n) + round
	if r > maxPages {
		r = maxPages
	}
	return binOf(uint32(r))
}

func (a *allocator) insert(start, n uint32) {
	f, s := binOf(n)
	head := a.bins[f][s]
	a.next[start] = head
	a.prev[start] = noPage
	if head != noPage {
		a.prev[head] = start
	}
	a.bins[f][s] = start
	a.flBitmap |= 1 << f
	a.slBitmap[f] |= 1 << s
	a.freeHead[start] = n
	a.freeTail[start+n-1] = n
	a.freePages += uint64(n)
	a.freeRuns++
}

func (a *allocator) remove(start, n uint32) {
	f, s := binOf(n)
	nx, pv := a.next[start], a.prev[start]
	if pv != noPage {
		a.next[pv] = nx
	} else {
		a.bins[f][s] = nx
	}
	if nx != noPage {
		a.prev[nx] = pv
	}
	if a.bins[f][s] == noPage {
		a.slBitmap[f] &^= 1 << s
		if a.slBitmap[f] == 0 {
			a.flBitmap &^= 1 << f
		}
	}
	a.freeHead[start] = 0
	a.freeTail[start+n-1] = 0
	a.freePages -= uint64(n)
	a.freeRuns--
}

// findBin returns the first non-empty bin at or after (f, s).
func (a *allocator) findBin(f, s int) (int, int, bool) {
	if f >= flCount {
		return 0, 0, false
	}
	if m := a.slBitmap[f] & (^uint16(0) << s); m != 0 {
		return f, bits.TrailingZeros16(m), true
	}
	m := a.flBitmap & (^uint32(0) << (f + 1))
	if f+1 >= 32 || m == 0 {
		return 0, 0, false
	}
	f = bits.TrailingZeros32(m)
	return f, bits.TrailingZeros16(a.slBitmap[f]), true
}

// goodFitScan bounds how many runs of the exact bin alloc inspects before
// it falls back to the next larger bin. A few probes recover most of the
// exact fits that plain TLSF misses.
const goodFitScan = 8

// alloc returns the first page of a run of n pages, or false when no free
// run is long enough.
func (a *allocator) alloc(n uint32) (uint32, bool) {
	if n == 0 || n > a.pages {
		return 0, false
	}
	start := noPage
	// Try the bin n itself belongs to: its runs may or may not fit.
	f, s := binOf(n)
	for p, i := a.bins[f][s], 0; p != noPage && i < goodFitScan; p, i = a.next[p], i+1 {
		if a.freeHead[p] >= n {
			start = p
			break
		}
	}
	if start == noPage {
		f, s = binAtLeast(n)
		if f2, s2, ok := a.findBin(f, s); ok {
			start = a.bins[f2][s2]
		}
	}
	if start == noPage {
		// Last resort before failing: the rest of the exact bin. It only
		// runs when the arena is nearly full, and it makes alloc fail only
		// when no free run of n pages exists at all.
		f, s = binOf(n)
		for p := a.bins[f][s]; p != noPage; p = a.next[p] {
			if a.freeHead[p] >= n {
				start = p
				break
			}
		}
	}
	if start == noPage {
		return 0, false
	}
	got := a.freeHead[start]
	a.remove(start, got)
	if got > n {
		a.insert(start+n, got-n)
	}
	return start, true
}

// free returns the run [start, start+n) and merges it with free neighbours.
// REQUIRES: the run was returned by alloc(n) and is not free.
func (a *allocator) free(start, n uint32) {
	if n == 0 || uint64(start)+uint64(n) > uint64(a.pages) {
		panic(fmt.Sprintf("store: free of pages [%d, +%d) outside %d pages", start, n, a.pages))
	}
	if a.freeHead[start] != 0 || a.freeTail[start+n-1] != 0 {
		panic(fmt.Sprintf("store: double free of pages [%d, +%d)", start, n))
	}
	if start > 0 {
		if l := a.freeTail[start-1]; l != 0 {
			a.remove(start-l, l)
			start -= l
			n += l
		}
	}
	if end := start + n; end < a.pages {
		if r := a.freeHead[end]; r != 0 {
			a.remove(end, r)
			n += r
		}
	}
	a.insert(start, n)
}

// largestFree returns the length of the longest free run.
func (a *allocator) largestFree() uint32 {
	if a.flBitmap == 0 {
		return 0
	}
	f := 31 - bits.LeadingZeros32(a.flBitmap)
	s := 15 - bits.LeadingZeros16(a.slBitmap[f])
	var best uint32
	for p := a.bins[f][s]; p != noPage; p = a.next[p] {
		best = max(best, a.freeHead[p])
	}
	return best
}

// externalFragmentation is 1 - largest free run / free pages: 0 when all
// free space is one run, near 1 when it is shattered into small runs.
func (a *allocator) externalFragmentation() float64 {
	if a.freePages == 0 {
		return 0
	}
	return 1 - float64(a.largestFree())/float64(a.freePages)
}

// checkInvariants walks every free run and verifies the bookkeeping: runs
// sit in the bin of their length, boundary tags agree, bitmaps match the
// bins, no two free runs touch, and the counters add up. Tests call it.
func (a *allocator) checkInvariants() error {
	var pages, runs uint64
	for f := range a.bins {
		for s := range a.bins[f] {
			head := a.bins[f][s]
			nonEmpty := a.slBitmap[f]&(1<<s) != 0
			if nonEmpty != (head != noPage) {
				return fmt.Errorf("bin (%d,%d): bitmap %v, head %d", f, s, nonEmpty, head)
			}
			prev := noPage
			for p := head; p != noPage; p = a.next[p] {
				n := a.freeHead[p]
				if n == 0 {
					return fmt.Errorf("bin (%d,%d): page %d listed but not a free head", f, s, p)
				}
				if bf, bs := binOf(n); bf != f || bs != s {
					return fmt.Errorf("run %d+%d in bin (%d,%d), belongs in (%d,%d)", p, n, f, s, bf, bs)
				}
				if a.freeTail[p+n-1] != n {
					return fmt.Errorf("run %d+%d: tail tag %d", p, n, a.freeTail[p+n-1])
				}
				if a.prev[p] != prev {
					return fmt.Errorf("run %d: prev %d, want %d", p, a.prev[p], prev)
				}
				if p > 0 && a.freeTail[p-1] != 0 {
					return fmt.Errorf("run %d+%d touches the free run before it", p, n)
				}
				if p+n < a.pages && a.freeHead[p+n] != 0 {
					return fmt.Errorf("run %d+%d touches the free run after it", p, n)
				}
				pages += uint64(n)
				runs++
				prev = p
			}
		}
		if (a.flBitmap&(1<<f) != 0) != (a.slBitmap[f] != 0) {
			return fmt.Errorf("row %d: first-level bit disagrees with its bins", f)
		}
	}
	if pages != a.freePages || runs != a.freeRuns {
		return fmt.Errorf("walked %d pages in %d runs, counters say %d in %d", pages, runs, a.freePages, a.freeRuns)
	}
	return nil
}
