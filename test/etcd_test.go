package test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/metadata"
	"github.com/kvpool/kvpool/metadata/embedded"
	"github.com/kvpool/kvpool/test/cluster"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The daemons work against a separate etcd process: Debian's etcd-server
// (3.4), which .ci/run installs.
func TestExternalEtcdProcess(t *testing.T) {
	etcd := requireTool(t, "etcd")
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	cmd := exec.Command(etcd, "--name", "ext", "--data-dir", filepath.Join(t.TempDir(), "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "ext="+peer,
		"--log-level", "error")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	cli, err := metadata.NewClient([]string{client})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cli.Status(ctx, strings.TrimPrefix(client, "http://"))
		cancel()
		if err == nil {
			t.Logf("external etcd %s is up", st.Version)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd did not start: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c := cluster.New(t, cluster.Config{Nodes: 2, Endpoints: []string{client}})
	keys := chainKeys(t, 9, 6)
	putChain(t, c.Client(0, api.PathData), keys)
	putChain(t, c.Client(1, api.PathData), keys[:2])
	c.Converged(10 * time.Second)
	if got := locateNodes(c, 1, keys); got["node-0"] != 6 || got["node-1"] != 2 {
		t.Fatalf("locate through the external etcd: %v", got)
	}
	c.Kill(1)
	c.Eventually("node-1 to leave the external etcd", 5*time.Second, func() bool {
		return len(c.Nodes[0].Node.Mirror().Nodes()) == 1
	})
}

// A three-member etcd cluster loses its leader mid-test; the daemons go on
// publishing and mirroring through the other two, without missing or
// duplicating a record.
func TestThreeMemberEtcdLosesAMember(t *testing.T) {
	names := []string{"e0", "e1", "e2"}
	var peers, clients, initial []string
	for _, n := range names {
		peers = append(peers, fmt.Sprintf("http://127.0.0.1:%d", freePort(t)))
		clients = append(clients, fmt.Sprintf("http://127.0.0.1:%d", freePort(t)))
		initial = append(initial, n+"="+peers[len(peers)-1])
	}
	members := make([]*embedded.Etcd, 3)
	errs := make(chan error, 3)
	for i, n := range names {
		go func() {
			e, err := embedded.Start(embedded.Config{Name: n, Dir: filepath.Join(t.TempDir(), n), ClientURL: clients[i],
				PeerURL: peers[i], InitialCluster: strings.Join(initial, ","), Fast: true})
			members[i] = e
			errs <- err
		}()
	}
	for range names {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, m := range members {
			if m != nil {
				m.Close()
			}
		}
	}()
	c := cluster.New(t, cluster.Config{Nodes: 3, Endpoints: clients, LeaseTTL: 5 * time.Second})
	keys := chainKeys(t, 11, 8)
	putChain(t, c.Client(0, api.PathData), keys[:4])
	c.Converged(10 * time.Second)

	// Stop the leader, so the cluster must elect another.
	cli := c.EtcdClient()
	leader := -1
	for i, u := range clients {
		st, err := cli.Status(context.Background(), strings.TrimPrefix(u, "http://"))
		if err == nil && st.Leader == st.Header.MemberId {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no etcd member says it leads")
	}
	members[leader].Close()
	members[leader] = nil
	lost := time.Now()
	putChain(t, c.Client(1, api.PathData), keys)
	putChain(t, c.Client(2, api.PathShm), keys[:6])
	content := c.Converged(30 * time.Second)
	t.Logf("converged %v after losing the leader, member e%d", time.Since(lost).Round(time.Millisecond), leader)
	if len(content) != 4+8+6 {
		t.Fatalf("etcd holds %d records after losing the leader, want 18", len(content))
	}
	for i := range c.Nodes {
		if got := locateNodes(c, i, keys); got["node-0"] != 4 || got["node-1"] != 8 || got["node-2"] != 6 {
			t.Fatalf("node-%d locates %v", i, got)
		}
	}
}
