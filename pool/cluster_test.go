package pool

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/metadata/embedded"
)

// etcdClient starts an embedded etcd for the test and returns a client.
func etcdClient(t *testing.T) *clientv3.Client {
	t.Helper()
	e, err := embedded.Start(embedded.Config{Dir: filepath.Join(t.TempDir(), "etcd"), ClientURL: "http://127.0.0.1:0", Fast: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	cli, err := metadata.NewClient([]string{e.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A location flush gap must leave the lease its renewals: at most a
// quarter of the TTL.
func TestLocationFlushGapWithinTheLease(t *testing.T) {
	cfg := TestConfig("gap", 4<<20)
	cfg.DisableShm = true
	cfg.Etcd, cfg.LocationFlushGap = etcdClient(t), 2*time.Second // the lease is 5 s
	n, err := New(cfg)
	if err == nil {
		n.Close()
		t.Fatal("New accepted a 2s location flush gap on a 5s lease")
	}
	if !strings.Contains(err.Error(), "location flush gap 2s") {
		t.Fatalf("error %q does not name the gap", err)
	}
}

// TestClusterSetupFailureLeavesNothingRunning: memberlist starts its
// listeners when the gossip is created, so a failure after that (here the
// membership's own validation) must shut the gossip down again.
func TestClusterSetupFailureLeavesNothingRunning(t *testing.T) {
	cli := etcdClient(t)
	cfg := TestConfig(fmt.Sprintf("n%d", rand.Uint32()), 4<<20)
	cfg.DisableShm = true
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	before := goleak.IgnoreCurrent()
	n.cfg.Etcd, n.cfg.LeaseTTL = cli, time.Second // below what the member accepts
	if c, err := newCluster(n, n.log); err == nil {
		c.gossip.Shutdown()
		t.Fatal("newCluster accepted a lease TTL the member refuses")
	}
	// The embedded etcd and gRPC start goroutines of their own, lazily,
	// for the streams newCluster opened and closed (the server watches
	// each for leader changes; gRPC runs callback serializers); they are
	// the test's, not newCluster's, and end on their own schedule.
	if err := goleak.Find(before,
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/embed.(*serveCtx).startHandler.func1"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/v3rpc.monitorLeader.func1"),
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	); err != nil {
		t.Fatalf("a failed cluster setup left goroutines running: %v", err)
	}
}

// logStore keeps every log record's attributes, for tests.
type logStore struct {
	mu      sync.Mutex
	records []map[string]string
}

// recorder is a slog.Handler writing into a logStore. An attribute given
// twice (a logger scoped twice with the same key) shows as "a,b".
type recorder struct {
	store *logStore
	attrs []slog.Attr
}

func (r recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r recorder) Handle(_ context.Context, rec slog.Record) error {
	m := map[string]string{"msg": rec.Message}
	add := func(a slog.Attr) bool {
		if old, dup := m[a.Key]; dup {
			m[a.Key] = old + "," + a.Value.String()
		} else {
			m[a.Key] = a.Value.String()
		}
		return true
	}
	for _, a := range r.attrs {
		add(a)
	}
	rec.Attrs(add)
	r.store.mu.Lock()
	r.store.records = append(r.store.records, m)
	r.store.mu.Unlock()
	return nil
}

func (r recorder) WithAttrs(as []slog.Attr) slog.Handler {
	return recorder{r.store, slices.Concat(r.attrs, as)}
}

func (r recorder) WithGroup(string) slog.Handler { return r }

func (s *logStore) components() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]bool{}
	for _, m := range s.records {
		out[m["component"]] = true
	}
	return out
}

// TestLogsCarryTheNodeID runs two nodes in one process and checks that
// every log line says which node wrote it, once, and which component:
// the node itself, the fetcher, the mirror, the member and the gossip.
func TestLogsCarryTheNodeID(t *testing.T) {
	cli := etcdClient(t)
	logs := map[string]*logStore{}
	var nodes []*Node
	for _, id := range []string{"log-a", "log-b"} {
		logs[id] = &logStore{}
		nodes = append(nodes, startNode(t, func(c *Config) {
			c.NodeID, c.Etcd, c.LeaseTTL = id, cli, 2*time.Second
			c.Logger = slog.New(recorder{store: logs[id]})
		}))
	}
	ctx := context.Background()
	a := dial(t, nodes[0], api.PathData)
	k := api.BlockKey{Tenant: "t", Namespace: "n", Key: []byte("k")}
	if err := a.Put(ctx, k, value(1, 4096)); err != nil {
		t.Fatal(err)
	}
	b := dial(t, nodes[1], api.PathData)
	eventually.True(t, "node b to fetch the block from a", 20*time.Second, func() bool {
		res, err := b.Fetch(ctx, "t", "n", [][]byte{k.Key}, 0)
		return err == nil && res[0].Err == nil
	})
	// A malformed record makes every mirror log; each node's gossip logs
	// the other's arrival.
	if _, err := cli.Put(ctx, "/kvpool/nodes/garbage", "{not json"); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "every mirror and gossip to log", 20*time.Second, func() bool {
		for _, r := range logs {
			if c := r.components(); !c["mirror"] || !c["gossip"] {
				return false
			}
		}
		return true
	})
	for id, r := range logs {
		want := []string{"pool", "mirror", "member", "gossip"}
		if id == "log-b" {
			want = append(want, "fetch") // b pulled the block
		}
		for _, want := range want {
			if !r.components()[want] {
				t.Errorf("%s: no log line from component %q", id, want)
			}
		}
		r.mu.Lock()
		for _, m := range r.records {
			if m["node"] != id || m["component"] == "" {
				t.Errorf("%s: a log line without its node or component: %v", id, m)
			}
		}
		r.mu.Unlock()
	}
}
