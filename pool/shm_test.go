package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/eventually"
)

func TestShmViewOutlivesRemove(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	c := dial(t, n, api.PathShm)
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("viewed")}
	v := value(1, 1<<20)
	if err := c.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
	view, err := c.View(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, k); err != nil {
		t.Fatal(err)
	}
	// Another writer reuses space; the pinned bytes must not be touched.
	for i := range 8 {
		if err := c.Put(ctx, api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte{byte(i)}}, value(uint64(10+i), 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(view.Bytes(), v) || view.Verify() != nil {
		t.Fatal("a removed but viewed block changed under its reader")
	}
	used := n.Store().Stats().UsedBytes
	view.Close()
	view.Close() // idempotent
	eventually.True(t, "the removed block's pages to be freed", 10*time.Second, func() bool { return n.Store().Stats().UsedBytes == used-1<<20 })
}

func TestShmSessionEndReleasesEverything(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathShm})
	if err != nil {
		t.Fatal(err)
	}
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("held")}
	if err := c.Put(ctx, k, value(2, 100_000)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.View(ctx, k); err != nil { // never closed
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("never")}, 50_000); err != nil { // never committed
		t.Fatal(err)
	}
	if st := n.Store().Stats(); st.Reservations != 2 {
		t.Fatalf("%d reservations, want 2 (the put's spare and the open one)", st.Reservations)
	}
	c2 := dial(t, n, api.PathData)
	if err := c2.Remove(ctx, k); err != nil {
		t.Fatal(err)
	}
	// The client dies: closing its socket must release its pin and abort
	// its reservation.
	c.Close()
	eventually.True(t, "the session's pin and reservation to be released", 10*time.Second, func() bool {
		st := n.Store().Stats()
		return st.Reservations == 0 && st.UsedBytes == 0
	})
}

func TestShmReserveCommitInPlace(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	for _, path := range []api.Path{api.PathShm, api.PathData, api.PathGRPC} {
		t.Run(path.String(), func(t *testing.T) {
			c := dial(t, n, path)
			k := api.BlockKey{Tenant: "t", Namespace: path.String(), Key: []byte("inplace")}
			v := value(3, 777_777)
			r, err := c.Reserve(ctx, k, len(v))
			if err != nil {
				t.Fatal(err)
			}
			copy(r.Bytes(), v)
			res, err := r.Commit(ctx)
			if err != nil || res.Existed || res.CRC != api.Checksum(v) {
				t.Fatalf("commit: %+v %v", res, err)
			}
			if _, err := r.Commit(ctx); !errors.Is(err, api.ErrFailedPrecondition) {
				t.Fatalf("second commit: %v, want FailedPrecondition", err)
			}
			got, err := c.GetValue(ctx, k)
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("get after in-place commit: %v", err)
			}
			r2, err := c.Reserve(ctx, api.BlockKey{Tenant: "t", Namespace: path.String(), Key: []byte("aborted")}, 1000)
			if err != nil {
				t.Fatal(err)
			}
			r2.Abort()
			r2.Abort()
			eventually.True(t, "the aborted reservation to end", 10*time.Second, func() bool { return n.Store().Stats().Reservations == 0 })
		})
	}
}

func TestShmVerifiedReads(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathShm, VerifySharedReads: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("scribbled")}
	v := value(4, 200_000)
	if err := c.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
	view, err := c.View(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	// A buggy same-host writer scribbles over a committed block.
	view.Bytes()[100] ^= 0xff
	buf := make([]byte, len(v))
	if _, err := c.Get(ctx, k, buf); !errors.Is(err, api.ErrDataLoss) {
		t.Fatalf("verified shared read of damaged bytes: %v, want DataLoss", err)
	}
	// Bytes that leave the host are always checked.
	d := dial(t, n, api.PathData)
	if _, err := d.Get(ctx, k, buf); !errors.Is(err, api.ErrDataLoss) {
		t.Fatalf("data-channel read of damaged bytes: %v, want DataLoss", err)
	}
	view.Bytes()[100] ^= 0xff
	view.Close()
	if _, err := c.Get(ctx, k, buf); err != nil {
		t.Fatal(err)
	}
}

func TestAutoPathPicksShmOnSameHostAndFallsBack(t *testing.T) {
	withShm := startNode(t)
	if c := dial(t, withShm, api.PathAuto); c.Path() != api.PathShm {
		t.Fatalf("same host: picked %v, want shm", c.Path())
	}
	noShm := startNode(t, func(c *Config) { c.DisableShm = true })
	if c := dial(t, noShm, api.PathAuto); c.Path() != api.PathData {
		t.Fatalf("node without shm: picked %v, want data", c.Path())
	}
	if _, err := api.Dial(context.Background(), api.ClientConfig{Server: noShm.Addr().String(), Path: api.PathShm}); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("requiring shm from a node without it: %v, want Unavailable", err)
	}
}

// TestShmLocationCacheNeverServesWrongBytes races cached same-host reads of
// one key against a writer that removes it, reuses its pages for other
// blocks and puts it again with new bytes. Every read must return one
// whole version of the block, or NotFound; never a mix.
func TestShmLocationCacheNeverServesWrongBytes(t *testing.T) {
	n := startNode(t, func(c *Config) { c.CapacityBytes = 8 << 20; c.MaxBlockBytes = 1 << 20 })
	ctx := context.Background()
	reader := dial(t, n, api.PathShm)
	writer := dial(t, n, api.PathShm)
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("hot")}
	const size = 256 << 10
	uniform := func(b byte) []byte { return bytes.Repeat([]byte{b}, size) }
	if err := writer.Put(ctx, k, uniform(1)); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	var hits, misses int
	go func() {
		defer close(done)
		buf := make([]byte, size)
		for {
			select {
			case <-stop:
				return
			default:
			}
			m, err := reader.Get(ctx, k, buf)
			switch {
			case errors.Is(err, api.ErrNotFound):
				misses++
			case err != nil:
				t.Errorf("get: %v", err)
				return
			default:
				hits++
				if m != size || !bytes.Equal(buf, uniform(buf[0])) {
					t.Errorf("read a torn block: first byte %d, length %d", buf[0], m)
					return
				}
			}
		}
	}()
	for i := range 300 {
		if err := writer.Remove(ctx, k); err != nil {
			t.Fatal(err)
		}
		// Reuse the freed pages with other bytes, then bring k back.
		filler := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("filler")}
		if err := writer.Put(ctx, filler, uniform(byte(200+i%50))); err != nil {
			t.Fatal(err)
		}
		if err := writer.Put(ctx, k, uniform(byte(2+i%100))); err != nil {
			t.Fatal(err)
		}
		if err := writer.Remove(ctx, filler); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	if hits == 0 {
		t.Fatal("the reader never read the block")
	}
	t.Logf("%d reads, %d found nothing", hits, misses)
}

func TestShmLocationCacheCanBeTurnedOff(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathShm, NoLocationCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("k")}
	if err := c.Put(ctx, k, value(1, 5000)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := c.GetValue(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCloseDuringShmGets closes a client while other goroutines copy
// blocks out of its mapping, cached and not: Close waits for the copies
// in flight and unmaps afterwards, so every Get either succeeds or fails
// with ErrUnavailable, and nothing faults. Close is idempotent.
func TestCloseDuringShmGets(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	writer := dial(t, n, api.PathData)
	keys := make([]api.BlockKey, 8)
	for i := range keys {
		keys[i] = api.BlockKey{Tenant: "t", Namespace: "close", Key: []byte{byte(i)}}
		if err := writer.Put(ctx, keys[i], value(uint64(i), 512<<10)); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 20 {
		c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathShm, NoLocationCache: round%2 == 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys { // fill the location cache
			if _, err := c.GetValue(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		var copied atomic.Int64
		for g := range 4 {
			wg.Go(func() {
				buf := make([]byte, 512<<10)
				for i := 0; ; i++ {
					_, err := c.Get(ctx, keys[(g+i)%len(keys)], buf)
					if err != nil {
						if !errors.Is(err, api.ErrUnavailable) {
							t.Errorf("get while closing: %v, want ErrUnavailable", err)
						}
						return
					}
					copied.Add(1)
				}
			})
		}
		eventually.True(t, "the readers to start", 10*time.Second, func() bool { return copied.Load() > 8 })
		if err := c.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second close: %v", err)
		}
		wg.Wait()
	}
}

// Bytes changed behind the node's back (a stray write into the arena, a
// bad DIMM) reach no same-host reader as good: with the default config a
// client checks the first read of every version of a block it has not
// read before, by Get and by View. They used to pass unchecked.
func TestShmReadsCheckWhatTheyHaveNotSeen(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	w := dial(t, n, api.PathShm)
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("rotted")}
	v := value(5, 300_000)
	if err := w.Put(ctx, k, v); err != nil {
		t.Fatal(err)
	}
	scribbler, err := w.View(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	defer scribbler.Close()
	scribbler.Bytes()[1000] ^= 0xff
	r := dial(t, n, api.PathShm)
	buf := make([]byte, len(v))
	if _, err := r.Get(ctx, k, buf); !errors.Is(err, api.ErrDataLoss) {
		t.Fatalf("a first shared read of damaged bytes: %v, want DataLoss", err)
	}
	if _, err := r.View(ctx, k); !errors.Is(err, api.ErrDataLoss) {
		t.Fatalf("a first view of damaged bytes: %v, want DataLoss", err)
	}
	scribbler.Bytes()[1000] ^= 0xff
	if _, err := r.Get(ctx, k, buf); err != nil || !bytes.Equal(buf, v) {
		t.Fatalf("after the repair: %v", err)
	}
	view, err := r.View(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	view.Close()
}

// A same-host put takes the spare its session's previous commit reserved
// (one round trip: the commit), and gets the next spare with its commit:
// of a run of puts of one size into one namespace, only the first asks
// for a reservation. The spare outlives the reservation timeout (the
// session owns it), a put of another size or namespace aborts it, and the
// session's end frees it.
func TestShmPutsReserveTheirSpareAhead(t *testing.T) {
	n := startNode(t, func(c *Config) { c.ReservationTimeout = 50 * time.Millisecond })
	ctx := context.Background()
	c := dial(t, n, api.PathShm)
	requests := func(op string) float64 {
		return testutil.ToFloat64(n.metrics.requests.WithLabelValues("data", op, "OK"))
	}
	const puts = 10
	values := make([][]byte, puts)
	for i := range puts {
		values[i] = value(uint64(i), 300_000)
		if err := c.Put(ctx, api.BlockKey{Tenant: "t", Namespace: "n", Key: fmt.Appendf(nil, "run-%d", i)}, values[i]); err != nil {
			t.Fatal(err)
		}
	}
	if r, cm := requests("reserve"), requests("commit"); r != 1 || cm != puts {
		t.Fatalf("%d puts asked for %v reservations and %v commits, want 1 and %d", puts, r, cm, puts)
	}
	if st := n.Store().Stats(); st.Reservations != 1 || st.Blocks != puts {
		t.Fatalf("after the run: %d reservations (the spare), %d blocks; want 1, %d", st.Reservations, st.Blocks, puts)
	}
	for i, v := range values {
		got, err := dial(t, n, api.PathData).GetValue(ctx, api.BlockKey{Tenant: "t", Namespace: "n", Key: fmt.Appendf(nil, "run-%d", i)})
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("block %d put into a spare: %v", i, err)
		}
	}

	// Well past the reservation timeout the spare is still there, and the
	// next put uses it.
	deadline := time.Now().Add(200 * time.Millisecond)
	eventually.True(t, "the sweeper to have run past the timeout", 10*time.Second, func() bool { return time.Now().After(deadline) })
	if st := n.Store().Stats(); st.Reservations != 1 {
		t.Fatalf("past the reservation timeout: %d reservations, want the spare", st.Reservations)
	}
	if err := c.Put(ctx, api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("late")}, value(50, 300_000)); err != nil {
		t.Fatal(err)
	}
	if r := requests("reserve"); r != 1 {
		t.Fatalf("a put after the timeout asked for a reservation (%v in all)", r)
	}

	// Another size, then another namespace: the spare does not fit, is
	// given back, and the put reserves its own.
	for i, k := range []api.BlockKey{{Tenant: "t", Namespace: "n", Key: []byte("bigger")}, {Tenant: "t", Namespace: "other", Key: []byte("elsewhere")}} {
		size := 400_000
		if err := c.Put(ctx, k, value(60, size)); err != nil {
			t.Fatal(err)
		}
		if r := requests("reserve"); r != float64(2+i) {
			t.Fatalf("put %s: %v reservations asked, want %d", k, r, 2+i)
		}
	}
	eventually.True(t, "the unfit spares to be aborted", 10*time.Second, func() bool { return n.Store().Stats().Reservations == 1 })

	// Equal bytes again: Existed, and a spare still comes back.
	if res, err := c.PutResult(ctx, api.BlockKey{Tenant: "t", Namespace: "other", Key: []byte("elsewhere")}, value(60, 400_000)); err != nil || !res.Existed {
		t.Fatalf("repeat put: %+v, %v", res, err)
	}
	used := n.Store().Stats().UsedBytes
	c.Close()
	eventually.True(t, "the session's end to free its spare", 10*time.Second, func() bool {
		st := n.Store().Stats()
		return st.Reservations == 0 && st.UsedBytes < used
	})
}

// PutMany stores a request's blocks as one batch on every path: across
// the shared-memory window (64 blocks), whether the node's process or the
// client serves the posts, with per-block errors for a block that clashes
// with a stored one, and nothing left reserved.
func TestPutManyStoresABatchOnEveryPath(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		cfg  api.ClientConfig
	}{
		{"shm", api.ClientConfig{Path: api.PathShm}},
		// A client in another process posts each commit as its copy is
		// done (copyAndCommitAhead).
		{"shm-other-process", api.ClientConfig{Path: api.PathShm, NoLocalServe: true}},
		{"data", api.ClientConfig{Path: api.PathData}},
		{"grpc", api.ClientConfig{Path: api.PathGRPC}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Server = n.Addr().String()
			c, err := api.Dial(ctx, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ns := "batch-" + tc.name
			clash := api.BlockKey{Tenant: "t", Namespace: ns, Key: []byte("block-70")}
			if err := c.Put(ctx, clash, []byte("other bytes")); err != nil {
				t.Fatal(err)
			}
			var keys, values [][]byte
			for i := range 100 {
				keys = append(keys, fmt.Appendf(nil, "block-%d", i))
				values = append(values, value(uint64(i), 10_000+i*100))
			}
			keys = append(keys, keys[3]) // the same block again: fine
			values = append(values, values[3])
			errs, err := c.PutMany(ctx, "t", ns, keys, values)
			if err != nil || len(errs) != len(keys) {
				t.Fatalf("PutMany: %d errors, %v", len(errs), err)
			}
			for i, e := range errs {
				if want := i == 70; (e != nil) != want || want && !errors.Is(e, api.ErrAlreadyExists) {
					t.Fatalf("block %d: %v", i, e)
				}
			}
			for i, k := range keys {
				got, err := c.GetValue(ctx, api.BlockKey{Tenant: "t", Namespace: ns, Key: k})
				if i == 70 {
					continue
				}
				if err != nil || !bytes.Equal(got, values[i]) {
					t.Fatalf("block %d after PutMany: %v", i, err)
				}
			}
			if _, err := c.PutMany(ctx, "t", ns, keys[:2], values[:1]); !errors.Is(err, api.ErrInvalidArgument) {
				t.Fatalf("keys without values: %v, want InvalidArgument", err)
			}
			if _, err := c.PutMany(ctx, "t", ns, [][]byte{[]byte("ok"), {}}, [][]byte{{1}, {2}}); !errors.Is(err, api.ErrInvalidArgument) {
				t.Fatalf("an empty key: %v, want InvalidArgument", err)
			}
			eventually.True(t, "no reservation but the sessions' spares", 10*time.Second, func() bool {
				return n.Store().Stats().Reservations == uint64(n.data.spares.Load())
			})
		})
	}
}

// Write-behind puts (PutAsync) from a client in another process (here: one
// that does not serve its own posts) return before their commits are
// answered: every block is stored once Flush returns nil, a commit the
// node refuses is reported once, by Flush naming its key (or by PutAsync
// when the answer came before it returned), a block put and not flushed
// becomes visible to others by itself, and the session holds no more
// than WriteBehindSpares reservations ahead; Close reports a refusal not
// yet flushed and frees them.
// A client in the node's process, which serves its own posts, waits for
// each commit, with the same reports.
func TestShmWriteBehindPuts(t *testing.T) {
	t.Run("other process", func(t *testing.T) { testWriteBehindPuts(t, true) })
	t.Run("same process", func(t *testing.T) { testWriteBehindPuts(t, false) })
}

func testWriteBehindPuts(t *testing.T, otherProcess bool) {
	n := startNode(t)
	ctx := context.Background()
	c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathShm, NoLocationCache: true, NoLocalServe: otherProcess})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	reader := dial(t, n, api.PathData)
	key := func(i int) api.BlockKey {
		return api.BlockKey{Tenant: "t", Namespace: "n", Key: fmt.Appendf(nil, "behind-%d", i)}
	}
	// Block 7 is there already, with other bytes; block 9 with the same.
	if err := reader.Put(ctx, key(7), value(1007, 300_000)); err != nil {
		t.Fatal(err)
	}
	if err := reader.Put(ctx, key(9), value(9, 300_000)); err != nil {
		t.Fatal(err)
	}
	const puts = 40
	refused := 0 // block 7's, reported once: by PutAsync or by Flush
	for i := range puts {
		v := value(uint64(i), 300_000)
		if err := c.PutAsync(ctx, key(i), v); err != nil {
			if i != 7 || !errors.Is(err, api.ErrAlreadyExists) {
				t.Fatalf("put %d: %v", i, err)
			}
			refused++
		}
		clear(v) // the value is the caller's again
		if r := n.Store().Stats().Reservations; r > uint64(api.WriteBehindSpares(300_000))+1 {
			t.Fatalf("after put %d: %d reservations open", i, r)
		}
	}
	if err := c.Flush(ctx); err != nil {
		if !errors.Is(err, api.ErrAlreadyExists) || !strings.Contains(err.Error(), key(7).String()) || strings.Count(err.Error(), "put ") != 1 {
			t.Fatalf("Flush: %v, want at most one ErrAlreadyExists, naming %s", err, key(7))
		}
		refused++
	}
	if refused != 1 {
		t.Fatalf("block 7's refusal reported %d times", refused)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("a second Flush: %v", err)
	}
	for i := range puts {
		want := value(uint64(i), 300_000)
		if i == 7 {
			want = value(1007, 300_000)
		}
		if got, err := reader.GetValue(ctx, key(i)); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("block %d: %v", i, err)
		}
	}

	// Put and left alone, a block becomes visible without a Flush.
	if err := c.PutAsync(ctx, key(100), value(100, 300_000)); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the last put to be visible", 10*time.Second, func() bool {
		got, err := reader.GetValue(ctx, key(100))
		return err == nil && bytes.Equal(got, value(100, 300_000))
	})

	// A refusal nobody flushed is Close's error; the spares go with the
	// session.
	err = c.PutAsync(ctx, key(7), value(2007, 300_000))
	closeErr := c.Close()
	switch {
	case err != nil && (!errors.Is(err, api.ErrAlreadyExists) || closeErr != nil):
		t.Fatalf("PutAsync: %v, then Close: %v; want the refusal once", err, closeErr)
	case err == nil && !errors.Is(closeErr, api.ErrAlreadyExists):
		t.Fatalf("Close: %v, want the unflushed ErrAlreadyExists", closeErr)
	}
	eventually.True(t, "the session's end to free its spares", 10*time.Second, func() bool { return n.Store().Stats().Reservations == 0 })
}
