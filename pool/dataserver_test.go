package pool

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
)

// writeCounter counts the writes a data connection makes.
type writeCounter struct {
	net.Conn
	writes atomic.Int32
}

func (w *writeCounter) Write(b []byte) (int, error) {
	w.writes.Add(1)
	return w.Conn.Write(b)
}

// A pipelined batch is answered in one write: the answers to requests
// already here wait for the last one's (a peer's pins for a 64-block chain
// cost one send, not 64). A request that reads a value gets the answers
// before it written first, so neither side waits on the other.
func TestPipelinedRequestsShareOneWrite(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	c := dial(t, n, api.PathData)
	const blocks = 8
	keys := make([]api.BlockKey, blocks)
	for i := range keys {
		keys[i] = api.BlockKey{Tenant: "acme", Namespace: "m", Key: []byte{'k', byte(i)}}
		if err := c.Put(ctx, keys[i], value(uint64(i), 5000+i)); err != nil {
			t.Fatal(err)
		}
	}
	client, server := net.Pipe()
	counted := &writeCounter{Conn: server}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.data.serve(ctx, counted, newSession())
		server.Close()
	}()
	defer func() { client.Close(); <-done }()
	client.SetDeadline(time.Now().Add(10 * time.Second))
	send := func(b []byte) {
		t.Helper()
		if _, err := client.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	recv := func() wire.Response {
		t.Helper()
		var r wire.Response
		if err := wire.ReadResponse(client, &r); err != nil {
			t.Fatal(err)
		}
		if r.Status != uint8(codes.OK) {
			t.Fatalf("status %d: %s", r.Status, r.Message)
		}
		return r
	}

	var batch []byte
	for _, k := range keys {
		batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpView, Tenant: []byte(k.Tenant), Namespace: []byte(k.Namespace), Key: k.Key})
	}
	send(batch)
	handles := make([]uint64, blocks)
	for i := range keys {
		r := recv()
		v := value(uint64(i), 5000+i)
		if r.ValueLen != uint64(len(v)) || r.CRC != api.Checksum(v) {
			t.Fatalf("view %d: %d bytes, CRC %#x; want %d, %#x", i, r.ValueLen, r.CRC, len(v), api.Checksum(v))
		}
		handles[i] = r.Handle
	}
	if w := counted.writes.Load(); w != 1 {
		t.Errorf("%d pipelined views answered in %d writes, want 1", blocks, w)
	}

	// A view, then a put whose value has not been sent: the view's answer
	// must come first, or client and node would wait on each other.
	k := api.BlockKey{Tenant: "acme", Namespace: "m", Key: []byte("later")}
	v := value(99, 3000)
	put := putFrame(k, uint64(len(v)), v, api.Checksum(v), wire.FlagChecksum)
	head := len(put) - len(v) - wire.TrailerBytes
	send(append(wire.AppendRequest(nil, &wire.Request{Op: wire.OpView, Tenant: []byte(keys[0].Tenant), Namespace: []byte(keys[0].Namespace), Key: keys[0].Key}), put[:head]...))
	handles = append(handles, recv().Handle)
	send(put[head:])
	recv()

	// Releases have no answers; after them the session holds nothing.
	var rel []byte
	for _, h := range handles {
		rel = wire.AppendRequest(rel, &wire.Request{Op: wire.OpRelease, Handle: h})
	}
	send(rel)
	// A last request's answer shows every release before it was served.
	send(wire.AppendRequest(nil, &wire.Request{Op: wire.OpRemove, Tenant: []byte(k.Tenant), Namespace: []byte(k.Namespace), Key: k.Key}))
	recv()
	if pins := n.Store().Stats().Pins; pins != 0 {
		t.Fatalf("%d pins held after every release", pins)
	}
}

// Exists frames answer which blocks the node holds, pipelined on a
// session (one write for a request's keys): FlagExisted for a held block,
// none for a missing one, and a bad key refused alone.
func TestExistsFrames(t *testing.T) {
	n := startNode(t)
	c := dial(t, n, api.PathData)
	held := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("held")}
	if err := c.Put(context.Background(), held, value(7, 5000)); err != nil {
		t.Fatal(err)
	}
	if !c.Info().GetExistsFrames() {
		t.Fatal("the node's Info does not offer Exists frames")
	}
	raw := shmRaw(t, n)
	var frames []byte
	for _, key := range []string{"held", "missing", "", "held"} {
		frames = wire.AppendRequest(frames, &wire.Request{Op: wire.OpExists, Tenant: []byte("t"), Namespace: []byte("n"), Key: []byte(key)})
	}
	if _, err := raw.Write(frames); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		status  codes.Code
		existed bool
	}{{codes.OK, true}, {codes.OK, false}, {codes.InvalidArgument, false}, {codes.OK, true}} {
		var resp wire.Response
		if err := wire.ReadResponse(raw, &resp); err != nil {
			t.Fatal(err)
		}
		if codes.Code(resp.Status) != want.status || resp.Flags&wire.FlagExisted != 0 != want.existed {
			t.Errorf("answer %d: status %v, flags %#x; want %v, existed %v", i, codes.Code(resp.Status), resp.Flags, want.status, want.existed)
		}
	}
}

// A session's reader stays awake for a writer's commit while every
// reservation it holds is at most quickFillBytes (see quickFillBytes).
func TestSessionFilling(t *testing.T) {
	n := startNode(t, func(c *Config) { c.ReservationTimeout = time.Hour })
	st := n.Store()
	for _, tc := range []struct {
		name  string
		sizes []int64
		want  bool
	}{
		{"none", nil, true},
		{"one 2 MiB", []int64{2 << 20}, true},
		{"at the bound", []int64{quickFillBytes}, true},
		{"one over", []int64{quickFillBytes + 1}, false},
		{"small and large", []int64{64 << 10, 16 << 20}, false},
		{"several small", []int64{2 << 20, 2 << 20, 4096}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sess := newSession()
			for i, size := range tc.sizes {
				r, err := st.Reserve([]byte("t"), []byte("n"), []byte(tc.name+string(rune('a'+i))), size, false)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Abort(r) })
				sess.addRes(r)
			}
			if open, quick := sess.filling(); open != (len(tc.sizes) > 0) || quick != tc.want {
				t.Errorf("filling with reservations of %v bytes = %v, %v, want %v, %v", tc.sizes, open, quick, len(tc.sizes) > 0, tc.want)
			}
			if len(tc.sizes) > 0 {
				for _, r := range sess.res {
					sess.dropRes(r)
				}
				if open, quick := sess.filling(); open || !quick {
					t.Errorf("filling with every reservation dropped = %v, %v", open, quick)
				}
			}
		})
	}
}
