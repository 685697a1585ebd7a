package test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/metadata"
)

// etcdProcess is Debian's etcd-server running as a separate process, so a
// test can freeze it (SIGSTOP), kill it and start it again on the same
// ports and data.
type etcdProcess struct {
	t              testing.TB
	bin, dir       string
	client, peer   string
	cmd            *exec.Cmd
	done           chan struct{}
	checkingClient *clientv3.Client
	// With TLS: etcd's flags, and how the test's own client reaches it.
	tlsFlags  []string
	clientTLS *tls.Config
}

func startEtcdProcess(t *testing.T) *etcdProcess {
	t.Helper()
	return startEtcdProcessWith(t, "http", nil, nil)
}

// startEtcdProcessWith starts etcd with its client URL in scheme and the
// extra flags (TLS ones); clientTLS is how the test's client reaches it.
func startEtcdProcessWith(t *testing.T, scheme string, flags []string, clientTLS *tls.Config) *etcdProcess {
	t.Helper()
	e := &etcdProcess{t: t, bin: requireTool(t, "etcd"), dir: filepath.Join(t.TempDir(), "etcd"),
		client: fmt.Sprintf("%s://127.0.0.1:%d", scheme, freePort(t)), peer: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		tlsFlags: flags, clientTLS: clientTLS}
	e.start()
	t.Cleanup(func() {
		e.cmd.Process.Signal(syscall.SIGCONT)
		e.stop(syscall.SIGKILL)
		if e.checkingClient != nil {
			e.checkingClient.Close()
		}
	})
	return e
}

// start runs etcd on e's ports and data directory and waits until it answers.
func (e *etcdProcess) start() {
	e.t.Helper()
	args := append([]string{"--name", "ext", "--data-dir", e.dir,
		"--listen-client-urls", e.client, "--advertise-client-urls", e.client,
		"--listen-peer-urls", e.peer, "--initial-advertise-peer-urls", e.peer, "--initial-cluster", "ext=" + e.peer,
		"--log-level", "error"}, e.tlsFlags...)
	e.cmd = exec.Command(e.bin, args...)
	if err := e.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { cmd.Wait(); close(done) }(e.cmd, e.done)
	deadline := time.Now().Add(30 * time.Second)
	for !e.answers() {
		if time.Now().After(deadline) {
			e.t.Fatal("etcd did not start within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cli is a client of e for the test's own checks.
func (e *etcdProcess) cli() *clientv3.Client {
	if e.checkingClient == nil {
		c, err := metadata.NewSecureClient(metadata.EtcdConfig{Endpoints: []string{e.client}, TLS: e.clientTLS})
		if err != nil {
			e.t.Fatal(err)
		}
		e.checkingClient = c
	}
	return e.checkingClient
}

// answers reports whether etcd serves a linearizable read now.
func (e *etcdProcess) answers() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := e.cli().Get(ctx, "health-probe")
	return err == nil
}

func (e *etcdProcess) signal(sig syscall.Signal) {
	e.t.Helper()
	if err := e.cmd.Process.Signal(sig); err != nil {
		e.t.Fatal(err)
	}
}

// stop sends sig and waits for the process to exit.
func (e *etcdProcess) stop(sig syscall.Signal) {
	e.cmd.Process.Signal(sig)
	select {
	case <-e.done:
	case <-time.After(10 * time.Second):
		e.t.Fatalf("etcd did not exit within 10 s of %v", sig)
	}
}

// epoch is the epoch (lease id) of node's record in etcd; 0 when it has none.
func (e *etcdProcess) epoch(node string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := e.cli().Get(ctx, "/kvpool/nodes/"+node)
	if err != nil || len(resp.Kvs) == 0 {
		return 0
	}
	var rec metadata.NodeRecord
	if json.Unmarshal(resp.Kvs[0].Value, &rec) != nil {
		return 0
	}
	return rec.Epoch
}

// publishedIn reports whether node has location records in etcd under epoch.
func (e *etcdProcess) publishedIn(node string, epoch int64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := e.cli().Get(ctx, fmt.Sprintf("/kvpool/loc/%s/%x/", node, epoch), clientv3.WithPrefix(), clientv3.WithCountOnly())
	return err == nil && resp.Count > 0
}

// etcdFaultRuns is how many freezes and kills TestEtcdFreezeAndKill makes:
// 3 in the suite, KVPOOL_FAULT_RUNS for the closing note's 10.
func etcdFaultRuns(t *testing.T) int {
	if s := os.Getenv("KVPOOL_FAULT_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("KVPOOL_FAULT_RUNS=%q: want a positive count", s)
		}
		return n
	}
	return 3
}

// Two daemon processes on a separate etcd process. etcd is frozen with
// SIGSTOP past the daemons' lease TTL, so their leases expire the moment it
// resumes: each daemon must notice, register anew and republish its blocks
// within 5 s of etcd answering again, every time; before, it retried the
// dead lease ("requested lease not found") for up to a minute. Then etcd
// is killed with SIGKILL and restarted on its data: leases survive a
// restart, and the daemons must go on publishing through it.
func TestEtcdFreezeAndKill(t *testing.T) {
	const ttl = 2 * time.Second
	e := startEtcdProcess(t)
	common := []string{"--etcd-endpoints", e.client, "--lease-ttl", ttl.String(), "--capacity", "16MiB"}
	a := startServe(t, append([]string{"--node-id", "freeze-a"}, common...)...)
	b := startServe(t, append([]string{"--node-id", "freeze-b"}, common...)...)
	ctx := context.Background()
	ca, err := api.Dial(ctx, api.ClientConfig{Server: a.addr, Path: api.PathData})
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb, err := api.Dial(ctx, api.ClientConfig{Server: b.addr, Path: api.PathData})
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	keys := chainKeys(t, 21, 4)
	putChain(t, ca, keys)
	// bSeesA: b's cluster map names freeze-a for every key.
	bSeesA := func() bool {
		holders, err := cb.Route(ctx, "acme", "llama3-8b", keys)
		if err != nil {
			return false
		}
		for _, hs := range holders {
			found := false
			for _, h := range hs {
				found = found || h.NodeID == "freeze-a"
			}
			if !found {
				return false
			}
		}
		return true
	}
	eventually.True(t, "b to see a's blocks", 10*time.Second, bSeesA)

	// back waits until a is registered in an epoch other than old, has
	// published in it, and b sees its blocks; it returns how long that took.
	back := func(what string, old int64, within time.Duration) (time.Duration, int64) {
		t.Helper()
		start := time.Now()
		var epoch int64
		eventually.True(t, what, within, func() bool {
			epoch = e.epoch("freeze-a")
			return epoch != 0 && epoch != old && e.publishedIn("freeze-a", epoch) && bSeesA()
		})
		return time.Since(start), epoch
	}

	epoch := e.epoch("freeze-a")
	var worst time.Duration
	for run := range etcdFaultRuns(t) {
		e.signal(syscall.SIGSTOP)
		// Frozen well past the TTL: the lease is dead when etcd resumes. a
		// goes on taking puts, so it has changes to publish all along.
		frozen := time.Now()
		for i := 0; time.Since(frozen) < 2*ttl+time.Second; i++ {
			putChain(t, ca, chainKeys(t, uint32(1000+100*run+i), 1))
			time.Sleep(100 * time.Millisecond)
		}
		e.signal(syscall.SIGCONT)
		took, next := back(fmt.Sprintf("run %d: a registered anew after etcd resumed", run), epoch, 5*time.Second)
		t.Logf("freeze %d: etcd frozen %v; a re-registered (epoch %x → %x) and b saw its blocks %v after SIGCONT",
			run, 2*ttl+time.Second, epoch, next, took.Round(time.Millisecond))
		worst, epoch = max(worst, took), next
	}
	t.Logf("worst of %d freezes: %v", etcdFaultRuns(t), worst.Round(time.Millisecond))

	// A killed etcd restarted on its data keeps the leases: a stays in its
	// epoch, and what it puts meanwhile reaches b.
	for run := range etcdFaultRuns(t) {
		e.stop(syscall.SIGKILL)
		more := chainKeys(t, uint32(100+run), 2)
		putChain(t, ca, more)
		e.start()
		restarted := time.Now()
		eventually.True(t, fmt.Sprintf("run %d: b to see what a put while etcd was dead", run), 5*time.Second, func() bool {
			holders, err := cb.Route(ctx, "acme", "llama3-8b", more)
			return err == nil && len(holders) == 2 && len(holders[1]) > 0 && e.epoch("freeze-a") != 0
		})
		t.Logf("kill %d: a's blocks put while etcd was dead reached b %v after etcd restarted (epoch %x → %x)",
			run, time.Since(restarted).Round(time.Millisecond), epoch, e.epoch("freeze-a"))
		epoch = e.epoch("freeze-a")
	}
}
