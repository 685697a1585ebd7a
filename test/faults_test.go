package test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/test/cluster"
)

func locateNodes(c *cluster.Cluster, at int, keys [][]byte) map[string]int {
	r := c.Nodes[at].Node.Mirror().Locate("acme", "llama3-8b", keys)
	out := map[string]int{}
	for _, np := range r.Nodes {
		out[np.Node] = np.Blocks
	}
	return out
}

func etcdHas(t *testing.T, cli *clientv3.Client, prefix string) bool {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

// A daemon dies without shutting down: its records leave etcd within TTL
// + 1 s and every mirror right after; gossip drops it within 2 s, and
// Locate stops naming it at once.
func TestDaemonCrash(t *testing.T) {
	const ttl = 2 * time.Second
	c := cluster.New(t, cluster.Config{Nodes: 3, LeaseTTL: ttl})
	keys := chainKeys(t, 7, 8)
	putChain(t, c.Client(2, api.PathData), keys)
	c.Converged(10 * time.Second)
	if got := locateNodes(c, 0, keys)["node-2"]; got != 8 {
		t.Fatalf("before the crash node-0 sees node-2 holding %d blocks", got)
	}
	c.Eventually("gossip to see all three", 10*time.Second, func() bool {
		for _, p := range c.Nodes[0].Node.Gossip().Peers() {
			if p.State != "alive" {
				return false
			}
		}
		return len(c.Nodes[0].Node.Gossip().Peers()) == 3
	})
	cli := c.EtcdClient()

	killed := time.Now()
	c.Kill(2)
	c.Eventually("gossip on node-0 and node-1 to declare node-2 dead", 2*time.Second, func() bool {
		return c.Nodes[0].Node.Gossip().Dead("node-2") && c.Nodes[1].Node.Gossip().Dead("node-2")
	})
	gossipAfter := time.Since(killed)
	if _, ok := locateNodes(c, 0, keys)["node-2"]; ok {
		t.Fatal("Locate still names a node gossip declared dead")
	}
	c.Eventually("node-2's records to leave etcd", ttl+time.Second, func() bool {
		return !etcdHas(t, cli, "/kvpool/nodes/node-2") && !etcdHas(t, cli, "/kvpool/loc/node-2/")
	})
	etcdAfter := time.Since(killed)
	c.Eventually("every mirror to forget node-2", 500*time.Millisecond, func() bool {
		for _, d := range c.Running() {
			for _, ni := range d.Node.Mirror().Nodes() {
				if ni.Record.ID == "node-2" {
					return false
				}
			}
		}
		return true
	})
	t.Logf("gossip dropped node-2 after %v; etcd after %v (TTL %v)", gossipAfter.Round(time.Millisecond), etcdAfter.Round(time.Millisecond), ttl)
	c.Converged(5 * time.Second)
}

// etcd stops: local Put and Get keep working on every node and every
// path, and the changes queue. Once every daemon has seen its etcd session
// fail and queued changes, etcd returns; what was queued is in etcd within
// 5 s, and every mirror then equals etcd. The outage lasts as long as those
// conditions take, not a fixed time.
func TestEtcdOutage(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3, LeaseTTL: 5 * time.Second})
	ctx := context.Background()
	before := chainKeys(t, 1, 4)
	putChain(t, c.Client(0, api.PathData), before)
	c.Converged(10 * time.Second)
	failed := make([]uint64, len(c.Nodes))
	for i, d := range c.Nodes {
		failed[i] = d.Node.Member().Stats().Failures
	}

	url := c.StopEtcd()
	down := time.Now()
	clients := []*api.Client{c.Client(0, api.PathData), c.Client(1, api.PathShm), c.Client(2, api.PathGRPC)}
	var during [][]byte
	putOnEvery := func() {
		for i, cl := range clients {
			k := []byte(fmt.Sprintf("during-%d-%d", i, len(during)))
			v := []byte(fmt.Sprintf("value %d", len(during)))
			if err := cl.Put(ctx, api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k}, v); err != nil {
				t.Fatalf("put on node-%d with etcd down: %v", i, err)
			}
			got, err := cl.GetValue(ctx, api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k})
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("get on node-%d with etcd down: %v", i, err)
			}
			during = append(during, k)
		}
	}
	c.Eventually("every daemon to see etcd fail and queue its changes", 30*time.Second, func() bool {
		putOnEvery()
		for i, d := range c.Nodes {
			if st := d.Node.Member().Stats(); st.Failures == failed[i] || st.Queued == 0 {
				return false
			}
		}
		return true
	})
	if _, err := clients[0].GetValue(ctx, api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: before[0]}); err != nil {
		t.Fatalf("old blocks unreadable during the outage: %v", err)
	}
	outage := time.Since(down)
	c.StartEtcd(url)
	back := time.Now()
	cli := c.EtcdClient()
	c.Eventually("the records queued during the outage to reach etcd", 5*time.Second, func() bool {
		got, _, err := readContent(cli)
		if err != nil {
			return false
		}
		for _, k := range during {
			if !slices.ContainsFunc(got, func(line string) bool { return strings.HasSuffix(line, fmt.Sprintf("%x", k)) }) {
				return false
			}
		}
		return true
	})
	t.Logf("%d blocks put during a %v outage were in etcd %v after it returned", len(during), outage.Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	content := c.Converged(10 * time.Second)
	if len(content) != len(before)+len(during) {
		t.Fatalf("etcd holds %d records, want %d", len(content), len(before)+len(during))
	}
}

// Compaction while a daemon is cut off from etcd: its watch cannot resume,
// so its mirror reloads, and ends equal to etcd.
func TestCompactionWhileDisconnected(t *testing.T) {
	var proxy *cluster.Proxy
	c := cluster.New(t, cluster.Config{Nodes: 3, LeaseTTL: 5 * time.Second, EtcdEndpoints: func(i int, eps []string) []string {
		if i != 2 {
			return eps
		}
		scheme, target, _ := strings.Cut(eps[0], "://") // http, or https on a secured cluster
		proxy = cluster.NewProxy(t, target)
		return []string{scheme + "://" + proxy.Addr()}
	}})
	putChain(t, c.Client(0, api.PathData), chainKeys(t, 1, 10))
	c.Converged(10 * time.Second)
	reloads := c.Nodes[2].Node.Mirror().Stats().Reloads

	proxy.Pause()
	t.Logf("paused node-2 at revision %d", c.Nodes[2].Node.Mirror().Revision())
	cl := c.Client(1, api.PathData)
	keys := chainKeys(t, 2, 40)
	putChain(t, cl, keys)
	for _, k := range keys[:20] {
		if err := cl.Remove(context.Background(), api.BlockKey{Tenant: "acme", Namespace: "llama3-8b", Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	cli := c.EtcdClient()
	c.Eventually("node-1's changes to reach etcd", 10*time.Second, func() bool {
		got, _, err := readContent(cli)
		return err == nil && len(got) == 10+20
	})
	// Writes outside our prefix move the revision on, so the compaction
	// covers everything node-2 missed.
	var resp *clientv3.PutResponse
	for range 3 {
		var err error
		if resp, err = cli.Put(context.Background(), "/elsewhere/x", "y"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Compact(context.Background(), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	t.Logf("compacted at %d; node-2 at %d", resp.Header.Revision, c.Nodes[2].Node.Mirror().Revision())
	proxy.Resume()
	c.Converged(20 * time.Second)
	if got := c.Nodes[2].Node.Mirror().Stats().Reloads; got <= reloads {
		t.Fatalf("node-2's mirror did not reload (reloads %d -> %d)", reloads, got)
	}
}

// A daemon restarts with the same id: it registers again cleanly, in a new
// epoch, and what it held before (lost with its memory) is forgotten.
func TestRestartWithSameID(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3})
	keys := chainKeys(t, 3, 6)
	putChain(t, c.Client(1, api.PathData), keys)
	c.Converged(10 * time.Second)
	oldEpoch := c.Nodes[1].Node.Member().Epoch()
	for _, stop := range []func(int){c.Kill, c.Stop} {
		stop(1)
		d := c.Restart(1)
		c.Eventually("node-1 to register again", 10*time.Second, func() bool { return d.Node.Member().Epoch() != 0 })
		if d.Node.Member().Epoch() == oldEpoch {
			t.Fatal("the restarted node kept its old epoch")
		}
		c.WaitNodes(3)
		content := c.Converged(10 * time.Second)
		for _, line := range content {
			if strings.HasPrefix(line, "node-1 ") {
				t.Fatalf("the restarted node-1 still has old records: %s", line)
			}
		}
		putChain(t, c.Client(1, api.PathData), keys[:2])
		c.Eventually("node-1's new blocks to be located", 10*time.Second, func() bool { return locateNodes(c, 0, keys)["node-1"] == 2 })
		oldEpoch = d.Node.Member().Epoch()
	}
}

// Malformed records under our prefix, written by hand, are skipped and
// counted; no daemon crashes and the rest of the index is intact.
func TestMalformedRecords(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 2})
	keys := chainKeys(t, 4, 5)
	putChain(t, c.Client(0, api.PathData), keys)
	c.Converged(10 * time.Second)
	cli := c.EtcdClient()
	ctx := context.Background()
	epoch := fmt.Sprintf("%x", c.Nodes[0].Node.Member().Epoch())
	garbage := map[string]string{
		"/kvpool/nodes/bogus":                               "not json",
		"/kvpool/nodes/wrong-key":                           `{"id":"other","epoch":5}`,
		"/kvpool/nodes/no-epoch":                            `{"id":"no-epoch"}`,
		"/kvpool/loc/bad":                                   "x",
		"/kvpool/loc/node-0/" + epoch + "/zz":               "x",
		"/kvpool/loc/node-0/" + epoch + "/00000000ffffff00": "\x01\x00garbage",
		"/kvpool/loc/node-0/" + epoch + "/00000000ffffff01": "",
	}
	for k, v := range garbage {
		if _, err := cli.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	c.Eventually("every mirror to skip and count the malformed records", 10*time.Second, func() bool {
		for _, d := range c.Running() {
			if d.Node.Mirror().Stats().Malformed < uint64(len(garbage)) {
				return false
			}
		}
		return true
	})
	for i := range c.Nodes {
		if got := locateNodes(c, i, keys)["node-0"]; got != 5 {
			t.Fatalf("node-%d sees node-0 holding %d blocks after the garbage, want 5", i, got)
		}
	}
	// The daemons still serve and publish.
	putChain(t, c.Client(1, api.PathData), keys[:3])
	c.Eventually("node-1's blocks to be located", 10*time.Second, func() bool { return locateNodes(c, 0, keys)["node-1"] == 3 })
}

func readContent(cli *clientv3.Client) ([]string, int64, error) {
	return metadata.ReadContent(context.Background(), cli, "/kvpool/")
}

// A crashed node restarted with the same id on a new gossip port is alive
// to its peers at once: it used to stay "dead" for 15 s or more, its
// blocks unfetchable, because memberlist kept the dead node's address.
func TestRestartOnNewGossipPort(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3})
	keys := chainKeys(t, 9, 4)
	c.Converged(10 * time.Second)
	c.Eventually("gossip to see all three", 10*time.Second, func() bool {
		for _, p := range c.Nodes[0].Node.Gossip().Peers() {
			if p.State != "alive" {
				return false
			}
		}
		return len(c.Nodes[0].Node.Gossip().Peers()) == 3
	})
	before := c.Nodes[1].Node.Gossip().Addr()
	c.Kill(1)
	c.Eventually("node-0's gossip to declare node-1 dead", 10*time.Second, func() bool { return c.Nodes[0].Node.Gossip().Dead("node-1") })
	d := c.Restart(1)
	start := time.Now()
	if d.Node.Gossip().Addr() == before {
		t.Fatalf("the restarted node gossips on its old address %s; the test needs a new one", before)
	}
	alive := func() bool {
		for _, p := range c.Nodes[0].Node.Gossip().Peers() {
			if p.ID == "node-1" {
				return p.State == "alive" && p.Addr == d.Node.Gossip().Addr()
			}
		}
		return false
	}
	c.Eventually("node-0 to see the restarted node-1 alive at its new address", 5*time.Second, alive)
	t.Logf("node-1 alive to node-0 %v after its restart on %s (was %s)", time.Since(start).Round(time.Millisecond), d.Node.Gossip().Addr(), before)
	putChain(t, c.Client(1, api.PathData), keys)
	c.Eventually("node-1's blocks to be fetchable from node-0", 10*time.Second, func() bool {
		res, err := c.Client(0, api.PathData).Fetch(context.Background(), "acme", "llama3-8b", keys, time.Second)
		if err != nil {
			return false
		}
		for _, r := range res {
			if r.Err != nil {
				return false
			}
		}
		return true
	})
}
