package wire

import (
	"errors"
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
	spin     func() time.Duration // how long the next read may spin (≤0: it does not); nil: never
	spinners *Spinners
	// misses counts the spins in a row that timed out; skip is how many
	// more reads park at once. Reads of one connection are sequential.
	misses, skip int

	// A SessionReader's: rights has reads take descriptors sent with the
	// bytes (recvmsg), kept in fds; mbox, while armed, is watched as the
	// socket is, and a post in it ends a read that finds the socket empty
	// (ErrMailboxRequest); parked is set while the node's parked word is
	// raised.
	rights bool
	fds    []int
	oob    []byte
	mbox   *Mailbox
	armed  bool
	parked bool
	// local is set once the session's client serves its own posts (see
	// LocalServer): the mailbox is no longer watched.
	local bool

	cur  readState          // the Read in progress
	poll func(uintptr) bool // r.pollSocket, made once
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

// mailboxHotLooks is how many times a spinning read looks at the
// mailbox between two system calls: a few microseconds of loads.
const mailboxHotLooks = 2048

// ErrMailboxRequest is what an armed SessionReader's Read returns when
// the socket holds nothing and the mailbox holds a post: the caller serves
// the mailbox, then reads again.
var ErrMailboxRequest = errors.New("wire: a request waits in the mailbox")

func (r *pollingReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	// A session whose client serves its own posts has nothing coming on
	// the socket worth a spin: releases, and its end.
	mayspin := r.spin != nil && r.skip == 0 && !r.local
	if !mayspin && r.skip > 0 {
		r.skip--
	}
	r.cur = readState{p: p, mayspin: mayspin, watch: r.armed && r.mbox != nil && !r.local}
	if r.poll == nil {
		r.poll = r.pollSocket // once: a closure made per Read escapes
	}
	err := r.rc.Read(r.poll)
	st := r.cur
	r.cur = readState{} // keeps no reference to p
	if st.spinning {
		r.spinners.exit()
	}
	if r.parked {
		r.mbox.Watch()
		r.parked = false
	}
	switch {
	case err != nil:
		return 0, err
	case st.posted:
		return 0, ErrMailboxRequest
	case st.rerr != nil:
		return 0, st.rerr
	case st.n == 0:
		return 0, io.EOF
	}
	return st.n, nil
}

// readState is the state of one Read, kept in the reader so that the
// function RawConn.Read calls is made once rather than as a closure per
// Read, which escaped with its variables: six allocations a read, a
// node's commit among them.
type readState struct {
	p        []byte
	n        int
	rerr     error
	until    time.Time
	spinning bool // holds a slot of spinners
	mayspin  bool
	watch    bool // the mailbox is watched
	posted   bool // the mailbox holds a post
}

// pollSocket is the function r.rc.Read calls with the socket, for r.cur:
// it reports whether the read is done (true) or should sleep until the
// socket is readable (false).
func (r *pollingReader) pollSocket(fd uintptr) bool {
	st := &r.cur
	for i := 0; ; i++ {
		// The mailbox is looked at before the socket: bytes the
		// client wrote before it posted are then in the socket
		// already, and are read first. While the mailbox carries
		// the session's requests, the socket, which carries only
		// releases and wakes then, is read on every fourth look.
		pending := st.watch && r.mbox.Pending()
		if st.watch && !pending && i%4 != 0 {
			st.rerr = syscall.EAGAIN
		} else {
			st.n, st.rerr = r.read(int(fd), st.p)
		}
		switch {
		case st.rerr == syscall.EINTR:
			continue
		case st.rerr != syscall.EAGAIN:
			if st.spinning {
				r.misses = 0 // the spin found its request
			}
			return true
		case pending:
			if st.spinning {
				r.misses = 0
			}
			st.posted = true
			return true
		case !st.mayspin:
			return r.park()
		}
		if st.watch && i%4 != 0 {
			// Between the socket's reads, watch the mailbox without
			// a system call for a few microseconds: a post is seen
			// at once, and the spin makes no system calls there
			// (one each look slowed a copy on the other vCPU by
			// 4-6 % on a paravirtualized host).
			for k := 0; k < mailboxHotLooks && !r.mbox.Pending(); k++ {
			}
		} else {
			// Give the core to any thread that is ready to run
			// (the writer's checksum helper, another client)
			// rather than take it from them: the spin only needs
			// the cycles nobody else wants.
			syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		}
		now := time.Now()
		if st.until.IsZero() {
			d := r.spin()
			if d <= 0 {
				return r.park() // no spin for this read (spin's call)
			}
			st.until = now.Add(d)
			if st.spinning = r.spinners.enter(); !st.spinning {
				return r.park()
			}
		} else if now.After(st.until) {
			if st.spinning {
				r.spinners.exit()
				st.spinning = false
				r.misses++
				r.skip = 1<<min(r.misses, 6) - 1
			}
			return r.park()
		}
	}
}

// park is where a read that found nothing stops polling: with a mailbox
// watched, the reader stops watching it (the node's parked word goes up
// unless another watcher remains; see Mailbox.Unwatch) and looks at it
// once more, so a post made just before is served now and one made after
// brings an OpWake (or is another watcher's). It reports whether the read
// is done.
//
// A Read may park more than once (the netpoller can wake it for bytes a
// spin already took): it stops watching only the first time, so that the
// watch it takes up again as it returns undoes exactly one.
func (r *pollingReader) park() bool {
	if r.cur.watch {
		var pending bool
		if !r.parked {
			r.parked = true
			pending = r.mbox.Unwatch()
		} else {
			pending = r.mbox.Pending()
		}
		if pending {
			r.cur.posted = true
			return true
		}
	}
	return false // sleep until the socket is readable
}

// read is one read(2) of the socket, or recvmsg(2) keeping any
// descriptors that came with the bytes.
func (r *pollingReader) read(fd int, p []byte) (int, error) {
	if !r.rights {
		return syscall.Read(fd, p)
	}
	if r.oob == nil {
		r.oob = make([]byte, syscall.CmsgSpace(4*maxDescriptors))
	}
	n, oobn, _, _, err := syscall.Recvmsg(fd, p, r.oob, syscall.MSG_CMSG_CLOEXEC)
	if err != nil || oobn == 0 {
		return n, err
	}
	msgs, perr := syscall.ParseSocketControlMessage(r.oob[:oobn])
	for i := range msgs {
		if fds, err := syscall.ParseUnixRights(&msgs[i]); err == nil && perr == nil {
			r.fds = append(r.fds, fds...)
		} else if err == nil {
			closeAll(fds)
		}
	}
	if len(r.fds) > maxDescriptors {
		// More than any frame sends: a client that sends descriptors
		// nobody asked for does not make the node hold them.
		closeAll(r.fds[maxDescriptors:])
		r.fds = r.fds[:maxDescriptors]
	}
	return n, nil
}

// maxDescriptors bounds the descriptors a SessionReader keeps untaken.
const maxDescriptors = 2

func closeAll(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// SessionReader is a node's reader of a same-host session's unix socket:
// a polling reader (see NewPollingReader; no spinning when spin is nil)
// that also keeps descriptors sent with the bytes (an OpMailbox's memfd)
// for TakeDescriptors, and, once it watches a mailbox, while armed, ends
// a read that finds the socket empty and the mailbox posted with
// ErrMailboxRequest. It is not safe for concurrent use: the session's
// serve loop owns it.
type SessionReader struct{ pollingReader }

// NewSessionReader returns the reader of c.
func NewSessionReader(c *net.UnixConn, spin func() time.Duration, sp *Spinners) (*SessionReader, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &SessionReader{pollingReader{rc: rc, spin: spin, spinners: sp, rights: true}}, nil
}

// Watch makes reads watch m (while armed) from now on; the reader counts
// as one of m's watchers while it is not parked (Mailbox.Watch). nil
// stops the watch.
func (r *SessionReader) Watch(m *Mailbox) {
	if m != nil {
		m.Watch()
	}
	r.mbox = m
}

// ServeLocally stops the mailbox watch for good, and the spins: the
// session's client, in this process, serves its posts itself (see
// LocalServer). The node's goroutine calls it before it answers the
// handover, so no read of its own watches the mailbox after that.
func (r *SessionReader) ServeLocally() { r.local = true }

// Arm turns the mailbox watch on or off: the serve loop arms it only
// between frames, so a post never cuts into a frame read in parts.
func (r *SessionReader) Arm(on bool) { r.armed = on }

// ExpectPost has the next read spin (within spin's time) even after
// spins that found nothing: the client said, with an OpWake ahead of
// its post (one that found nothing posted), that a post is coming.
func (r *SessionReader) ExpectPost() { r.skip = 0 }

// TakeDescriptors returns the descriptors received and not yet taken; the
// caller owns them and MUST close them.
func (r *SessionReader) TakeDescriptors() []int {
	fds := r.fds
	r.fds = nil
	return fds
}

// Close closes the descriptors nobody took.
func (r *SessionReader) Close() { closeAll(r.TakeDescriptors()) }
