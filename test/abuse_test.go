package test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvpool/kvpool/internal/eventually"
)

// A node out of file descriptors sheds connections and keeps serving: it
// used to exit with status 1 at the first EMFILE from accept. Idle
// connections that never send a preamble are closed at the io timeout,
// which gives the descriptors back.
func TestServeSurvivesFileDescriptorExhaustion(t *testing.T) {
	const limit = 64
	s := startServeCmd(t, func(bin string, args ...string) *exec.Cmd {
		return exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, limit), bin}, args...)...)
	}, "--standalone", "--capacity", "16MiB", "--io-timeout", "1s")
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 4 * limit {
		c, err := net.Dial("tcp", s.addr)
		if err != nil {
			break // the backlog is full: the kernel refuses for the node
		}
		idle = append(idle, c)
	}
	alive := func() {
		select {
		case err := <-s.done:
			t.Fatalf("the node exited while out of descriptors: %v", err)
		default:
		}
	}
	eventually.True(t, "the node to count failed accepts and answer a scrape", 30*time.Second, func() bool {
		alive()
		n, ok := metricValue(s.metrics, `kvpool_pool_accept_errors_total{door="tcp"}`)
		return ok && n > 0
	})
	refused, _ := metricValue(s.metrics, `kvpool_pool_accept_errors_total{door="tcp"}`)
	t.Logf("%d idle connections opened against a %d-descriptor limit; %.0f accepts failed and were retried", len(idle), limit, refused)
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	value := randomBytes(100_000)
	file := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(file, value, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "a put to succeed once the idle connections are gone", 30*time.Second, func() bool {
		alive()
		return kv(t, nil, "block", "put", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k", "--file", file).code == 0
	})
	got := mustOK(t, kv(t, nil, "block", "get", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k"))
	if got.stdout != string(value) {
		t.Fatal("the block read back differs")
	}
	alive()
}

// kill -9 leaves a --segment-path file behind; the node restarted on the
// same path starts (it used to refuse: "file exists") and serves.
func TestRestartAfterKillWithSegmentPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "arena")
	args := []string{"--standalone", "--capacity", "16MiB", "--segment-path", path}
	first := startServe(t, args...)
	first.cmd.Process.Kill()
	first.done <- <-first.done // wait for the exit, and leave it for the cleanup
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the killed node's segment file: %v (the test needs it left behind)", err)
	}
	second := startServe(t, args...)
	mustOK(t, kv(t, []byte("value"), "block", "put", "--server", second.addr, "--tenant", "t", "--namespace", "n", "--key", "k"))
	if got := mustOK(t, kv(t, nil, "block", "get", "--server", second.addr, "--tenant", "t", "--namespace", "n", "--key", "k")); got.stdout != "value" {
		t.Fatalf("read back %q", got.stdout)
	}
}
