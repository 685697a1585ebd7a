package store

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

func TestBinOf(t *testing.T) {
	tests := []struct {
		n    uint32
		f, s int
	}{
		{1, 0, 1}, {15, 0, 15}, {16, 1, 0}, {31, 1, 15}, {32, 2, 0}, {33, 2, 0},
		{34, 2, 1}, {63, 2, 15}, {64, 3, 0}, {512, 6, 0}, {1<<32 - 2, 28, 15},
	}
	for _, tt := range tests {
		if f, s := binOf(tt.n); f != tt.f || s != tt.s {
			t.Errorf("binOf(%d) = (%d,%d), want (%d,%d)", tt.n, f, s, tt.f, tt.s)
		}
	}
	// Every run in binAtLeast(n) and above is at least n pages long.
	for n := uint32(1); n < 1<<14; n++ {
		f, s := binAtLeast(n)
		lo := binLow(f, s)
		if lo < n {
			t.Fatalf("binAtLeast(%d) = (%d,%d) whose smallest run is %d", n, f, s, lo)
		}
		if bf, bs := binOf(n); lo == n && (bf != f || bs != s) {
			t.Fatalf("binAtLeast(%d) skipped the exact bin", n)
		}
	}
}

// binLow is the shortest run length that bin (f, s) holds.
func binLow(f, s int) uint32 {
	if f == 0 {
		return uint32(s)
	}
	top := f + slLog2 - 1
	return 1<<top | uint32(s)<<(top-slLog2)
}

// shadow is a trivially correct model of the arena: one flag per page.
type shadow struct {
	used []bool
	live map[uint32]uint32 // start -> pages
}

func (sh *shadow) largestFree() uint32 {
	var best, run uint32
	for _, u := range sh.used {
		if u {
			run = 0
			continue
		}
		run++
		best = max(best, run)
	}
	return best
}

// runOps drives the allocator and the shadow with ops decoded from data and
// checks after every step that they agree: no run overlaps a live one,
// alloc fails only when no free run is long enough, the bookkeeping holds,
// and once everything is freed the arena is one free run again.
func runOps(t *testing.T, pages uint32, data []byte) {
	a := newAllocator(pages)
	sh := &shadow{used: make([]bool, pages), live: map[uint32]uint32{}}
	var order []uint32
	for len(data) >= 3 {
		op, arg := data[0], binary.LittleEndian.Uint16(data[1:3])
		data = data[3:]
		if op%3 != 0 || len(order) == 0 { // alloc twice as often as free
			n := uint32(arg)%(pages/2+1) + 1
			if op%7 == 0 {
				n = uint32(arg)%8 + 1 // many small runs shatter free space
			}
			want := sh.largestFree() >= n
			start, ok := a.alloc(n)
			if ok != want {
				t.Fatalf("alloc(%d) ok=%v, but the largest free run is %d", n, ok, sh.largestFree())
			}
			if !ok {
				continue
			}
			if uint64(start)+uint64(n) > uint64(pages) {
				t.Fatalf("alloc(%d) = %d runs past the arena", n, start)
			}
			for p := start; p < start+n; p++ {
				if sh.used[p] {
					t.Fatalf("alloc(%d) = %d overlaps a live run at page %d", n, start, p)
				}
				sh.used[p] = true
			}
			sh.live[start] = n
			order = append(order, start)
		} else {
			i := int(arg) % len(order)
			start := order[i]
			order[i] = order[len(order)-1]
			order = order[:len(order)-1]
			n := sh.live[start]
			delete(sh.live, start)
			for p := start; p < start+n; p++ {
				sh.used[p] = false
			}
			a.free(start, n)
		}
		if err := a.checkInvariants(); err != nil {
			t.Fatal(err)
		}
		var used uint64
		for _, n := range sh.live {
			used += uint64(n)
		}
		if a.freePages+used != uint64(pages) {
			t.Fatalf("free %d + live %d != %d pages: leaked or double counted", a.freePages, used, pages)
		}
	}
	for _, start := range order {
		a.free(start, sh.live[start])
	}
	if err := a.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	if a.freePages != uint64(pages) || a.freeRuns != 1 || a.largestFree() != pages {
		t.Fatalf("after freeing everything: %d free pages in %d runs, largest %d; want %d in 1", a.freePages, a.freeRuns, a.largestFree(), pages)
	}
}

func TestAllocatorAgainstShadow(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, seed))
		data := make([]byte, 3*2000)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		pages := uint32(1 + rng.IntN(700))
		runOps(t, pages, data)
	}
}

func FuzzAllocator(f *testing.F) {
	f.Add(uint16(64), []byte{1, 10, 0, 1, 20, 0, 3, 0, 0, 1, 5, 0})
	f.Add(uint16(1), []byte{1, 0, 0, 3, 0, 0})
	f.Add(uint16(1000), []byte{7, 1, 0, 7, 1, 0, 7, 1, 0, 3, 1, 0, 1, 255, 255})
	f.Fuzz(func(t *testing.T, pages uint16, data []byte) {
		runOps(t, uint32(pages)+1, data)
	})
}

func TestAllocatorMergesNeighbours(t *testing.T) {
	a := newAllocator(30)
	x, _ := a.alloc(10)
	y, _ := a.alloc(10)
	z, _ := a.alloc(10)
	if x != 0 || y != 10 || z != 20 || a.freePages != 0 {
		t.Fatalf("got runs at %d %d %d with %d free pages", x, y, z, a.freePages)
	}
	if _, ok := a.alloc(1); ok {
		t.Fatal("alloc from a full arena succeeded")
	}
	a.free(x, 10)
	a.free(z, 10)
	if a.freeRuns != 2 || a.largestFree() != 10 {
		t.Fatalf("runs %d largest %d, want 2 and 10", a.freeRuns, a.largestFree())
	}
	if got := a.externalFragmentation(); got != 0.5 {
		t.Fatalf("external fragmentation %v, want 0.5", got)
	}
	a.free(y, 10)
	if a.freeRuns != 1 || a.largestFree() != 30 || a.externalFragmentation() != 0 {
		t.Fatalf("after merging: runs %d largest %d", a.freeRuns, a.largestFree())
	}
}

func TestAllocatorDoubleFreePanics(t *testing.T) {
	a := newAllocator(8)
	p, _ := a.alloc(4)
	a.free(p, 4)
	defer func() {
		if recover() == nil {
			t.Fatal("double free did not panic")
		}
	}()
	a.free(p, 4)
}

func BenchmarkAllocator(b *testing.B) {
	const pages = 1 << 20
	a := newAllocator(pages)
	rng := rand.New(rand.NewPCG(1, 2))
	type run struct{ start, n uint32 }
	live := make([]run, 0, 4096)
	for b.Loop() {
		if len(live) < 2048 || rng.IntN(2) == 0 {
			n := uint32(1 + rng.IntN(512))
			if s, ok := a.alloc(n); ok {
				live = append(live, run{s, n})
				continue
			}
		}
		i := rng.IntN(len(live))
		a.free(live[i].start, live[i].n)
		live[i] = live[len(live)-1]
		live = live[:len(live)-1]
	}
}
