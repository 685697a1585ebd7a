package crc32c

import (
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// BenchmarkCopyInterrupted measures Copy and copy of 2 MiB blocks into 34
// frames in turn, in stretches of 64 copies (3 ms or so), alternately undisturbed and
// with a timer interrupting the copying thread every period (a POSIX
// timer aimed at the thread, SIGEV_THREAD_ID, with a signal the Go
// runtime ignores). It reports both rates (alone-GB/s, interrupted-GB/s),
// taken side by side so that a host whose speed drifts moves both, and
// what each interrupt cost the copies (lost-µs/interrupt: the time the
// interrupted copies took beyond the undisturbed rate, over the timer's
// firings while they ran).
//
// It puts a number on what a wake-up costs a core that copies: a thread
// woken there (the node's, to serve a commit), or an interprocessor
// interrupt that wakes one, enters the kernel as this timer does. On the
// paravirtualized AMD EPYC host of 2026-12-07 each interrupt cost a 2 MiB
// copy 33-41 µs of progress, two thirds of what the whole copy takes.
//
//	go test -run '^$' -bench CopyInterrupted ./api/internal/crc32c
func BenchmarkCopyInterrupted(b *testing.B) {
	const n, frames, stretch = spanBlockBytes, spanFrames, 64
	mem, src := spanMemory()
	for _, fn := range spanCopies {
		for _, period := range []time.Duration{500 * time.Microsecond, 200 * time.Microsecond, 100 * time.Microsecond} {
			b.Run(fn.name+"/every="+period.String(), func(b *testing.B) {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				t, err := newThreadTimer()
				if err != nil {
					b.Skipf("no per-thread timer: %v", err)
				}
				defer t.close()
				var spent [2]time.Duration // undisturbed, interrupted
				var copies [2]int
				interrupts := 0 // the timer's firings in the interrupted stretches
				var armed time.Time
				i := 0
				for b.Loop() {
					k := i / stretch % 2
					if i%stretch == 0 {
						if k == 0 && !armed.IsZero() {
							interrupts += int(time.Since(armed) / period)
						}
						if err := t.every(period * time.Duration(k)); err != nil {
							b.Fatal(err)
						}
						if armed = (time.Time{}); k == 1 {
							armed = time.Now()
						}
					}
					off := i % frames * n
					i++
					t0 := time.Now()
					fn.copy(mem[off:off+n], src)
					spent[k] += time.Since(t0)
					copies[k]++
				}
				if !armed.IsZero() {
					interrupts += int(time.Since(armed) / period)
				}
				t.every(0)
				if copies[0] == 0 || interrupts == 0 {
					return // too short a run to compare
				}
				alone := float64(n) * float64(copies[0]) / spent[0].Seconds() / 1e9
				hit := float64(n) * float64(copies[1]) / spent[1].Seconds() / 1e9
				// The interrupted copies took spent[1]; undisturbed they
				// would have taken copies[1] at the undisturbed rate.
				lost := spent[1] - time.Duration(float64(spent[0])*float64(copies[1])/float64(copies[0]))
				b.ReportMetric(alone, "alone-GB/s")
				b.ReportMetric(hit, "interrupted-GB/s")
				b.ReportMetric(float64(lost.Microseconds())/float64(interrupts), "lost-µs/interrupt")
			})
		}
	}
}

// threadTimer sends the thread that made it SIGALRM at a set period.
// SIGALRM, not asked for with signal.Notify, is ignored by the Go
// runtime's handler: each firing costs the thread a kernel entry, the
// handler and a return, nothing more.
type threadTimer struct{ id int32 }

// newThreadTimer makes a disarmed timer aimed at the calling thread,
// which the caller keeps (runtime.LockOSThread).
func newThreadTimer() (*threadTimer, error) {
	const sigevThreadID = 4 // SIGEV_THREAD_ID
	// struct sigevent on linux/amd64 and arm64: value, signo, notify,
	// then the thread id in a 48-byte union.
	var ev struct {
		value  uint64
		signo  int32
		notify int32
		tid    int32
		_      [11]int32
	}
	ev.signo, ev.notify, ev.tid = int32(syscall.SIGALRM), sigevThreadID, int32(syscall.Gettid())
	t := &threadTimer{}
	if _, _, e := syscall.RawSyscall(syscall.SYS_TIMER_CREATE, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ev)), uintptr(unsafe.Pointer(&t.id))); e != 0 {
		return nil, e
	}
	return t, nil
}

// every arms the timer to fire every period from now, or disarms it
// (period 0).
func (t *threadTimer) every(period time.Duration) error {
	ts := syscall.NsecToTimespec(period.Nanoseconds())
	spec := [2]syscall.Timespec{ts, ts} // interval, first expiry
	if _, _, e := syscall.RawSyscall6(syscall.SYS_TIMER_SETTIME, uintptr(t.id), 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

func (t *threadTimer) close() { syscall.RawSyscall(syscall.SYS_TIMER_DELETE, uintptr(t.id), 0, 0) }
