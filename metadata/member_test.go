package metadata

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/metadata/embedded"
)

// patience bounds every wait in these tests. It is generous: a wait ends
// as soon as its condition holds, and a loaded machine under -race is slow.
const patience = 20 * time.Second

func startEtcd(t testing.TB) *embedded.Etcd {
	t.Helper()
	e, err := embedded.Start(embedded.Config{Dir: t.TempDir(), ClientURL: "http://127.0.0.1:0", Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func newClient(t testing.TB, url string) *clientv3.Client {
	t.Helper()
	cli, err := NewClient([]string{url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// fakeStore is the set of blocks a test node holds.
type fakeStore struct {
	mu     sync.Mutex
	blocks map[[3]string]bool
}

func (f *fakeStore) add(m *Member, t, ns, k string) {
	f.mu.Lock()
	f.blocks[[3]string{t, ns, k}] = true
	f.mu.Unlock()
	m.Added([]byte(t), []byte(ns), []byte(k))
}

func (f *fakeStore) remove(m *Member, t, ns, k string) {
	f.mu.Lock()
	delete(f.blocks, [3]string{t, ns, k})
	f.mu.Unlock()
	m.Removed([]byte(t), []byte(ns), []byte(k))
}

func (f *fakeStore) snapshot(yield func(tenant, namespace string, key []byte) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for b := range f.blocks {
		if !yield(b[0], b[1], []byte(b[2])) {
			return
		}
	}
}

type testMember struct {
	*Member
	store  *fakeStore
	cancel context.CancelFunc
	done   chan struct{}
}

func startMember(t testing.TB, cli *clientv3.Client, id string, mutate ...func(*MemberConfig)) *testMember {
	t.Helper()
	fs := &fakeStore{blocks: map[[3]string]bool{}}
	cfg := MemberConfig{Client: cli, Record: NodeRecord{ID: id, Addrs: map[string]string{"grpc": "127.0.0.1:1"}}, LeaseTTL: 2 * time.Second, Snapshot: fs.snapshot}
	for _, f := range mutate {
		f(&cfg)
	}
	m, err := NewMember(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tm := &testMember{Member: m, store: fs, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(tm.done); m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-tm.done })
	eventually.True(t, "registration", patience, func() bool { return m.Epoch() != 0 })
	return tm
}

func startMirror(t testing.TB, cli *clientv3.Client, mutate ...func(*MirrorConfig)) *Mirror {
	t.Helper()
	cfg := MirrorConfig{Client: cli}
	for _, f := range mutate {
		f(&cfg)
	}
	mm, err := NewMirror(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); mm.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-mm.Ready()
	return mm
}

// converged waits until the mirror holds exactly what etcd holds and what
// the members' stores hold.
func converged(t testing.TB, cli *clientv3.Client, mm *Mirror, members ...*testMember) {
	t.Helper()
	var want []string
	for _, m := range members {
		m.store.mu.Lock()
		for b := range m.store.blocks {
			want = append(want, fmt.Sprintf("%s %s/%s/%x", m.cfg.Record.ID, b[0], b[1], b[2]))
		}
		m.store.mu.Unlock()
	}
	slices.Sort(want)
	var got, inEtcd []string
	ok := func() bool {
		var err error
		inEtcd, _, err = ReadContent(context.Background(), cli, "/kvpool/")
		if err != nil {
			return false
		}
		got = mm.Content()
		return slices.Equal(got, want) && slices.Equal(inEtcd, want)
	}
	if !eventually.Within(patience, ok) {
		t.Fatalf("mirror did not converge:\nmirror %d records, etcd %d, stores %d\nmirror: %.10v\netcd:   %.10v\nwant:   %.10v", len(got), len(inEtcd), len(want), got, inEtcd, want)
	}
}

func TestMemberPublishesAndMirrorFollows(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	a := startMember(t, cli, "node-a")
	b := startMember(t, cli, "node-b")
	mm := startMirror(t, newClient(t, e.ClientURL()))
	for i := range 1000 {
		a.store.add(a.Member, "acme", "llama", fmt.Sprintf("k%04d", i))
		if i < 500 {
			b.store.add(b.Member, "acme", "llama", fmt.Sprintf("k%04d", i))
		}
	}
	for i := 900; i < 1000; i++ {
		a.store.remove(a.Member, "acme", "llama", fmt.Sprintf("k%04d", i))
	}
	converged(t, cli, mm, a, b)
	chain := [][]byte{}
	for i := range 950 {
		chain = append(chain, []byte(fmt.Sprintf("k%04d", i)))
	}
	res := mm.Locate("acme", "llama", chain)
	if res.Deepest != 900 || !slices.Equal(res.DeepestNodes, []string{"node-a"}) || res.PoolPrefix != 900 {
		t.Fatalf("locate: %+v", res)
	}
	if len(res.Nodes) != 2 || res.Nodes[1] != (NodePrefix{Node: "node-b", Blocks: 500}) {
		t.Fatalf("per node: %+v", res.Nodes)
	}
	// A mirror started now loads the same state from etcd.
	late := startMirror(t, newClient(t, e.ClientURL()))
	converged(t, cli, late, a, b)
}

func TestSnapshotCompactsTheLog(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	mm := startMirror(t, cli)
	a := startMember(t, cli, "node-a", func(c *MemberConfig) { c.MaxBatch = 10; c.CompactAfter = 5; c.FlushInterval = 0 })
	// Registered first: on a slow machine the registration could come
	// after every change, and its snapshot alone would carry them, with
	// no log to compact.
	eventually.True(t, "the member to register", patience, func() bool { return a.Stats().Snapshots >= 1 })
	for i := range 300 {
		a.store.add(a.Member, "t", "n", fmt.Sprintf("k%d", i))
		if i%3 == 0 {
			a.store.remove(a.Member, "t", "n", fmt.Sprintf("k%d", i/2))
		}
	}
	converged(t, cli, mm, a)
	eventually.True(t, "a snapshot", patience, func() bool { return a.Stats().Snapshots >= 2 })
	resp, err := cli.Get(context.Background(), "/kvpool/loc/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count > 5+30 {
		t.Fatalf("%d location keys after compaction; the log was not compacted", resp.Count)
	}
	late := startMirror(t, newClient(t, e.ClientURL()))
	converged(t, cli, late, a)
}

// TestFlushGapSpacesTheBatches: changes that each wait for the last to
// be written go out one batch each, never two within FlushGap of each
// other; without a gap they go out a FlushInterval apart.
func TestFlushGapSpacesTheBatches(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	const rounds = 8
	for _, tc := range []struct {
		name string
		gap  time.Duration
	}{
		{"gap 40ms", 40 * time.Millisecond},
		{"no gap", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startMember(t, cli, "node-"+strings.ReplaceAll(tc.name, " ", "-"), func(c *MemberConfig) {
				c.FlushInterval = time.Millisecond
				c.FlushGap = tc.gap
			})
			eventually.True(t, "the registration's snapshot", patience, func() bool { return a.Pending() == 0 })
			before := a.Stats().Batches
			start := time.Now()
			for i := range rounds {
				a.store.add(a.Member, "t", "n", fmt.Sprintf("k%d", i))
				eventually.True(t, "the change written", patience, func() bool { return a.Pending() == 0 })
			}
			elapsed := time.Since(start)
			batches := a.Stats().Batches - before
			if batches != rounds {
				t.Fatalf("%d batches for %d changes written one at a time", batches, rounds)
			}
			// Each batch after the first waited for the gap after the
			// one before.
			if tc.gap > 0 && elapsed < (rounds-1)*tc.gap {
				t.Fatalf("%d batches in %v: closer than the %v gap", batches, elapsed, tc.gap)
			}
			mm := startMirror(t, cli)
			converged(t, cli, mm, a)
		})
	}
}

func TestGossipDetectsDeathAndCarriesLoad(t *testing.T) {
	var gs []*Gossip
	for i := range 3 {
		id := fmt.Sprintf("g%d", i)
		load := Load{CapacityBytes: 1000, UsedBytes: int64(100 * i), QueueSeconds: float64(i) / 10}
		var seeds func() []string
		if i > 0 {
			first := gs[0].Addr()
			seeds = func() []string { return []string{first} }
		}
		g, err := NewGossip(GossipConfig{NodeID: id, Seeds: seeds, Load: func() Load { return load }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); g.Run(ctx) }()
		// Registered at once, so a failure to start the next node still
		// stops this one.
		t.Cleanup(func() { cancel(); <-done })
		gs = append(gs, g)
	}
	eventually.True(t, "three alive members with their load", patience, func() bool {
		n := 0
		for _, p := range gs[0].Peers() {
			if p.State == "alive" && p.Load.CapacityBytes == 1000 {
				n++
			}
		}
		return n == 3
	})
	// Kill g2 without leaving: shut its memberlist down hard.
	start := time.Now()
	gs[2].Crash()
	eventually.True(t, "g0 to declare g2 dead", patience, func() bool { return gs[0].Dead("g2") })
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("failure detection took %v, want under 2 s", el)
	} else {
		t.Logf("g2 declared dead after %v", el)
	}
	if gs[0].Dead("g1") || gs[0].Dead("never-seen") {
		t.Fatal("live or unknown nodes reported dead")
	}
}

func TestMirrorLoadSkipsMalformedRecords(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	a := startMember(t, cli, "node-a")
	a.store.add(a.Member, "t", "n", "k")
	mm := startMirror(t, cli)
	converged(t, cli, mm, a)
	for k, v := range map[string]string{
		"/kvpool/nodes/x":                                  "{",
		"/kvpool/loc/node-a/zz/0000000000000000":           "x",
		"/kvpool/loc/node-a/1/000000000000000g":            "x",
		keys{"/kvpool/"}.loc("node-a", a.Epoch(), 1<<40):   "garbage",
		keys{"/kvpool/"}.loc("node-a", a.Epoch(), 1<<40+1): string(AppendBatch(nil, &Batch{Records: []Record{{Op: OpAdd, Tenant: "bad tenant", Namespace: "n", Key: "k"}}})),
	} {
		if _, err := cli.Put(context.Background(), k, v); err != nil {
			t.Fatal(err)
		}
	}
	eventually.True(t, "the watching mirror to skip 5 records", patience, func() bool { return mm.Stats().Malformed == 5 })
	fresh := startMirror(t, cli)
	if got := fresh.Stats().Malformed; got != 5 {
		t.Fatalf("a loading mirror skipped %d records, want 5", got)
	}
	converged(t, cli, fresh, a)
}

func TestPolicies(t *testing.T) {
	e := startEtcd(t)
	p := NewPolicies(newClient(t, e.ClientURL()), "")
	ctx := context.Background()
	if err := p.Put(ctx, "acme", []byte(`{"policy":"lru","quota_bytes":1073741824}`)); err != nil {
		t.Fatal(err)
	}
	if err := p.Put(ctx, "beta", []byte(`{"policy":"fifo"}`)); err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx, "acme")
	if err != nil || string(got) != `{"policy":"lru","quota_bytes":1073741824}` {
		t.Fatalf("get: %s %v", got, err)
	}
	all, err := p.List(ctx)
	if err != nil || len(all) != 2 || string(all["beta"]) != `{"policy":"fifo"}` {
		t.Fatalf("list: %v %v", all, err)
	}
	if err := p.Delete(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, "beta"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	for _, bad := range []struct{ tenant, policy string }{{"a/b", `{}`}, {"ok", `{not json`}, {"", `{}`}} {
		if err := p.Put(ctx, bad.tenant, []byte(bad.policy)); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("put %q %q: %v, want InvalidArgument", bad.tenant, bad.policy, err)
		}
	}
}
