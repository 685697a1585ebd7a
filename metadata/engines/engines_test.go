package engines

import (
	"context"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/metadata/kvevents"
)

func freeEndpoint(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "tcp://" + l.Addr().String()
}

// stored is one message of a BlockStored of n 16-token blocks with
// hashes from first on, as vLLM publishes it.
func stored(seq uint64, first int64, n int) [][]byte {
	ev := kvevents.Event{Kind: kvevents.Stored, BlockSize: 16, Medium: kvevents.MediumGPU, TokenIDs: make([]uint32, 16*n)}
	for i := range n {
		ev.Hashes = append(ev.Hashes, kvevents.IntHash(first+int64(i)))
	}
	for i := range ev.TokenIDs {
		ev.TokenIDs[i] = uint32(i % 100)
	}
	return kvevents.Encode(kvevents.Message{Topic: "kv", Seq: seq, Batch: kvevents.Batch{TS: 1.7e9, DPRank: -1, Events: []kvevents.Event{ev}}})
}

func TestStoredHelperDecodes(t *testing.T) {
	m, err := kvevents.DecodeMessage(stored(3, 10, 4))
	if err != nil || m.Seq != 3 || len(m.Batch.Events) != 1 || len(m.Batch.Events[0].Hashes) != 4 {
		t.Fatalf("%+v %v", m, err)
	}
}

// How many block events a second one tracker applies from one engine:
// batches of 64 BlockStored blocks (a prefill's worth at vLLM's 16-token
// blocks), published as fast as the socket takes them.
func BenchmarkTrackerIngest(b *testing.B) {
	ep := freeEndpoint(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen(ep); err != nil {
		b.Fatal(err)
	}
	tr, err := New(Config{Engines: []EngineConfig{{Name: "e", Endpoint: ep}}})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	seq := uint64(0)
	for tr.Stats()[0].Messages == 0 { // until the subscription has joined
		pub.Send(zmq4.NewMsgFrom(stored(seq, 1<<40, 1)...))
		seq++
		time.Sleep(time.Millisecond)
	}
	const perBatch = 64
	msgs := make([][][]byte, b.N)
	for i := range msgs {
		msgs[i] = stored(seq+uint64(i), int64(i*perBatch), perBatch)
	}
	want := tr.Stats()[0].Messages + int64(b.N)
	b.ResetTimer()
	start := time.Now()
	for _, m := range msgs {
		if err := pub.Send(zmq4.NewMsgFrom(m...)); err != nil {
			b.Fatal(err)
		}
	}
	for tr.Stats()[0].Messages < want {
		if time.Since(start) > time.Minute {
			b.Fatalf("applied %d of %d messages in a minute (%+v)", tr.Stats()[0].Messages, want, tr.Stats()[0])
		}
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	s := tr.Stats()[0]
	b.ReportMetric(float64(b.N*perBatch)/time.Since(start).Seconds(), "blocks/s")
	if s.Gaps > 0 {
		b.Logf("%d gaps (the socket dropped messages): %+v", s.Gaps, s)
	}
}

// What one GPU-resident block costs the index.
func TestMemoryPerBlock(t *testing.T) {
	const n = 200_000
	var before, after runtime.MemStats
	e := kvevents.NewEngine(kvevents.Keying{})
	msgs := make([]kvevents.Message, 0, n/64)
	for i := range n / 64 {
		m, err := kvevents.DecodeMessage(stored(uint64(i), int64(i*64), 64))
		if err != nil {
			t.Fatal(err)
		}
		m.Batch.Events[0].TokenIDs = nil // what the index keeps does not include them
		msgs = append(msgs, m)
	}
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, m := range msgs {
		e.Apply(m)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / float64(e.Len())
	t.Logf("%d blocks held: %.0f bytes each (hash-keyed)", e.Len(), per)
	if e.Len() != n/64*64 || per > 400 {
		t.Errorf("%d blocks at %.0f bytes each; want %d under 400", e.Len(), per, n/64*64)
	}
	runtime.KeepAlive(msgs)
}

// removed is one message of a BlockRemoved of n hashes from first on.
func removed(seq uint64, first int64, n int) [][]byte {
	ev := kvevents.Event{Kind: kvevents.Removed, Medium: kvevents.MediumGPU}
	for i := range n {
		ev.Hashes = append(ev.Hashes, kvevents.IntHash(first+int64(i)))
	}
	return kvevents.Encode(kvevents.Message{Topic: "kv", Seq: seq, Batch: kvevents.Batch{TS: 1.7e9, DPRank: -1, Events: []kvevents.Event{ev}}})
}

func hashKeys(first int64, n int) [][]byte {
	var out [][]byte
	for i := range n {
		out = append(out, []byte(kvevents.IntHash(first+int64(i))))
	}
	return out
}

// A watcher's copy, kept from the snapshot and the changes Watch
// delivers, equals the tracker's index through stores, removals, a gap
// the engine cannot replay (the index forgets) and a restart; a watcher
// that falls behind is told so.
func TestWatchKeepsACopy(t *testing.T) {
	ep := freeEndpoint(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen(ep); err != nil {
		t.Fatal(err)
	}
	tr, err := New(Config{Engines: []EngineConfig{{Name: "e", Endpoint: ep, Tenant: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	seq := uint64(0)
	send := func(frames [][]byte) {
		t.Helper()
		if err := pub.Send(zmq4.NewMsgFrom(frames...)); err != nil {
			t.Fatal(err)
		}
	}
	// Until the subscription has joined: block 1000 stored, seq 0 on.
	eventually.True(t, "the subscription joins", 10*time.Second, func() bool {
		send(stored(seq, 1000, 1))
		seq++
		return tr.Prefix("acme", "", hashKeys(1000, 1)) == 1
	})

	wctx, wcancel := context.WithCancel(ctx)
	var mu sync.Mutex
	copyOf := map[string]bool{}
	var scopes []string
	watched := make(chan error, 1)
	go func() {
		watched <- tr.Watch(wctx, func(u Update) error {
			mu.Lock()
			defer mu.Unlock()
			scopes = append(scopes, u.Engine+"/"+u.Tenant)
			if u.Reset {
				clear(copyOf)
			}
			for _, k := range u.Keys {
				if k.Held {
					copyOf[k.Key] = true
				} else {
					delete(copyOf, k.Key)
				}
			}
			return nil
		})
	}()
	held := func(first int64, n int) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, k := range hashKeys(first, n) {
			if !copyOf[string(k)] {
				return false
			}
		}
		return true
	}
	eventually.True(t, "the snapshot arrives", 10*time.Second, func() bool { return held(1000, 1) })

	send(stored(seq, 0, 8))
	seq++
	eventually.True(t, "the copy holds 8 new blocks", 10*time.Second, func() bool { return held(0, 8) })
	send(removed(seq, 4, 4))
	seq++
	eventually.True(t, "the copy drops 4", 10*time.Second, func() bool { return !held(4, 1) && held(0, 4) })
	// A gap (no replay socket): the index forgets all but what follows.
	seq += 5
	send(stored(seq, 100, 2))
	seq++
	eventually.True(t, "the copy forgets after a gap", 10*time.Second, func() bool {
		return held(100, 2) && !held(0, 1) && !held(1000, 1)
	})
	// A restart: the sequence begins again at 0.
	send(stored(0, 200, 3))
	eventually.True(t, "the copy forgets after a restart", 10*time.Second, func() bool { return held(200, 3) && !held(100, 1) })
	mu.Lock()
	if len(copyOf) != 3 || scopes[0] != "e/acme" {
		t.Errorf("the copy holds %d keys (want 3); first update's scope %q", len(copyOf), scopes[0])
	}
	mu.Unlock()
	wcancel()
	if err := <-watched; err != context.Canceled {
		t.Errorf("Watch ended with %v; want context.Canceled", err)
	}

	// A watcher that does not keep up is told so, and may watch again.
	slow, err := New(Config{Engines: []EngineConfig{{Name: "e", Endpoint: ep}}, WatchBuffer: 1})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithCancel(ctx)
	sdone := make(chan struct{})
	go func() { slow.Run(sctx); close(sdone) }()
	defer func() { scancel(); <-sdone }()
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	behind := make(chan error, 1)
	go func() {
		behind <- slow.Watch(sctx, func(u Update) error {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-release // stuck on the snapshot while the changes pile up
			return nil
		})
	}()
	<-entered
	next := uint64(1)
	eventually.True(t, "three changes reach the stuck watcher's tracker", 10*time.Second, func() bool {
		send(stored(next, int64(next)*10, 1))
		next++
		return slow.Stats()[0].Messages >= 3
	})
	close(release)
	if err := <-behind; err != ErrWatcherBehind {
		t.Errorf("a stuck watcher's Watch ended with %v; want ErrWatcherBehind", err)
	}
}
