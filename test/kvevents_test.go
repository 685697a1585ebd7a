package test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/admin"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/metadata/engines"
	"github.com/kvpool/kvpool/metadata/kvevents"
	"github.com/kvpool/kvpool/pool"
	"github.com/kvpool/kvpool/test/cluster"
)

// publisher is an engine's event publisher in a separate process
// (api/python/kvpool/kvevents.py, pyzmq and msgpack), driven line by line.
type publisher struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
	// endpoint and replay are as bound ("" without a replay socket).
	endpoint, replay string
}

// startPublisher starts a publisher on free loopback ports, with a replay
// socket or without.
func startPublisher(t *testing.T, withReplay bool) *publisher {
	t.Helper()
	if out, err := pythonCmd(t, "-c", "import zmq, msgpack").CombinedOutput(); err != nil {
		if os.Getenv("KVPOOL_REQUIRE_TOOLS") != "" {
			t.Fatalf("python3-zmq and python3-msgpack are missing (KVPOOL_REQUIRE_TOOLS is set): %s", out)
		}
		t.Skipf("python3-zmq and python3-msgpack are missing: %s", out)
	}
	replay := "-"
	if withReplay {
		replay = "tcp://127.0.0.1:*"
	}
	cmd := pythonCmd(t, "-m", "kvpool.kvevents", "tcp://127.0.0.1:*", replay)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	p := &publisher{t: t, in: in, out: bufio.NewScanner(stdout)}
	f := []string{}
	if p.out.Scan() {
		f = strings.Fields(p.out.Text())
	}
	if len(f) != 3 || f[0] != "ready" {
		t.Fatalf("the publisher did not start: %q", p.out.Text())
	}
	p.endpoint = f[1]
	if f[2] != "-" {
		p.replay = f[2]
	}
	return p
}

// do sends one command and returns the publisher's answer.
func (p *publisher) do(line string) string {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.in, line); err != nil {
		p.t.Fatal(err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("the publisher stopped after %q", line)
	}
	if ans := p.out.Text(); strings.HasPrefix(ans, "ok") {
		return ans
	}
	p.t.Fatalf("%q: %s", line, p.out.Text())
	return ""
}

func hashKeys(ns ...int64) [][]byte {
	var out [][]byte
	for _, n := range ns {
		out = append(out, []byte(kvevents.IntHash(n)))
	}
	return out
}

// Two engines publish from their own processes; one tracker follows both.
// Stored blocks appear, removed ones go; a lost message is recovered from
// the engine's replay socket; an engine without one forgets what it knew
// rather than claim blocks it may have dropped; a restart clears.
func TestEngineEventsFromSeparateProcesses(t *testing.T) {
	requirePython(t)
	pa, pb := startPublisher(t, true), startPublisher(t, false)
	tr, err := engines.New(engines.Config{Engines: []engines.EngineConfig{
		{Name: "a", Endpoint: pa.endpoint, Replay: pa.replay},
		{Name: "b", Endpoint: pb.endpoint},
	}, RetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tr.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	stats := func(name string) engines.Stats {
		for _, s := range tr.Stats() {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no engine %s", name)
		return engines.Stats{}
	}
	// A SUB socket misses what is sent before it has joined: publish
	// until each tracker has heard its engine.
	for _, p := range []struct {
		name string
		pub  *publisher
	}{{"a", pa}, {"b", pb}} {
		eventually.True(t, "the tracker hears engine "+p.name, 10*time.Second, func() bool {
			p.pub.do("removed 999")
			return stats(p.name).Messages > 0
		})
	}

	// Stored, then visible.
	t0 := time.Now()
	pa.do("stored 1,2 - 2")
	eventually.True(t, "a's blocks 1, 2", 5*time.Second, func() bool { return tr.Prefix("", "", hashKeys(1, 2)) == 2 })
	t.Logf("a BlockStored reached the tracker in %v", time.Since(t0))
	pb.do("stored 101,102,103 - 2")
	eventually.True(t, "b's blocks 101, 102, 103", 5*time.Second, func() bool { return tr.Prefix("", "", hashKeys(101, 102, 103)) == 3 })

	// Removed, then gone.
	pa.do("stored 7,8 - 2")
	pa.do("removed 8")
	eventually.True(t, "a's block 8 gone", 5*time.Second, func() bool { return tr.Prefix("", "", hashKeys(7, 8)) == 1 })

	// A lost message on a: the next reveals the gap, and the replay
	// socket fills it.
	pa.do("drop stored 9 7 2")
	pa.do("stored 10 9 2")
	eventually.True(t, "a's 7, 9, 10 after the replay", 5*time.Second, func() bool { return tr.Prefix("", "", hashKeys(7, 9, 10)) == 3 })
	if s := stats("a"); s.Gaps != 1 || s.Replays != 1 || s.Lost != 0 {
		t.Errorf("engine a: %d gaps, %d replays, %d lost; want 1, 1, 0", s.Gaps, s.Replays, s.Lost)
	}

	// A lost message on b, which has no replay socket: b's state is
	// dropped (its earlier blocks may have gone in the lost message), and
	// only what it stores afterwards counts.
	pb.do("drop removed 103")
	pb.do("stored 20 - 2")
	eventually.True(t, "b's 20", 5*time.Second, func() bool { return tr.Prefix("", "", hashKeys(20)) == 1 })
	if n := tr.Prefix("", "", hashKeys(101, 102, 103)); n != 0 {
		t.Errorf("after a loss the tracker still claims %d blocks of b's old chain", n)
	}
	if s := stats("b"); s.Lost != 1 {
		t.Errorf("engine b: %d losses, want 1", s.Lost)
	}

	// a restarts: its sequence starts again, and its cache is empty.
	pa.do("restart")
	pa.do("stored 30 - 2")
	eventually.True(t, "a's 30 after its restart", 5*time.Second, func() bool { return tr.Prefix("", "", hashKeys(30)) == 1 })
	if n := tr.Prefix("", "", hashKeys(7)); n != 0 {
		t.Errorf("a restarted engine still holds block 7 (%d)", n)
	}
	if s := stats("a"); s.Restarts != 1 || s.Malformed != 0 {
		t.Errorf("engine a: %d restarts, %d malformed; want 1, 0", s.Restarts, s.Malformed)
	}
}

// A daemon that follows its engine's KV events plans for itself with the
// engine's GPU prefix: free blocks, and host blocks priced at the node's
// host-to-GPU rate; when the engine evicts, the plan no longer counts
// them.
func TestPlanSeesTheEnginesGPUTier(t *testing.T) {
	requirePython(t)
	pub := startPublisher(t, false)
	c := cluster.New(t, cluster.Config{Nodes: 1, Mutate: func(_ int, pc *pool.Config) {
		pc.EngineEvents = []engines.EngineConfig{{Name: "vllm-0", Endpoint: pub.endpoint, Tenant: "acme", Namespace: "llama3-8b"}}
		pc.HostToGPUBytesPerSecond = 50e9
	}})
	cl := c.Client(0, api.PathData)
	ctx := context.Background()
	keys := hashKeys(1, 2, 3, 4)
	// The daemon holds blocks 1..4 in host memory; the engine will hold
	// 1 and 2 in GPU memory.
	putBlocks(t, cl, keys, 4096)
	req := api.PlanRequest{Tenant: "acme", Namespace: "llama3-8b", Keys: keys, BlockTokens: 16}
	estimate := func() api.NodePlan {
		p, err := cl.Estimate(ctx, req, "")
		if err != nil {
			t.Fatal(err)
		}
		return p.Nodes[0]
	}
	// Before the engine has said anything its GPU holds nothing known:
	// all four host blocks load, 4 × 16 tokens × 131072 B at 50 GB/s.
	perBlock := float64(16*131072) / 50e9 * float64(time.Second)
	if n := estimate(); n.GPUBlocks != 0 || n.LocalBlocks != 4 || n.LocalLoad != time.Duration(4*perBlock) {
		t.Fatalf("before any event: %+v", n)
	}
	eventually.True(t, "the daemon hears its engine", 10*time.Second, func() bool {
		pub.do("removed 999")
		for _, s := range c.Nodes[0].Node.EngineStats() {
			if s.Messages > 0 {
				return true
			}
		}
		return false
	})
	t0 := time.Now()
	pub.do("stored 1,2 - 16")
	eventually.True(t, "the plan names the GPU tier", 5*time.Second, func() bool { return estimate().GPUBlocks == 2 })
	t.Logf("BlockStored to the daemon's plan: %v", time.Since(t0))
	n := estimate()
	// Blocks 3 and 4 load from host memory: 2 × 16 tokens × 131072 B at
	// 50 GB/s.
	if want := time.Duration(2 * perBlock); n.LocalBlocks != 4 || n.LocalLoad < want-time.Microsecond || n.LocalLoad > want+time.Microsecond {
		t.Fatalf("with the GPU tier: %+v; want 4 local blocks, 2 in GPU, %v of loading", n, want)
	}
	// The engine computes acme's blocks: another tenant's plan for the same
	// keys does not see them.
	other := req
	other.Tenant = "globex"
	if p, err := cl.Estimate(ctx, other, ""); err != nil || p.Nodes[0].GPUBlocks != 0 || p.Nodes[0].LocalBlocks != 0 {
		t.Fatalf("another tenant's plan: %+v, %v", p.Nodes, err)
	}
	t0 = time.Now()
	pub.do("removed 2")
	eventually.True(t, "the plan drops the evicted block", 5*time.Second, func() bool { return estimate().GPUBlocks == 1 })
	t.Logf("BlockRemoved to the daemon's plan: %v", time.Since(t0))
}

// Two engines publish from their own processes, engine A's events to
// daemon 0 and engine B's to daemon 1; daemon 2 follows none. Every
// daemon's Plan names A's GPU tier on node 0 soon after A's BlockStored,
// and stops naming it soon after A's BlockRemoved; each round's latency
// (the slowest daemon's) is logged. After a gap A's replay recovers, and
// B, which has none, is forgotten everywhere rather than claimed wrong.
// The cluster runs with mutual TLS, so the peers' streams are
// authenticated as nodes.
func TestEveryDaemonPlansWithEveryGPUTier(t *testing.T) {
	requirePython(t)
	pa, pb := startPublisher(t, true), startPublisher(t, false)
	c := cluster.New(t, cluster.Config{Nodes: 3, Secure: true, Mutate: func(i int, pc *pool.Config) {
		switch i {
		case 0:
			pc.EngineEvents = []engines.EngineConfig{{Name: "vllm-a", Endpoint: pa.endpoint, Replay: pa.replay}}
		case 1:
			pc.EngineEvents = []engines.EngineConfig{{Name: "vllm-b", Endpoint: pb.endpoint}}
		}
	}})
	c.WaitNodes(3)
	node0, node1 := c.Nodes[0].ID, c.Nodes[1].ID
	// gpu is what daemon d's Plan says node's engines hold of the chain.
	gpu := func(d int, node string, keys [][]byte) int {
		ans, err := c.Nodes[d].Node.Plan(pool.PlanQuery{Tenant: "acme", Namespace: "llama3-8b", Keys: keys, BlockTokens: 16})
		if err != nil {
			t.Fatal(err)
		}
		for _, np := range ans.Result.Nodes {
			if np.Node == node {
				return np.GPUBlocks
			}
		}
		t.Fatalf("daemon %d's plan has no node %s", d, node)
		return 0
	}
	// everywhere waits until every daemon's plan says node holds want
	// blocks of keys in GPU memory, and returns how long that took.
	everywhere := func(what, node string, keys [][]byte, want int) time.Duration {
		t.Helper()
		t0 := time.Now()
		eventually.True(t, what, 10*time.Second, func() bool {
			for d := range c.Nodes {
				if gpu(d, node, keys) != want {
					return false
				}
			}
			return true
		})
		return time.Since(t0)
	}
	// Each daemon hears its engine, and every daemon follows both.
	for i, p := range []*publisher{pa, pb} {
		eventually.True(t, "daemon hears its engine", 10*time.Second, func() bool {
			p.do("removed 999")
			s := c.Nodes[i].Node.EngineStats()
			return len(s) == 1 && s[0].Messages > 0
		})
	}
	for d := range c.Nodes {
		eventually.True(t, "every daemon follows both engines' nodes", 10*time.Second, func() bool {
			up := 0
			for _, s := range c.Nodes[d].Node.PeerCaches() {
				if s.Connected {
					up++
				}
			}
			want := 2
			if d < 2 {
				want = 1 // its own engine is not a peer's
			}
			return up == want
		})
	}

	// Rounds of store and remove on A: 1..4 stored, then 3 removed.
	const rounds = 20
	var storedIn, removedIn []time.Duration
	for r := range rounds {
		base := int64(1000 * (r + 1))
		keys := hashKeys(base, base+1, base+2, base+3)
		t0 := time.Now()
		pa.do(fmt.Sprintf("stored %d,%d,%d,%d - 16", base, base+1, base+2, base+3))
		everywhere("every plan names A's 4 blocks", node0, keys, 4)
		storedIn = append(storedIn, time.Since(t0))
		t0 = time.Now()
		pa.do(fmt.Sprintf("removed %d", base+2))
		everywhere("no plan names A's removed block", node0, keys, 2)
		removedIn = append(removedIn, time.Since(t0))
	}
	slices.Sort(storedIn)
	slices.Sort(removedIn)
	t.Logf("BlockStored → every daemon's Plan names it, over %d rounds: p50 %v, max %v", rounds, storedIn[rounds/2], storedIn[rounds-1])
	t.Logf("BlockRemoved → no daemon's Plan names it: p50 %v, max %v", removedIn[rounds/2], removedIn[rounds-1])

	// A gap on A, filled from its replay socket: every daemon sees the
	// message that was lost on the stream.
	pa.do("stored 7,8 - 16")
	everywhere("A's 7, 8", node0, hashKeys(7, 8), 2)
	pa.do("drop stored 9 8 16")
	pa.do("stored 10 9 16")
	everywhere("A's 7..10 after the replay", node0, hashKeys(7, 8, 9, 10), 4)

	// A gap on B, which has no replay: B's old blocks are forgotten on
	// every daemon (the lost message removed one of them), and only what B
	// stores afterwards counts.
	pb.do("stored 101,102,103 - 16")
	everywhere("B's 101..103", node1, hashKeys(101, 102, 103), 3)
	pb.do("drop removed 103")
	pb.do("stored 20 - 16")
	everywhere("B's 20 after the loss", node1, hashKeys(20), 1)
	for d := range c.Nodes {
		if n := gpu(d, node1, hashKeys(101, 102, 103)); n != 0 {
			t.Errorf("after B's loss daemon %d still claims %d of its old blocks", d, n)
		}
	}

	// The admin view shows both tiers, from a daemon that follows peers.
	loc, err := admin.New(c.Client(2, api.PathData)).Locate(context.Background(), "acme", "llama3-8b", hashKeys(7, 8, 9, 10))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range loc.Nodes {
		want := admin.NodePrefix{Node: n.Node}
		switch n.Node {
		case node0:
			want.GPUBlocks, want.GPUFollowed = 4, true
		case node1:
			want.GPUFollowed = true
		}
		if n != want {
			t.Errorf("cluster locate on daemon 2: %+v; want %+v", n, want)
		}
	}

	// Daemon 0 stops: its engine's tier leaves every other plan (a
	// peer that is gone holds nothing known).
	c.Stop(0)
	eventually.True(t, "daemon 0's GPU tier leaves the other plans", 20*time.Second, func() bool {
		for d := 1; d < 3; d++ {
			for _, s := range c.Nodes[d].Node.PeerCaches() {
				if s.Node == node0 && s.Connected {
					return false
				}
			}
		}
		return true
	})
}
