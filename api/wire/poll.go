package wire

import (
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
)

// pollingReader reads a connection's socket without letting its goroutine
// sleep while the next bytes are likely moments away (a node waiting for a
// client's next request, a client waiting for the node's response): a read that finds
// nothing retries for up to spin before it parks in the netpoller as a
// plain Read would. The socket is non-blocking (Go's runtime makes it so),
// so each retry is one read(2). Deadlines set on the connection still
// bound the parked wait; the spin itself is bounded by spin.
//
// A spin holds one of the Go runtime's processors, which nothing else in
// the process can use meanwhile: a connection whose requests keep coming
// later than spin (a client that copies a large block between reserve and
// commit) stops spinning, for 1, 3, 7, … up to 63 reads after each spin
// in a row that found nothing, and spins again once one finds its
// request.
type pollingReader struct {
	rc       syscall.RawConn
	spin     func() time.Duration // how long the next read may spin
	spinners *Spinners
	// misses counts the spins in a row that timed out; skip is how many
	// more reads park at once. Reads of one connection are sequential.
	misses, skip int
}

// Spinners bounds how many polling readers spin at once: half the
// process's processors (at least one), so spinning never starves the work
// it waits for (the node's own, or its clients' on the same host). A node
// shares one among its connections, a client among its sessions. Safe for
// concurrent use.
type Spinners struct {
	n   atomic.Int32
	max int32
}

// NewSpinners allows half of GOMAXPROCS readers to spin at once, one at
// least.
func NewSpinners() *Spinners { return &Spinners{max: int32(max(1, runtime.GOMAXPROCS(0)/2))} }

// enter takes a spinning slot, or reports that none is free.
func (s *Spinners) enter() bool {
	if s.n.Add(1) > s.max {
		s.n.Add(-1)
		return false
	}
	return true
}

func (s *Spinners) exit() { s.n.Add(-1) }

// NewPollingReader returns a reader of c that spins for up to spin() on
// each read that finds nothing (see pollingReader), or c itself when spin
// is nil or c has no socket to poll. Spinning readers share the slots of
// sp. Reads MUST be sequential, as a bufio.Reader's are.
func NewPollingReader(c net.Conn, spin func() time.Duration, sp *Spinners) io.Reader {
	sc, ok := c.(syscall.Conn)
	if spin == nil || !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &pollingReader{rc: rc, spin: spin, spinners: sp}
}

func (r *pollingReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var rerr error
	var until time.Time
	spinning, mayspin := false, r.skip == 0
	if !mayspin {
		r.skip--
	}
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), p)
			switch {
			case rerr == syscall.EINTR:
				continue
			case rerr != syscall.EAGAIN:
				if spinning {
					r.misses = 0 // the spin found its request
				}
				return true
			case !mayspin:
				return false
			}
			// Give the core to any thread that is ready to run (the
			// writer's checksum helper, another client) rather than
			// take it from them: the spin only needs the cycles nobody
			// else wants.
			syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
			now := time.Now()
			if until.IsZero() {
				until = now.Add(r.spin())
				if spinning = r.spinners.enter(); !spinning {
					return false
				}
			} else if now.After(until) {
				if spinning {
					r.spinners.exit()
					spinning = false
					r.misses++
					r.skip = 1<<min(r.misses, 6) - 1
				}
				return false // sleep until the socket is readable
			}
		}
	})
	if spinning {
		r.spinners.exit()
	}
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
