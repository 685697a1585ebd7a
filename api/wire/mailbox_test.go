package wire

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/internal/eventually"
)

// newTestMailbox maps a fresh shared page pair, as a client would.
func newTestMailbox(t *testing.T) (*Mailbox, []byte) { return mapTestMailbox(t, -1) }

// mapTestMailbox maps fd (anonymous memory when -1) as a Mailbox, until
// the test ends.
func mapTestMailbox(t *testing.T, fd int) (*Mailbox, []byte) {
	t.Helper()
	flags := unix.MAP_SHARED
	if fd < 0 {
		flags |= unix.MAP_ANON
	}
	mem, err := unix.Mmap(fd, 0, MailboxBytes, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	mb, err := NewMailbox(mem)
	if err != nil {
		t.Fatal(err)
	}
	return mb, mem
}

func TestMailboxPostTakeRespond(t *testing.T) {
	if _, err := NewMailbox(make([]byte, MailboxBytes-1)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a short mailbox: %v, want ErrProtocol", err)
	}
	mb, mem := newTestMailbox(t)
	if _, err := NewMailbox(mem[8 : MailboxBytes-56 : MailboxBytes-56]); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a misaligned mailbox: %v", err)
	}
	// The node keeps its own count: a client and node that share one
	// Mailbox value here behave as two mappings would.
	if mb.Pending() {
		t.Fatal("a new mailbox has a post pending")
	}
	req := AppendRequest(nil, &Request{Op: OpCommit, Handle: 7})
	seq, parked := mb.Post(req)
	if seq != 1 || parked || !mb.Pending() || mb.Answered(seq) {
		t.Fatalf("after a post: seq %d, parked %v, pending %v, answered %v", seq, parked, mb.Pending(), mb.Answered(seq))
	}
	buf := make([]byte, MailboxRequestBytes)
	got, frames, err := mb.Take(buf)
	if err != nil || got != seq || !bytes.Equal(frames, req) {
		t.Fatalf("take: %d %x %v", got, frames, err)
	}
	mb.SetClientParked(true)
	resp := AppendResponse(nil, &Response{Handle: 8})
	onSocket, clientParked := mb.Respond(seq, resp)
	if onSocket || !clientParked || mb.Pending() || !mb.Answered(seq) {
		t.Fatalf("respond: onSocket %v clientParked %v pending %v", onSocket, clientParked, mb.Pending())
	}
	ans, onSocket, err := mb.Answer()
	if err != nil || onSocket || !bytes.Equal(ans, resp) {
		t.Fatalf("answer %x on socket %v: %v", ans, onSocket, err)
	}
	mb.SetClientParked(false)

	// The node's parked word, up once nobody watches, reaches the next
	// post.
	mb.Watch()
	if mb.Unwatch() {
		t.Fatal("unwatch: a post pending")
	}
	if seq, parked = mb.Post(req); seq != 2 || !parked {
		t.Fatalf("post to a parked node: seq %d parked %v", seq, parked)
	}
	mb.Watch()
	// An answer too long for the mailbox is marked as on the socket.
	if onSocket, _ = mb.Respond(seq, make([]byte, MailboxResponseBytes+1)); !onSocket {
		t.Fatal("a long answer was not sent to the socket")
	}
	if ans, onSocket, err = mb.Answer(); err != nil || !onSocket || ans != nil {
		t.Fatalf("answer on socket: %x %v %v", ans, onSocket, err)
	}
}

// A client that scribbles over the mailbox's length words gets errors,
// not reads beyond the mailbox.
func TestMailboxScribbledLengths(t *testing.T) {
	mb, mem := newTestMailbox(t)
	mb.Post(nil)
	mb.u32(mbReqLen).Store(MailboxRequestBytes + 1)
	if _, _, err := mb.Take(make([]byte, MailboxRequestBytes)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("take of an overlong post: %v", err)
	}
	mb.u32(mbReqLen).Store(100)
	if _, _, err := mb.Take(make([]byte, 50)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("take into a short buffer: %v", err)
	}
	mb.Respond(1, nil)
	mb.u32(mbRespLen).Store(MailboxResponseBytes + 1)
	if _, _, err := mb.Answer(); !errors.Is(err, ErrProtocol) {
		t.Fatalf("an overlong answer: %v", err)
	}
	if !bytes.Equal(mem[mbResponse+MailboxResponseBytes:], nil) {
		t.Fatal("the answer area runs past the mailbox")
	}
}

// unixPair is a connected pair of unix stream sockets.
func unixPair(t *testing.T) (client, server *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "unix")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	client, server = conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// echoNode is a working stand-in for a node's session loop (pool's
// dataServer.serve): it reads frames with a SessionReader, armed between
// frames, serves posts from the mailbox the client hands over, and
// answers every request with its Handle plus one, in the mailbox or on
// the socket as the request came. It records the ops in the order served.
type echoNode struct {
	mu  sync.Mutex
	ops []string
	err error
	// stalledWatcher adds a watcher of the mailbox that never serves it
	// (a node's sweeper that lost its core): the parked word stays down
	// while the reader parks.
	stalledWatcher bool
}

func (e *echoNode) note(how string, r *Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ops = append(e.ops, fmt.Sprintf("%s %s %d", how, r.Op, r.Handle))
}

func (e *echoNode) serve(c *net.UnixConn, spin time.Duration) {
	var spinFn func() time.Duration
	if spin > 0 {
		spinFn = func() time.Duration { return spin }
	}
	sr, err := NewSessionReader(c, spinFn, NewSpinners())
	if err != nil {
		e.err = err
		return
	}
	defer sr.Close()
	br := bufio.NewReader(sr)
	var mb *Mailbox
	var mem []byte
	defer func() {
		if mem != nil {
			unix.Munmap(mem)
		}
	}()
	var rbuf [RequestBufferBytes]byte
	var req Request
	post := make([]byte, MailboxRequestBytes)
	for {
		sr.Arm(true)
		_, err := br.Peek(1)
		sr.Arm(false)
		if errors.Is(err, ErrMailboxRequest) {
			seq, frames, err := mb.Take(post)
			if err != nil {
				e.err = err
				return
			}
			var out []byte
			rd := bytes.NewReader(frames)
			for rd.Len() > 0 {
				if err := ReadRequest(rd, rbuf[:], &req); err != nil {
					e.err = err
					return
				}
				e.note("mailbox", &req)
				if req.Op.HasResponse() {
					out = AppendResponse(out, &Response{Handle: req.Handle + 1, Message: strings.Repeat("x", int(req.ValueLen))})
				}
			}
			onSocket, parked := mb.Respond(seq, out)
			switch {
			case onSocket:
				c.Write(out)
			case parked:
				c.Write(AppendResponse(nil, &Response{Flags: FlagWake}))
			}
			continue
		}
		if err == nil {
			err = ReadRequest(br, rbuf[:], &req)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				e.err = err
			}
			return
		}
		e.note("socket", &req)
		switch req.Op {
		case OpMailbox:
			fds := sr.TakeDescriptors()
			if len(fds) != 1 {
				e.err = fmt.Errorf("OpMailbox with %d descriptors", len(fds))
				return
			}
			mem, err = unix.Mmap(fds[0], 0, MailboxBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			unix.Close(fds[0])
			if err == nil {
				mb, err = NewMailbox(mem)
			}
			if err != nil {
				e.err = err
				return
			}
			sr.Watch(mb)
			if e.stalledWatcher {
				mb.Watch()
			}
		case OpWake:
			if mb != nil && !mb.Pending() {
				sr.ExpectPost() // a wake ahead of a post, as pool's
			}
			continue
		}
		if req.Op.HasResponse() {
			c.Write(AppendResponse(nil, &Response{Handle: req.Handle + 1}))
		}
	}
}

// run serves su in a goroutine with a reader that spins spin after each
// frame; stop closes the client's end cu, waits for the node to end and
// fails the test on what went wrong there.
func (e *echoNode) run(t *testing.T, su, cu *net.UnixConn, spin time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() { defer close(done); e.serve(su, spin) }()
	return func() {
		t.Helper()
		cu.Close()
		<-done
		if e.err != nil {
			t.Fatal(e.err)
		}
	}
}

// handOver sends a fresh memfd mailbox to the node as a client does.
func handOver(t *testing.T, uc *net.UnixConn, c *Conn) *Mailbox {
	t.Helper()
	fd, err := unix.MemfdCreate("test-mailbox", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, MailboxBytes); err != nil {
		t.Fatal(err)
	}
	mb, _ := mapTestMailbox(t, fd)
	if _, _, err := uc.WriteMsgUnix(AppendRequest(nil, &Request{Op: OpMailbox, Handle: 100}), unix.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Recv(); err != nil || r.Handle != 101 {
		t.Fatalf("mailbox hand-over: %+v %v", r, err)
	}
	c.UseMailbox(mb)
	return mb
}

// Requests and answers pass through the mailbox whether each side polls
// or parks (every combination of the wake-ups), in order with what goes
// over the socket, and the Conn reads answers from either.
func TestConnMailboxRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		name             string
		nodeSpin, client time.Duration
	}{
		{"both poll", 50 * time.Millisecond, 50 * time.Millisecond},
		{"node parks", 0, 50 * time.Millisecond},
		{"client parks", 50 * time.Millisecond, 0},
		{"both park", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cu, su := unixPair(t)
			node := &echoNode{}
			stop := node.run(t, su, cu, tc.nodeSpin)
			c := NewConn(cu, ConnConfig{SpinWait: tc.client, Spinners: NewSpinners()})
			handOver(t, cu, c)
			var want []string
			for i := uint64(1); i <= 200; i++ {
				// A release queued in front rides in the same post.
				c.Queue(&Request{Op: OpRelease, Handle: 1000 + i})
				r, err := c.RoundTrip(t.Context(), &Request{Op: OpCommit, Handle: i})
				if err != nil || r.Handle != i+1 {
					t.Fatalf("round trip %d: %+v %v", i, r, err)
				}
				want = append(want, fmt.Sprintf("mailbox release %d", 1000+i), fmt.Sprintf("mailbox commit %d", i))
				if i%50 == 0 {
					// Ops that are not the mailbox's go over the socket,
					// after what was posted before.
					if r, err = c.RoundTrip(t.Context(), &Request{Op: OpGet, Handle: i}); err != nil || r.Handle != i+1 {
						t.Fatalf("get %d over the socket: %+v %v", i, r, err)
					}
					want = append(want, fmt.Sprintf("socket get %d", i))
				}
			}
			stop()
			var got []string
			for _, op := range node.ops {
				if !strings.HasPrefix(op, "socket wake") && !strings.HasPrefix(op, "socket mailbox") {
					got = append(got, op)
				}
			}
			if strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Fatalf("the node served\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// A client whose post finds the node awake, yet gets no answer within
// its poll, wakes the session's goroutine before it parks: a watcher that
// lost its core (the node's sweeper) does not leave the post waiting.
//
// The node's reader parks after each post it serves; a post made before
// it has parked is one it finds itself, without a wake, so under load not
// every post needs one. Every post must be answered, though: without the
// wake the client would wait for ever on a socket nobody writes to.
func TestConnMailboxWakesAStalledNode(t *testing.T) {
	cu, su := unixPair(t)
	node := &echoNode{stalledWatcher: true}
	stop := node.run(t, su, cu, 0)
	c := NewConn(cu, ConnConfig{SpinWait: 100 * time.Microsecond, Spinners: NewSpinners()})
	handOver(t, cu, c)
	for i := uint64(1); i <= 20; i++ {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		r, err := c.RoundTrip(ctx, &Request{Op: OpCommit, Handle: i})
		cancel()
		if err != nil || r.Handle != i+1 {
			t.Fatalf("round trip %d: %+v %v", i, r, err)
		}
	}
	stop()
	wakes := 0
	for _, op := range node.ops {
		if strings.HasPrefix(op, "socket wake") {
			wakes++
		}
	}
	if wakes == 0 {
		t.Fatal("no wake for 20 posts the node looked awake for and did not serve")
	}
	t.Logf("%d wakes for 20 posts", wakes)
}

// A post made ahead (PostAhead) is answered while the client does
// something else, whether the node polls or parks; Settle then has Recv
// read its answers, a second post before Settle is refused, and requests
// that cannot go through the mailbox stay queued for a round trip.
func TestConnPostAhead(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodeSpin time.Duration
	}{{"node polls", 50 * time.Millisecond}, {"node parks", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			cu, su := unixPair(t)
			node := &echoNode{}
			stop := node.run(t, su, cu, tc.nodeSpin)
			c := NewConn(cu, ConnConfig{SpinWait: 100 * time.Microsecond, Spinners: NewSpinners()})
			handOver(t, cu, c)
			for i := uint64(1); i <= 50; i++ {
				c.Queue(&Request{Op: OpCommit, Handle: 10 * i})
				c.Queue(&Request{Op: OpReserve, Handle: 10*i + 5})
				if posted, err := c.PostAhead(i%2 == 0); !posted || err != nil {
					t.Fatalf("post %d: posted %v, %v", i, posted, err)
				}
				if inFlight, _ := c.Ahead(); !inFlight {
					t.Fatalf("post %d: not in flight", i)
				}
				// Another post must wait for Settle.
				if _, err := c.RoundTrip(t.Context(), &Request{Op: OpCommit, Handle: 1}); !errors.Is(err, errPostAhead) {
					t.Fatalf("a round trip with a post in flight: %v, want errPostAhead", err)
				}
				if posted, err := c.PostAhead(i%2 == 0); posted || err != nil {
					t.Fatalf("a second post ahead: posted %v, %v", posted, err)
				}
				eventually.True(t, "the answer", 10*time.Second, func() bool { _, answered := c.Ahead(); return answered })
				if err := c.Settle(); err != nil {
					t.Fatal(err)
				}
				for _, want := range []uint64{10*i + 1, 10*i + 6} {
					if r, err := c.Recv(); err != nil || r.Handle != want {
						t.Fatalf("post %d: answer %+v %v, want handle %d", i, r, err, want)
					}
				}
				if inFlight, _ := c.Ahead(); inFlight {
					t.Fatalf("post %d settled, still in flight", i)
				}
			}
			if err := c.Settle(); err != nil {
				t.Fatalf("Settle with nothing in flight: %v", err)
			}
			// A get is not the mailbox's: nothing is posted, and it goes
			// over the socket on the next flush.
			c.Queue(&Request{Op: OpGet, Handle: 7})
			if posted, err := c.PostAhead(true); posted || err != nil {
				t.Fatalf("a get posted ahead: %v, %v", posted, err)
			}
			if err := c.Flush(nil); err != nil {
				t.Fatal(err)
			}
			if r, err := c.Recv(); err != nil || r.Handle != 8 {
				t.Fatalf("get over the socket: %+v %v", r, err)
			}
			stop()
			posts := 0
			for _, op := range node.ops {
				if strings.HasPrefix(op, "mailbox commit") {
					posts++
				}
			}
			if posts != 50 {
				t.Fatalf("the node took %d commits from the mailbox, want 50 (%v)", posts, node.ops)
			}
		})
	}
}

// A writer about to post wakes a parked node ahead of it (WakeAhead): the
// node's reader, woken, spins, though its last spin found nothing, and the
// post comes while it watches, with no wake of its own. A node that
// watches its mailbox gets no wake ahead.
func TestConnWakeAhead(t *testing.T) {
	t.Run("parked node", func(t *testing.T) {
		cu, su := unixPair(t)
		node := &echoNode{}
		// The reader spins a second after each frame, then parks.
		stop := node.run(t, su, cu, time.Second)
		c := NewConn(cu, ConnConfig{SpinWait: 100 * time.Microsecond, Spinners: NewSpinners()})
		mb := handOver(t, cu, c)
		eventually.True(t, "the node to park", 10*time.Second, mb.NodeParked)
		if err := c.WakeAhead(); err != nil {
			t.Fatal(err)
		}
		// A writer posts a copy's time later, by when the woken node
		// watches.
		eventually.True(t, "the node to watch", 10*time.Second, func() bool { return !mb.NodeParked() })
		if r, err := c.RoundTrip(t.Context(), &Request{Op: OpCommit, Handle: 1}); err != nil || r.Handle != 2 {
			t.Fatalf("round trip: %+v %v", r, err)
		}
		stop()
		if got, want := strings.Join(node.ops, ","), "socket mailbox 100,socket wake 0,mailbox commit 1"; got != want {
			t.Fatalf("the node served %s, want %s", got, want)
		}
	})
	t.Run("watched mailbox", func(t *testing.T) {
		cu, su := unixPair(t)
		node := &echoNode{stalledWatcher: true}
		stop := node.run(t, su, cu, 0)
		c := NewConn(cu, ConnConfig{SpinWait: 100 * time.Microsecond, Spinners: NewSpinners()})
		handOver(t, cu, c)
		if err := c.WakeAhead(); err != nil {
			t.Fatal(err)
		}
		// A get goes over the socket, behind anything WakeAhead sent.
		if r, err := c.RoundTrip(t.Context(), &Request{Op: OpGet, Handle: 1}); err != nil || r.Handle != 2 {
			t.Fatalf("get: %+v %v", r, err)
		}
		stop()
		if got, want := strings.Join(node.ops, ","), "socket mailbox 100,socket get 1"; got != want {
			t.Fatalf("the node served %s, want %s", got, want)
		}
	})
	// Without a mailbox there is nothing to wake ahead of.
	cu, _ := unixPair(t)
	if err := NewConn(cu, ConnConfig{SpinWait: time.Millisecond, Spinners: NewSpinners()}).WakeAhead(); err != nil {
		t.Fatal(err)
	}
}

// Posts too long for the mailbox, and answers too long for it, go over
// the socket; a wake left on the socket is skipped by the next Recv.
func TestConnMailboxOverflowAndStrayWake(t *testing.T) {
	cu, su := unixPair(t)
	node := &echoNode{}
	stop := node.run(t, su, cu, 0)
	c := NewConn(cu, ConnConfig{SpinWait: time.Millisecond, Spinners: NewSpinners()})
	mb := handOver(t, cu, c)
	// Enough commits that their frames overflow the request area.
	n := MailboxRequestBytes/RequestHeaderBytes + 1
	for i := range n {
		c.Queue(&Request{Op: OpCommit, Handle: uint64(i)})
	}
	if err := c.Flush(nil); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if r, err := c.Recv(); err != nil || r.Handle != uint64(i)+1 {
			t.Fatalf("response %d: %+v %v", i, r, err)
		}
	}
	// Two answers with long messages overflow the answer area: the node
	// writes them to the socket, and Recv reads them there.
	for i := range 2 {
		c.Queue(&Request{Op: OpCommit, Handle: uint64(i), ValueLen: 3500})
	}
	if err := c.Flush(nil); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if r, err := c.Recv(); err != nil || r.Handle != uint64(i)+1 || len(r.Message) != 3500 {
			t.Fatalf("long response %d: handle %d, %d-byte message, %v", i, r.Handle, len(r.Message), err)
		}
	}
	if posts := mb.u64(mbReqSeq).Load(); posts != 1 {
		t.Fatalf("%d posts, want 1 (the overflowing one went over the socket)", posts)
	}
	// A stray wake (the node saw the parked word just as the client found
	// the answer) is skipped.
	su.Write(AppendResponse(nil, &Response{Flags: FlagWake}))
	if r, err := c.RoundTrip(t.Context(), &Request{Op: OpGet, Handle: 5}); err != nil || r.Handle != 6 {
		t.Fatalf("after a stray wake: %+v %v", r, err)
	}
	stop()
}

// A session reader keeps descriptors sent with the bytes, at most
// maxDescriptors, for TakeDescriptors.
func TestSessionReaderDescriptors(t *testing.T) {
	cu, su := unixPair(t)
	sr, err := NewSessionReader(su, nil, NewSpinners())
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for range 3 {
		fd, err := unix.MemfdCreate("fd", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		fds = append(fds, fd)
	}
	if _, _, err := cu.WriteMsgUnix([]byte("abc"), unix.UnixRights(fds...), nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, err := sr.Read(buf); err != nil || string(buf[:n]) != "abc" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	got := sr.TakeDescriptors()
	if len(got) != maxDescriptors {
		t.Fatalf("kept %d descriptors, want %d", len(got), maxDescriptors)
	}
	for _, fd := range got {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatalf("a kept descriptor is not open: %v", err)
		}
		unix.Close(fd)
	}
	if len(sr.TakeDescriptors()) != 0 {
		t.Fatal("descriptors taken twice")
	}
	sr.Close()
}

// The node's parked word is up exactly while no watcher is left, and the
// last watcher to leave learns of a post made before it left.
func TestMailboxWatchers(t *testing.T) {
	mb, _ := newTestMailbox(t)
	parked := func() bool { return mb.u32(mbNodeParked).Load() != 0 }
	steps := []struct {
		name        string
		do          func() bool // reports pending where it is an Unwatch
		wantParked  bool
		wantPending bool
	}{
		{"the reader watches", func() bool { mb.Watch(); return false }, false, false},
		{"a sweeper watches too", func() bool { mb.Watch(); return false }, false, false},
		{"the reader parks", mb.Unwatch, false, false},
		{"the sweeper sleeps", mb.Unwatch, true, false},
		{"the reader wakes", func() bool { mb.Watch(); return false }, false, false},
		{"a post", func() bool { mb.Post(nil); return false }, false, false},
		{"the reader parks over it", mb.Unwatch, true, true},
	}
	for _, s := range steps {
		if pending := s.do(); pending != s.wantPending || parked() != s.wantParked {
			t.Fatalf("%s: pending %v parked %v, want %v %v", s.name, pending, parked(), s.wantPending, s.wantParked)
		}
	}
}

// However watchers interleave, the word is up once every watch ended.
func TestMailboxWatchersConcurrent(t *testing.T) {
	mb, _ := newTestMailbox(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 10000 {
				mb.Watch()
				mb.Unwatch()
			}
		})
	}
	wg.Wait()
	if mb.u32(mbNodeParked).Load() != 1 {
		t.Fatal("no watcher left, yet the node's parked word is down")
	}
}

// A read that parks twice (the netpoller woke it for bytes a spin had
// already taken, and it found nothing) leaves the mailbox watched once it
// returns, and unwatched, the word up, once it parks again: each park of
// one read undoes at most one watch.
func TestSessionReaderParksTwice(t *testing.T) {
	mb, _ := newTestMailbox(t)
	r := &pollingReader{mbox: mb, armed: true}
	mb.Watch() // as SessionReader.Watch
	r.cur = readState{watch: true}
	if r.park() || r.park() {
		t.Fatal("park reported a post, none pending")
	}
	// As the read returns (Read's end).
	mb.Watch()
	r.parked = false
	if mb.u32(mbNodeParked).Load() != 0 {
		t.Fatal("the reader is back, yet the node's parked word is up")
	}
	r.cur = readState{watch: true}
	if r.park() {
		t.Fatal("park reported a post, none pending")
	}
	if _, parked := mb.Post(nil); !parked {
		t.Fatal("a post to a parked reader was not told to wake it")
	}
	if !r.park() || !r.cur.posted {
		t.Fatal("parking again missed the post")
	}
}
