package bench

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BenchmarkSameHostCeiling measures what a host's cores allow a same-host
// put when the node is a process of its own, with nothing of kvpool's in
// the way: writers (goroutines of this process) copy 2 MiB blocks into a
// shared mapping, each cycling through 16 frames of its own (the put
// bench's 128 MiB working set over four writers), and a server (this test
// binary, run again as a second process) watches one word per writer and
// answers each post by storing its number back. It does no work for a
// post, so what it costs a writer is what the two processes' sharing of
// the cores costs: the waits, the switches between them and what those
// do to the copies. Reported against the copies alone, each mode run
// between two runs of them:
//
//   - sync: each copy is posted and its answer awaited (polling, and
//     yielding the core every 64 looks), as a synchronous Put's commit;
//     the server yields every 16 sweeps that find nothing;
//   - ahead4: a writer waits only for the answer four posts back and
//     yields its core after each post, as a write-behind PutAsync with
//     four spares;
//   - lazy32: 32 posts in flight, no yield, and a server that sleeps a
//     millisecond whenever a sweep finds nothing.
//
// On a host with more cores than writers plus the server these approach
// 1; on two vCPUs with four writers they are the ceiling the put
// benchmarks of the node in another process are judged against (see
// docs/benchmarks-history.md, "A session of 2026-12-07, from 12:03").
//
//	go test ./pool/bench -run '^$' -bench SameHostCeiling -benchtime 1x -v
func BenchmarkSameHostCeiling(b *testing.B) {
	for _, writers := range []int{1, 4} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			mem, f := ceilingMapping(b, writers)
			const rounds, d = 3, 500 * time.Millisecond
			alone := make([]float64, 0, 2*rounds)
			ratios := map[string][]float64{}
			modes := []string{"sync", "ahead4", "lazy32"}
			for b.Loop() {
				for range rounds {
					for _, mode := range modes {
						before := runCeiling(b, mem, f, writers, "alone", d)
						got := runCeiling(b, mem, f, writers, mode, d)
						after := runCeiling(b, mem, f, writers, "alone", d)
						alone = append(alone, before, after)
						ratios[mode] = append(ratios[mode], got/((before+after)/2))
					}
				}
			}
			b.ReportMetric(median(alone), "alone-GB/s")
			for _, mode := range modes {
				rs := ratios[mode]
				b.Logf("%s: %.3f of the copies alone (rounds: %.3f)", mode, median(rs), rs)
				b.ReportMetric(median(rs), mode+"-ratio")
			}
		})
	}
}

// ceilingBlock and ceilingFrames: each writer copies blocks of
// ceilingBlock into ceilingFrames frames of its own.
const (
	ceilingBlock  = 2 << 20
	ceilingFrames = 16
	// ceilingHeader holds the control words, one cache line each (a
	// huge page, so the frames start on one).
	ceilingHeader = 2 << 20
)

// ceilingWords are the shared control words: stop, then a request and a
// response word per writer, each on a cache line of its own.
type ceilingWords struct {
	stop  atomic.Uint32
	ready atomic.Uint32 // the server watches
	_     [56]byte
	slots [8]ceilingSlot
}

// ceilingSlot is one writer's request and response words.
type ceilingSlot struct {
	req  atomic.Uint32
	_    [60]byte
	resp atomic.Uint32
	_    [60]byte
}

// ceilingMapping maps the shared region for writers: a memfd on huge
// pages where the host has them free, else on ordinary ones.
func ceilingMapping(b *testing.B, writers int) ([]byte, *os.File) {
	size := ceilingHeader + writers*ceilingFrames*ceilingBlock
	for _, flags := range []int{unix.MFD_HUGETLB, 0} {
		fd, err := unix.MemfdCreate("kvpool-ceiling", flags)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), "kvpool-ceiling")
		if err := f.Truncate(int64(size)); err != nil {
			f.Close()
			continue
		}
		mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			f.Close()
			continue
		}
		b.Cleanup(func() { unix.Munmap(mem); f.Close() })
		b.Logf("shared region: %d MiB, huge pages: %v", size>>20, flags != 0)
		return mem, f
	}
	b.Fatal("no shared memory for the ceiling")
	return nil, nil
}

// runCeiling runs writers copying for d in mode, with the server in a
// process of its own unless the mode is "alone", and returns the GB/s.
func runCeiling(b *testing.B, mem []byte, f *os.File, writers int, mode string, d time.Duration) float64 {
	words := (*ceilingWords)(unsafe.Pointer(&mem[0]))
	words.stop.Store(0)
	words.ready.Store(0)
	for i := range words.slots {
		words.slots[i].req.Store(0)
		words.slots[i].resp.Store(0)
	}
	var server *exec.Cmd
	if mode != "alone" {
		server = exec.Command(os.Args[0], "-test.run=^TestSameHostCeilingServer$")
		server.Env = append(os.Environ(), "KVPOOL_CEILING_SERVER="+mode, "KVPOOL_CEILING_WRITERS="+strconv.Itoa(writers))
		server.ExtraFiles = []*os.File{f}
		server.Stderr = os.Stderr // its failures; what it prints on success is dropped
		if err := server.Start(); err != nil {
			b.Fatal(err)
		}
		// A run that fails leaves no server behind.
		defer func() {
			if server.ProcessState == nil {
				words.stop.Store(1)
				server.Process.Kill()
				server.Wait()
			}
		}()
		for deadline := time.Now().Add(10 * time.Second); words.ready.Load() == 0; {
			if time.Now().After(deadline) {
				b.Fatal("the ceiling's server did not start")
			}
			time.Sleep(time.Millisecond)
		}
	}
	window := map[string]uint32{"sync": 0, "ahead4": 4, "lazy32": 32}[mode]
	var copied atomic.Int64
	var wg sync.WaitGroup
	gate := make(chan struct{})
	var start, end time.Time // set before the gate opens
	for w := range writers {
		wg.Go(func() {
			src := make([]byte, ceilingBlock)
			for i := range src {
				src[i] = byte(i + w)
			}
			frames := mem[ceilingHeader+w*ceilingFrames*ceilingBlock:][:ceilingFrames*ceilingBlock]
			slot := &words.slots[w]
			<-gate
			n := 0
			for ; time.Now().Before(end); n++ {
				off := n % ceilingFrames * ceilingBlock
				copy(frames[off:off+ceilingBlock], src)
				if mode == "alone" {
					continue
				}
				// Post, with at most window posts unanswered (sync: wait
				// for this one's answer after posting it).
				post := slot.req.Load() + 1
				if window > 0 {
					awaitAnswer(slot, post-window)
				}
				slot.req.Store(post)
				switch mode {
				case "sync":
					awaitAnswer(slot, post)
				case "ahead4":
					yieldCore()
				}
			}
			copied.Add(int64(n) * ceilingBlock)
		})
	}
	time.Sleep(time.Millisecond) // the writers' goroutines wait at the gate
	start = time.Now()
	end = start.Add(d)
	close(gate)
	wg.Wait()
	elapsed := time.Since(start)
	if server != nil {
		words.stop.Store(1)
		if err := server.Wait(); err != nil {
			b.Fatalf("the ceiling's server: %v", err)
		}
	}
	return float64(copied.Load()) / elapsed.Seconds() / 1e9
}

// TestSameHostCeilingServer is BenchmarkSameHostCeiling's server when
// run as its second process; otherwise it skips.
func TestSameHostCeilingServer(t *testing.T) {
	mode := os.Getenv("KVPOOL_CEILING_SERVER")
	if mode == "" {
		t.Skip("BenchmarkSameHostCeiling's server process")
	}
	if mode != "sync" && mode != "ahead4" && mode != "lazy32" {
		t.Fatalf("KVPOOL_CEILING_SERVER=%q: sync, ahead4 or lazy32", mode)
	}
	writers, err := strconv.Atoi(os.Getenv("KVPOOL_CEILING_WRITERS"))
	if err != nil || writers < 1 || writers > 8 {
		t.Fatalf("KVPOOL_CEILING_WRITERS=%q", os.Getenv("KVPOOL_CEILING_WRITERS"))
	}
	f := os.NewFile(3, "kvpool-ceiling")
	mem, err := unix.Mmap(int(f.Fd()), 0, ceilingHeader, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	words := (*ceilingWords)(unsafe.Pointer(&mem[0]))
	var seen [8]uint32
	words.ready.Store(1)
	// A run lasts half a second; a server whose benchmark died without
	// stopping it stops by itself.
	deadline := time.Now().Add(time.Minute)
	for idle := 0; words.stop.Load() == 0; {
		if idle%4096 == 4095 && time.Now().After(deadline) {
			t.Fatal("the benchmark never stopped its server")
		}
		served := false
		for w := range writers {
			if r := words.slots[w].req.Load(); r != seen[w] {
				seen[w] = r
				words.slots[w].resp.Store(r)
				served = true
			}
		}
		switch {
		case served:
			idle = 0
		case mode == "lazy32":
			if time.Now().After(deadline) {
				t.Fatal("the benchmark never stopped its server")
			}
			time.Sleep(time.Millisecond)
		default:
			if idle++; idle%16 == 0 {
				yieldCore()
			}
		}
	}
}

// awaitAnswer polls until the server has answered post n of slot (n
// counts from 1; 0 and below are answered), yielding the core every 64
// looks.
func awaitAnswer(slot *ceilingSlot, n uint32) {
	for i := 1; int32(slot.resp.Load()-n) < 0; i++ {
		if i%64 == 0 {
			yieldCore()
		}
	}
}

// yieldCore gives the core to any thread waiting for one.
func yieldCore() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}
