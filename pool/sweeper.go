package pool

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// mailboxSweeper watches the mailboxes of a node's same-host sessions
// whose clients run in other processes, all from one goroutine, while
// their posts come close together: it sweeps every mailbox, serves what it
// finds, and between sweeps gives its core to any thread that wants it
// (sched_yield). Meanwhile the sessions' readers do not spin, and the
// clients see the node awake (it is one of each mailbox's watchers, see
// wire.Mailbox.Watch). Once its pace (sweepPace) says the next post is too
// far off to be worth the spin, it stops watching and sleeps, and each
// session's reader watches its own mailbox as before: it spins a while
// after a post, then parks, and a post that finds it parked wakes it
// (OpWake). The readers tell the sweeper of the posts they serve
// (served), and it wakes when the pace picks up.
//
// Why: on a host where the clients' copies keep every core busy, a reader
// per session either parks, and each of its client's commits costs a
// wake-up (15-20 µs to the client in the write, and an interrupt of a copy
// on the woken core, 33-41 µs of that copy's progress), or spins, and the
// spinners take the cores from the copies. A single sweeper that yields
// between looks sees every post at once and costs the copies little.
// Measured on two vCPUs, four writers of 2 MiB blocks, one thread each, to
// a node in another process: 0.47-0.61 of memcpy against 0.36-0.38 with a
// reader per session, on a third of the node's CPU time; scratch C
// programs (a server that yields between looks, waiters that yield)
// reached 0.73-0.83, against 0.42-0.44 when the waiters slept in
// futex_wait and 0.40-0.45 when the server did not yield.
//
// Safe for concurrent use. The sweeper touches a session's mailbox only
// under mu, and remove takes mu, so once remove returns the mailbox may
// be unmapped.
type mailboxSweeper struct {
	// spin is how long the sweeper sweeps on after a post while its pace
	// says the next is near.
	spin time.Duration
	// epoch is what the pace's times count from.
	epoch time.Time
	// awake is set while the sweeper watches the mailboxes.
	awake atomic.Bool
	kick  chan struct{}

	mu       sync.Mutex
	sessions []sweptSession
	pace     sweepPace
}

// sweptSession is a session the sweeper serves, with the time (since
// epoch) of its last post.
type sweptSession struct {
	d    *dataConn
	last time.Duration
}

func newMailboxSweeper(spin time.Duration) *mailboxSweeper {
	return &mailboxSweeper{spin: spin, epoch: time.Now(), kick: make(chan struct{}, 1)}
}

// add has the sweeper watch d's mailbox too. REQUIRES: d.mbox mapped.
func (w *mailboxSweeper) add(d *dataConn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sessions = append(w.sessions, sweptSession{d: d, last: -activeWindow})
	if w.awake.Load() {
		d.mbox.Watch()
	}
}

// remove stops the sweeper watching d's mailbox; once it returns the
// sweeper no longer touches it. REQUIRES: d.mu not held (the sweeper may be
// waiting for it). The session is ending: its mailbox's words no longer
// matter.
func (w *mailboxSweeper) remove(d *dataConn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, s := range w.sessions {
		if s.d == d {
			w.sessions = append(w.sessions[:i], w.sessions[i+1:]...)
			return
		}
	}
}

// sweeping reports whether the sweeper watches the mailboxes now: a
// session's reader need not spin.
func (w *mailboxSweeper) sweeping() bool { return w.awake.Load() }

// served is told by d's reader that it served a post of d's (the sweeper
// was asleep, or the post came on the reader's watch): the sweeper wakes
// if its pace now says to sweep. REQUIRES: d.mu not held.
func (w *mailboxSweeper) served(d *dataConn) {
	if w.awake.Load() {
		return
	}
	w.mu.Lock()
	now := time.Since(w.epoch)
	w.pace.post(now)
	for i := range w.sessions {
		if w.sessions[i].d == d {
			w.sessions[i].last = now
		}
	}
	spin := w.spinForLocked(now, runtime.GOMAXPROCS(0))
	w.mu.Unlock()
	if spin > 0 {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// run sweeps until ctx ends.
func (w *mailboxSweeper) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
		}
		w.sweepWhileBusy(ctx)
	}
}

// sweepWhileBusy watches the mailboxes and sweeps while posts keep coming
// close together, and returns, watching none, once its pace says to
// sleep.
func (w *mailboxSweeper) sweepWhileBusy(ctx context.Context) {
	w.watch(true)
	cores := runtime.GOMAXPROCS(0)
	last := time.Since(w.epoch) // the last post served, or the last yield
	var until time.Duration     // sweep until then; 0: decide at the next yield
	for ctx.Err() == nil {
		if now, served := w.sweep(); served {
			last, until = now, 0
			continue
		}
		// Look without a system call for a few microseconds at a time:
		// right after a post its client often posts again (a remove
		// behind a put, a release behind a get), and a system call here
		// slows a copy on the other core (4-6 % for one every look, on
		// a paravirtualized host).
		now := time.Since(w.epoch)
		if now-last < sweepLooks {
			continue
		}
		// Give the core to any thread that wants it. (Not the processor
		// to the process's goroutines, runtime.Gosched: with a processor
		// idle that hands the sweeper to another thread, a futex wake.)
		syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		last = time.Since(w.epoch)
		if until == 0 {
			until = last + w.spinFor(last, cores)
		}
		if last < until {
			continue
		}
		// Stop watching, then look once more: a post made before is
		// served now, one made after brings its reader an OpWake.
		if !w.watch(false) {
			return
		}
		w.watch(true)
		until = 0
	}
	w.watch(false)
}

// sweepLooks is how long the sweeper looks at the mailboxes between two
// yields of its core. A server that yielded every 60 µs or so left
// clients waiting (scratch programs: 0.53 of memcpy against 0.73-0.83
// yielding every few microseconds); one that looked for 20 µs after
// each post took 0.39-0.41 against 0.46-0.48 from the copies.
const sweepLooks = 5 * time.Microsecond

// spinFor is how long to sweep on from now.
func (w *mailboxSweeper) spinFor(now time.Duration, cores int) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.spinForLocked(now, cores)
}

// spinForLocked is spinFor. REQUIRES: w.mu.
func (w *mailboxSweeper) spinForLocked(now time.Duration, cores int) time.Duration {
	active := 0
	for _, s := range w.sessions {
		if now-s.last < activeWindow {
			active++
		}
	}
	return w.pace.spinFor(now, active, cores, w.spin)
}

// sweep serves every pending post and reports whether there was one, and
// when.
func (w *mailboxSweeper) sweep() (now time.Duration, served bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.sessions {
		s := &w.sessions[i]
		if !s.d.mbox.Pending() {
			continue
		}
		if now == 0 {
			now = time.Since(w.epoch)
		}
		s.last = now
		w.pace.post(now)
		s.d.servePostAside(servedBySweeper)
	}
	return now, now != 0
}

// watch starts or stops the sweeper's watch of every mailbox; stopping,
// it reports whether a post was pending after (the sweep must go on).
func (w *mailboxSweeper) watch(on bool) (pending bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.awake.Store(on)
	for _, s := range w.sessions {
		if on {
			s.d.mbox.Watch()
		} else if s.d.mbox.Unwatch() {
			pending = true
		}
	}
	return pending
}

// activeWindow is how recently a session must have posted to count as
// one of the clients at work.
const activeWindow = 10 * time.Millisecond

// paceWindow and busyPosts: the sweeper keeps sweeping, while more
// clients are at work than half the cores, only if the last paceWindow
// brought busyPosts posts or more (a post every 100 µs). A post that finds
// it asleep costs a wake-up, 15-20 µs to the client and 33-41 µs of the
// copy the woken thread interrupts; a sweep that yields costs little, but
// once it has yielded to a copy, the next post waits until that copy is
// done or the kernel's tick comes. Measured on two vCPUs, four writers, a
// node in another process: 2 MiB puts (a post every 30-60 µs) gained from
// the sweep, 16 MiB puts and batches of 16 (a post every 250 µs or more)
// lost (0.63-0.78 of memcpy against 0.76-0.94 with the readers alone).
const (
	paceWindow = time.Millisecond
	busyPosts  = 10
)

// sweepPace counts the posts a sweeper serves, or is told of, over the
// last window, and decides from it how long to sweep on after one. Pure:
// the caller passes the time.
type sweepPace struct {
	start       time.Duration // the current window's start
	cur, before int           // posts in it, and in the one before
}

// post records a post at now.
func (p *sweepPace) post(now time.Duration) {
	p.roll(now)
	p.cur++
}

// roll moves the window to now.
func (p *sweepPace) roll(now time.Duration) {
	switch d := now - p.start; {
	case d < paceWindow:
	case d < 2*paceWindow:
		p.start, p.before, p.cur = p.start+paceWindow, p.cur, 0
	default:
		p.start, p.before, p.cur = now, 0, 0
	}
}

// spinFor is how long to sweep on at now: spin while the posts come close
// together, or while the clients at work (active) leave a core free for
// the sweep and post at all often (two posts or more over the last two
// windows); otherwise not at all.
func (p *sweepPace) spinFor(now time.Duration, active, cores int, spin time.Duration) time.Duration {
	p.roll(now)
	busy := p.cur >= busyPosts || p.before >= busyPosts
	if busy || active <= max(1, cores/2) && p.cur+p.before >= 2 {
		return spin
	}
	return 0
}
