package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/internal/eventually"
)

// A same-host client's pins, reservations, commits and removes go
// through its mailbox whether the node and the client poll or park, or
// the client, in the node's process, serves them itself, and every byte
// comes back.
func TestShmMailbox(t *testing.T) {
	for _, tc := range []struct {
		name         string
		node, client time.Duration // spin waits; negative: never spin
		servedBy     string        // who serves the posts: node or client
	}{
		{"both poll", 0, 0, "node"},
		{"node parks", -1, 0, "node"},
		{"client parks", 0, -1, "node"},
		{"both park", -1, -1, "node"},
		{"client in the node's process serves", 0, 0, "client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := startNode(t, func(c *Config) { c.SpinWait = tc.node })
			ctx := context.Background()
			c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathShm, SpinWait: tc.client, NoLocationCache: true, NoLocalServe: tc.servedBy == "node"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// The node's side: its sessions' goroutines and its sweeper.
			posts := func(by string) float64 {
				if by == "node" {
					return testutil.ToFloat64(n.metrics.mailboxPosts.WithLabelValues("node")) + testutil.ToFloat64(n.metrics.mailboxPosts.WithLabelValues("sweeper"))
				}
				return testutil.ToFloat64(n.metrics.mailboxPosts.WithLabelValues(by))
			}
			before, beforeOther := posts(tc.servedBy), posts(otherServer(tc.servedBy))
			for i := range 40 {
				k := api.BlockKey{Tenant: "t", Namespace: "n", Key: fmt.Appendf(nil, "k%d", i)}
				v := value(uint64(i), 1000+i*997)
				if err := c.Put(ctx, k, v); err != nil {
					t.Fatal(err)
				}
				got, err := c.GetValue(ctx, k)
				if err != nil || !bytes.Equal(got, v) {
					t.Fatalf("get %d: %v", i, err)
				}
				view, err := c.View(ctx, k)
				if err != nil || !bytes.Equal(view.Bytes(), v) {
					t.Fatalf("view %d: %v", i, err)
				}
				view.Close()
				if i%2 == 0 {
					if err := c.Remove(ctx, k); err != nil {
						t.Fatal(err)
					}
				}
			}
			if _, err := c.GetValue(ctx, api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("k0")}); !errors.Is(err, api.ErrNotFound) {
				t.Fatalf("get of a removed block: %v, want ErrNotFound", err)
			}
			keys := [][]byte{[]byte("m0"), []byte("m1"), []byte("m2")}
			vals := [][]byte{value(100, 5000), value(101, 6000), value(102, 7000)}
			if errs, err := c.PutMany(ctx, "t", "n", keys, vals); err != nil || errors.Join(errs...) != nil {
				t.Fatalf("put many: %v %v", errs, err)
			}
			for i, k := range keys {
				if got, err := c.GetValue(ctx, api.BlockKey{Tenant: "t", Namespace: "n", Key: k}); err != nil || !bytes.Equal(got, vals[i]) {
					t.Fatalf("get %s: %v", k, err)
				}
			}
			// Puts, gets, views and removes: at least one post each, all
			// served by the one side.
			if got := posts(tc.servedBy) - before; got < 40*3 {
				t.Fatalf("%v mailbox posts served by the %s, want at least 120", got, tc.servedBy)
			}
			if got := posts(otherServer(tc.servedBy)) - beforeOther; got != 0 {
				t.Fatalf("%v mailbox posts served by the %s, want none", got, otherServer(tc.servedBy))
			}
		})
	}
}

func otherServer(by string) string {
	if by == "node" {
		return "client"
	}
	return "node"
}

// rawShmSession opens a session on n's shm socket without a client: the
// Hello's descriptors are closed, the connection is the caller's.
func rawShmSession(t *testing.T, n *Node) (*net.UnixConn, *wire.Conn) {
	t.Helper()
	return rawShmSessionAt(t, n.ShmSocket())
}

// rawShmSessionAt is rawShmSession on the shm socket at sock.
func rawShmSessionAt(t *testing.T, sock string) (*net.UnixConn, *wire.Conn) {
	t.Helper()
	nc, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	uc := nc.(*net.UnixConn)
	t.Cleanup(func() { uc.Close() })
	var h wire.Hello
	fds, err := wire.ReceiveHello(uc, &h, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return uc, wire.NewConn(uc, wire.ConnConfig{})
}

// mailboxFile makes a memfd of size bytes, sealed against shrinking when
// sealed is set.
func mailboxFile(t *testing.T, size int64, sealed bool) int {
	t.Helper()
	fd, err := unix.MemfdCreate("test-mailbox", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if sealed {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

// handOverMailbox sends OpMailbox with fds attached and returns the
// node's answer.
func handOverMailbox(t *testing.T, uc *net.UnixConn, c *wire.Conn, fds ...int) (*wire.Response, error) {
	t.Helper()
	return handOverMailboxFlags(t, uc, c, 0, fds...)
}

// handOverMailboxFlags is handOverMailbox with the request's flags.
func handOverMailboxFlags(t *testing.T, uc *net.UnixConn, c *wire.Conn, flags uint8, fds ...int) (*wire.Response, error) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := uc.WriteMsgUnix(wire.AppendRequest(nil, &wire.Request{Op: wire.OpMailbox, Flags: flags}), oob, nil); err != nil {
		t.Fatal(err)
	}
	return c.Recv()
}

// mailboxSession opens a raw session on n's shm socket and hands the node
// a mailbox, which it returns mapped here (with its memory, for tests
// that scribble over it).
func mailboxSession(t *testing.T, n *Node) (*net.UnixConn, *wire.Conn, *wire.Mailbox, []byte) {
	t.Helper()
	uc, c, mb, mem, _ := mailboxSessionFlags(t, n, 0)
	return uc, c, mb, mem
}

// mailboxSessionFlags is mailboxSession with the hand-over's flags; it
// also returns the answer's token (FlagServeLocally).
func mailboxSessionFlags(t *testing.T, n *Node, flags uint8) (*net.UnixConn, *wire.Conn, *wire.Mailbox, []byte, uint64) {
	t.Helper()
	uc, c := rawShmSession(t, n)
	fd := mailboxFile(t, wire.MailboxBytes, true)
	resp, err := handOverMailboxFlags(t, uc, c, flags, fd)
	if err != nil {
		t.Fatalf("hand-over: %+v %v", resp, err)
	}
	token := resp.Handle
	mem, err := unix.Mmap(fd, 0, wire.MailboxBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	mb, err := wire.NewMailbox(mem)
	if err != nil {
		t.Fatal(err)
	}
	return uc, c, mb, mem, token
}

// A node takes only a sealed memfd of the mailbox's size, once per
// session, and says why it refuses anything else; the session goes on.
func TestShmMailboxHandOverRefusals(t *testing.T) {
	n := startNode(t)
	uc, c := rawShmSession(t, n)
	for _, tc := range []struct {
		name string
		fds  []int
		code codes.Code
	}{
		{"no descriptor", nil, codes.InvalidArgument},
		{"two descriptors", []int{mailboxFile(t, wire.MailboxBytes, true), mailboxFile(t, wire.MailboxBytes, true)}, codes.InvalidArgument},
		{"not sealed", []int{mailboxFile(t, wire.MailboxBytes, false)}, codes.InvalidArgument},
		{"wrong size", []int{mailboxFile(t, 4096, true)}, codes.InvalidArgument},
		{"good", []int{mailboxFile(t, wire.MailboxBytes, true)}, codes.OK},
		{"a second one", []int{mailboxFile(t, wire.MailboxBytes, true)}, codes.FailedPrecondition},
	} {
		resp, err := handOverMailbox(t, uc, c, tc.fds...)
		if resp == nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if codes.Code(resp.Status) != tc.code || !c.Usable() {
			t.Fatalf("%s: status %d (%s), usable %v; want %s", tc.name, resp.Status, resp.Message, c.Usable(), tc.code)
		}
	}
	// Over TCP there is no mailbox to take.
	dc, err := wire.Dial(context.Background(), n.Addr().String(), wire.ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer dc.Close()
	if _, err := dc.RoundTrip(context.Background(), &wire.Request{Op: wire.OpMailbox}); err == nil {
		t.Fatal("a TCP session took a mailbox")
	}
}

// A post the node cannot serve (a malformed frame, an op that streams a
// value, a length past the request area) is answered with FlagClose and
// ends the session, whether the node's goroutine serves it or a client in
// the node's process does; the node's books stay balanced.
func TestShmMailboxBadPostsCloseTheSession(t *testing.T) {
	n := startNode(t)
	for _, servedBy := range []string{"node", "client"} {
		t.Run("served by the "+servedBy, func(t *testing.T) { badPostsCloseTheSession(t, n, servedBy) })
	}
	if err := n.Store().Check(); err != nil {
		t.Fatal(err)
	}
}

func badPostsCloseTheSession(t *testing.T, n *Node, servedBy string) {
	for _, tc := range []struct {
		name string
		post func(mem []byte, mb *wire.Mailbox)
	}{
		{"an op that streams a value", func(_ []byte, mb *wire.Mailbox) {
			mb.Post(wire.AppendRequest(nil, &wire.Request{Op: wire.OpGet, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")}))
		}},
		{"a truncated frame", func(_ []byte, mb *wire.Mailbox) {
			mb.Post(wire.AppendRequest(nil, &wire.Request{Op: wire.OpView, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")})[:20])
		}},
		{"garbage", func(_ []byte, mb *wire.Mailbox) { mb.Post(bytes.Repeat([]byte{0xff}, 100)) }},
		{"a length past the request area", func(mem []byte, mb *wire.Mailbox) {
			mb.Post(nil)
			mem[8], mem[9], mem[10], mem[11] = 0xff, 0xff, 0xff, 0x7f // the request length word
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var flags uint8
			if servedBy == "client" {
				flags = wire.FlagServeLocally
			}
			uc, c, mb, mem, token := mailboxSessionFlags(t, n, flags)
			// Something the session holds, which its end must release
			// (over the socket: the Conn does not use the mailbox).
			if _, err := c.RoundTrip(context.Background(), &wire.Request{Op: wire.OpReserve, ValueLen: 4096, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("held")}); err != nil {
				t.Fatal(err)
			}
			tc.post(mem, mb)
			if servedBy == "client" {
				local := wire.LookupLocal(token)
				if local == nil {
					t.Fatalf("token %#x names no session of this process", token)
				}
				local.ServePost()
				if !mb.Answered(1) {
					t.Fatal("the post was not answered when ServePost returned")
				}
			} else if _, err := uc.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpWake})); err != nil {
				t.Fatal(err) // in case the node had parked
			}
			eventually.True(t, "the node to answer the post", 10*time.Second, func() bool { return mb.Answered(1) })
			ans, onSocket, err := mb.Answer()
			if err != nil || onSocket {
				t.Fatalf("answer: %v on socket %v", err, onSocket)
			}
			var resp wire.Response
			if _, err := wire.DecodeResponseHeader(ans, &resp); err != nil {
				t.Fatal(err)
			}
			if codes.Code(resp.Status) != codes.InvalidArgument || resp.Flags&wire.FlagClose == 0 {
				t.Fatalf("answer status %d flags %#x, want InvalidArgument with FlagClose", resp.Status, resp.Flags)
			}
			// The node closes the session: whatever else it wrote, then EOF.
			uc.SetReadDeadline(time.Now().Add(10 * time.Second))
			// (Reset, when the node closed with the wake unread.)
			if _, err := io.Copy(io.Discard, uc); err != nil && !errors.Is(err, unix.ECONNRESET) {
				t.Fatalf("the session did not end: %v", err)
			}
			eventually.True(t, "the session's reservation to be aborted", 10*time.Second, func() bool { return n.Store().Stats().Reservations == 0 })
			if token != 0 {
				eventually.True(t, "the ended session's token to be forgotten", 10*time.Second, func() bool { return wire.LookupLocal(token) == nil })
			}
		})
	}
}

// FuzzShmMailboxPost posts arbitrary bytes to a session's mailbox: the
// node must answer or end the session, never panic, and keep its books
// balanced once the session is gone.
func FuzzShmMailboxPost(f *testing.F) {
	name := func(r wire.Request) wire.Request {
		r.Tenant, r.Namespace, r.Key = []byte("t"), []byte("n"), []byte("k")
		return r
	}
	reserve := name(wire.Request{Op: wire.OpReserve, ValueLen: 4096})
	view := name(wire.Request{Op: wire.OpView})
	f.Add(wire.AppendRequest(nil, &reserve))
	f.Add(wire.AppendRequest(wire.AppendRequest(nil, &reserve), &wire.Request{Op: wire.OpCommit, Handle: 1}))
	f.Add(wire.AppendRequest(wire.AppendRequest(nil, &wire.Request{Op: wire.OpRelease, Handle: 9}), &view))
	f.Add(wire.AppendRequest(nil, &wire.Request{Op: wire.OpAbort, Handle: 3}))
	f.Add([]byte{})
	n := startNode(f)
	f.Fuzz(func(t *testing.T, post []byte) {
		if len(post) > wire.MailboxRequestBytes {
			post = post[:wire.MailboxRequestBytes]
		}
		uc, _, mb, _ := mailboxSession(t, n)
		mb.Post(post)
		uc.Write(wire.AppendRequest(nil, &wire.Request{Op: wire.OpWake}))
		// Answered, or the session ended.
		buf := make([]byte, 64)
		for end := time.Now().Add(10 * time.Second); !mb.Answered(1) && time.Now().Before(end); {
			uc.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := uc.Read(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
		}
		uc.Close()
		eventually.True(t, "the session's reservations to be released", 10*time.Second, func() bool { return n.Store().Stats().Reservations == 0 })
		if err := n.Store().Check(); err != nil {
			t.Fatal(err)
		}
	})
}

// A client in the node's process serves its own posts, so the node's
// goroutine for the session sees nothing on the socket: the posts still
// count as traffic, and the session outlives many idle timeouts while
// they come.
func TestSameProcessSessionOutlivesIdleTimeouts(t *testing.T) {
	const idle = 40 * time.Millisecond
	n := startNode(t, func(c *Config) { c.IdleTimeout = idle })
	ctx := context.Background()
	c := dial(t, n, api.PathShm)
	handOvers := func() float64 { return testutil.ToFloat64(n.metrics.requests.WithLabelValues("data", "mailbox", "OK")) }
	k, v := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("k")}, value(1, 4096)
	start := time.Now()
	puts := 0
	for ; time.Since(start) < 5*idle || puts < 100; puts++ {
		if err := c.Put(ctx, k, v); err != nil {
			t.Fatalf("put %d, %v after the start: %v", puts, time.Since(start), err)
		}
	}
	if got := handOvers(); got != 1 {
		t.Fatalf("%v mailbox hand-overs, want 1: the session was replaced", got)
	}
	if got := testutil.ToFloat64(n.metrics.mailboxPosts.WithLabelValues("client")); got < float64(puts) {
		t.Fatalf("%v posts served by the client, want at least %d", got, puts)
	}
}

// Only a client in the node's own process may serve its posts: a client
// in another process (this test's binary, run again) that asks is
// refused, and its session goes on with the node serving.
func TestOtherProcessMayNotServeLocally(t *testing.T) {
	if sock := os.Getenv("KVPOOL_TEST_FOREIGN_SHM"); sock != "" {
		foreignHandOver(t, sock)
		return
	}
	n := startNode(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestOtherProcessMayNotServeLocally$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "KVPOOL_TEST_FOREIGN_SHM="+n.ShmSocket())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the other process: %v\n%s", err, out)
	}
	want := fmt.Sprintf("hand-over: status %d, token 0", codes.InvalidArgument)
	if !strings.Contains(string(out), want) {
		t.Fatalf("the other process said:\n%s\nwant %q", out, want)
	}
}

// foreignHandOver is the other process's side: it hands its mailbox over
// asking to serve it, reports the answer, and checks that the session
// still works.
func foreignHandOver(t *testing.T, sock string) {
	uc, c := rawShmSessionAt(t, sock)
	resp, err := handOverMailboxFlags(t, uc, c, wire.FlagServeLocally, mailboxFile(t, wire.MailboxBytes, true))
	if resp == nil {
		t.Fatalf("hand-over: %v", err)
	}
	fmt.Printf("hand-over: status %d, token %d\n", resp.Status, resp.Handle)
	if _, err := c.RoundTrip(context.Background(), &wire.Request{Op: wire.OpReserve, ValueLen: 4096, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte("k")}); err != nil {
		t.Fatalf("the session after the refusal: %v", err)
	}
}
