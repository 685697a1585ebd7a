package pool

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/eventually"
)

// The pace: how long the sweeper sweeps on, from the posts of the last
// two windows, the clients at work and the cores.
func TestSweepPace(t *testing.T) {
	const spin = time.Millisecond
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	posts := func(at ...time.Duration) sweepPace {
		var p sweepPace
		for _, t := range at {
			p.post(t)
		}
		return p
	}
	every := func(from, gap time.Duration, n int) []time.Duration {
		var at []time.Duration
		for i := range n {
			at = append(at, from+time.Duration(i)*gap)
		}
		return at
	}
	for _, tc := range []struct {
		name          string
		pace          sweepPace
		now           time.Duration
		active, cores int
		want          time.Duration
	}{
		{"no posts", posts(), us(10), 1, 2, 0},
		{"one client, one post", posts(us(5)), us(10), 1, 2, 0},
		{"one client, two posts", posts(us(5), us(700)), us(800), 1, 2, spin},
		{"one client, posts a window ago", posts(us(5), us(700)), us(1900), 1, 2, spin},
		{"one client, posts two windows ago", posts(us(5), us(700)), us(2100), 1, 2, 0},
		{"four clients, a post every 100 µs", posts(every(0, us(100), 10)...), us(950), 4, 2, spin},
		{"four clients, a post every 100 µs, a window on", posts(every(0, us(100), 10)...), us(1950), 4, 2, spin},
		{"four clients, a post every 100 µs, two windows on", posts(every(0, us(100), 10)...), us(2950), 4, 2, 0},
		{"four clients, a post every 250 µs", posts(every(0, us(250), 12)...), us(2900), 4, 2, 0},
		{"four clients on eight cores, a post every 250 µs", posts(every(0, us(250), 12)...), us(2900), 4, 8, spin},
		{"four clients, 30 posts in a burst", posts(every(us(3000), 0, 30)...), us(3001), 4, 2, spin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.pace.spinFor(tc.now, tc.active, tc.cores, spin); got != tc.want {
				t.Fatalf("spinFor = %v, want %v (pace %+v)", got, tc.want, tc.pace)
			}
		})
	}
}

// The windows roll: posts move to the window before, then out.
func TestSweepPaceRoll(t *testing.T) {
	var p sweepPace
	ms := time.Millisecond
	for _, step := range []struct {
		post        time.Duration
		cur, before int
	}{
		{0, 1, 0},
		{ms / 2, 2, 0},
		{ms, 1, 2},        // the next window
		{ms + ms/2, 2, 2}, // still in it
		{3*ms + 1, 1, 0},  // two windows on: both start over
		{4*ms + 2, 1, 1},
	} {
		p.post(step.post)
		if p.cur != step.cur || p.before != step.before {
			t.Fatalf("after a post at %v: cur %d before %d, want %d %d", step.post, p.cur, p.before, step.cur, step.before)
		}
	}
}

// Same-host clients in another process (here: clients that do not serve
// their own posts) put, get and remove side by side while the node's
// sweeper watches their mailboxes; it serves posts while they come close
// together and sleeps once they stop, after which the sessions' own
// goroutines serve them; every byte comes back, and a client that closes
// while its puts are in flight leaves the node consistent (the node's
// cleanup checks the store).
func TestShmMailboxSweeper(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	posts := func(by string) float64 { return testutil.ToFloat64(n.metrics.mailboxPosts.WithLabelValues(by)) }
	dial := func() *api.Client {
		c, err := api.Dial(ctx, api.ClientConfig{Server: n.Addr().String(), Path: api.PathShm, NoLocationCache: true, NoLocalServe: true})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		c := dial()
		defer c.Close()
		wg.Go(func() {
			for i := range 300 {
				k := api.BlockKey{Tenant: "t", Namespace: "n", Key: fmt.Appendf(nil, "w%d-%d", w, i)}
				v := value(uint64(w<<16|i), 4096+i)
				if err := c.Put(ctx, k, v); err != nil {
					errs <- err
					return
				}
				if got, err := c.GetValue(ctx, k); err != nil || !bytes.Equal(got, v) {
					errs <- fmt.Errorf("get %s: %v", k.Key, err)
					return
				}
				if err := c.Remove(ctx, k); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if posts("sweeper") == 0 {
		t.Fatalf("the sweeper served no post of four busy clients (the sessions served %v)", posts("node"))
	}
	// Idle, the sweeper sleeps; a client's posts then go to its session.
	eventually.True(t, "the sweeper asleep with every client idle", 10*time.Second, func() bool { return !n.data.sweeper.sweeping() })
	c := dial()
	defer c.Close()
	before := posts("node")
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("after")}
	if err := c.Put(ctx, k, value(7, 5000)); err != nil {
		t.Fatal(err)
	}
	if posts("node") == before {
		t.Fatal("a post while the sweeper slept was not served by its session")
	}

	// Clients closing with puts in flight: their sessions leave the
	// sweeper while it may be serving them.
	for w := range 4 {
		c := dial()
		wg.Go(func() {
			for i := 0; ; i++ {
				k := api.BlockKey{Tenant: "t", Namespace: "n", Key: fmt.Appendf(nil, "c%d-%d", w, i)}
				if err := c.Put(ctx, k, value(uint64(i), 100_000)); err != nil {
					return // closed under it
				}
			}
		})
		eventually.True(t, "puts served", 10*time.Second, func() bool { return posts("sweeper")+posts("node") > before+float64(20*(w+1)) })
		c.Close()
	}
	wg.Wait()
}
