// Package test holds the tests that need more than one package or more
// than one process: in-process clusters (test/cluster) with their fault
// tests and benchmarks, and end-to-end tests that run the kvpool binary as
// operators do, a separate node serve process with the CLI and grpcurl in
// other processes. The CLI's flags, exit codes and outputs are tested in
// process, in cmd/kvpool. Nothing imports this package.
package test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binDir    string // removed by TestMain
	binPath   string
	buildErr  error
)

// kvpoolBin builds the kvpool binary once per test run, with the race
// detector when the tests have it (the build then reuses the test build's
// cache).
func kvpoolBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		var err error
		if binDir, err = os.MkdirTemp("", "kvpool-e2e-"); err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(binDir, "kvpool")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "github.com/kvpool/kvpool/cmd/kvpool")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// requireTool finds an external tool; CI sets KVPOOL_REQUIRE_TOOLS so a
// missing tool fails there instead of skipping.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	for _, dir := range []string{filepath.Join(os.Getenv("HOME"), "go", "bin"), "/usr/sbin", "/usr/local/bin"} {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	if os.Getenv("KVPOOL_REQUIRE_TOOLS") != "" {
		t.Fatalf("%s is not installed (KVPOOL_REQUIRE_TOOLS is set)", name)
	}
	t.Skipf("%s is not installed", name)
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// server is a `kvpool node serve` child process.
type server struct {
	cmd     *exec.Cmd
	addr    string
	metrics string
	shm     string
	etcd    string // the embedded etcd's client URL, when it started one
	done    chan error
}

// startServe runs `kvpool node serve` with extra args and waits until it
// logs its addresses.
func startServe(t *testing.T, extra ...string) *server {
	t.Helper()
	return startServeCmd(t, exec.Command, extra...)
}

// startServeCmd is startServe with the process made by command (a shell
// that sets limits first, for instance).
func startServeCmd(t *testing.T, command func(bin string, args ...string) *exec.Cmd, extra ...string) *server {
	t.Helper()
	return startServeBin(t, kvpoolBin(t), command, extra...)
}

// startServeBin is startServeCmd with the kvpool binary at bin (another
// version's, for instance).
func startServeBin(t *testing.T, bin string, command func(bin string, args ...string) *exec.Cmd, extra ...string) *server {
	t.Helper()
	dir := t.TempDir()
	s := &server{shm: filepath.Join(dir, "shm.sock"), done: make(chan error, 1)}
	args := []string{"node", "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--node-id", "e2e-" + strings.ReplaceAll(t.Name(), "/", "-"),
		"--shm-socket", s.shm, "--log-format", "json", "--embedded-etcd-listen", "127.0.0.1:0", "--etcd-data-dir", filepath.Join(dir, "etcd")}
	args = append(args, extra...)
	s.cmd = command(bin, args...)
	stderr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	ready := make(chan error, 1)
	go func() {
		found := false
		for lines.Scan() {
			var rec map[string]any
			if json.Unmarshal(lines.Bytes(), &rec) == nil && rec["msg"] == "embedded etcd serving" {
				s.etcd, _ = rec["client_url"].(string)
			}
			if json.Unmarshal(lines.Bytes(), &rec) == nil && rec["msg"] == "kvpool node starting" && !found {
				s.addr, _ = rec["listen"].(string)
				s.metrics, _ = rec["metrics"].(string)
				found = true
				ready <- nil
			}
			if testing.Verbose() {
				t.Logf("serve: %s", lines.Text())
			}
		}
		if !found {
			ready <- errors.New("serve exited before it was ready")
		}
	}()
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() {
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			s.cmd.Process.Kill()
			t.Error("serve did not stop within 10 s of SIGTERM")
		}
	})
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start within 30 s")
	}
	return s
}

type result struct {
	stdout, stderr string
	code           int
}

// kv runs the CLI with args and stdin.
func kv(t *testing.T, stdin []byte, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kvpoolBin(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{out.String(), errb.String(), code}
}

func mustOK(t *testing.T, r result) result {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	return r
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// A node serve process and CLI processes: every path between two
// processes, the shared-memory one through the mapped segment.
func TestServeAndCLI(t *testing.T) {
	s := startServe(t, "--capacity", "64MiB")
	value := randomBytes(3<<20 + 11)
	file := filepath.Join(t.TempDir(), "v.bin")
	if err := os.WriteFile(file, value, 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--server", s.addr, "--tenant", "acme", "--namespace", "llama3-8b"}
	for _, path := range []string{"shm", "data", "grpc"} {
		t.Run(path, func(t *testing.T) {
			p := append(append([]string{}, base...), "--path", path)
			k := "block-" + path
			r := mustOK(t, kv(t, nil, append([]string{"block", "put", "--key", k, "--file", file, "--json"}, p...)...))
			var put map[string]any
			if err := json.Unmarshal([]byte(r.stdout), &put); err != nil || put["existed"] != false || put["path"] != path {
				t.Fatalf("put --json: %v %s", err, r.stdout)
			}
			r = mustOK(t, kv(t, nil, append([]string{"block", "get", "--key", k}, p...)...))
			if !bytes.Equal([]byte(r.stdout), value) {
				t.Fatalf("get returned %d bytes that differ from the %d put", len(r.stdout), len(value))
			}
			// Put from stdin again: equal bytes, so it existed.
			r = mustOK(t, kv(t, value, append([]string{"block", "put", "--key", k, "--json"}, p...)...))
			if !strings.Contains(r.stdout, `"existed": true`) {
				t.Fatalf("re-put: %s", r.stdout)
			}
			other := append([]byte{}, value...)
			other[0] ^= 1
			r = kv(t, other, append([]string{"block", "put", "--key", k}, p...)...)
			if r.code != 1 || !strings.Contains(r.stderr, "different bytes") {
				t.Fatalf("overwrite with different bytes: exit %d, stderr %q", r.code, r.stderr)
			}
		})
	}
	r := mustOK(t, kv(t, nil, append([]string{"block", "locate", "--keys", "block-shm,block-data,block-grpc,block-none", "--json"}, base...)...))
	if !strings.Contains(r.stdout, `"prefix_blocks": 3`) {
		t.Fatalf("locate: %s", r.stdout)
	}
	r = mustOK(t, kv(t, nil, append([]string{"block", "exists", "--keys", "block-none,block-data"}, base...)...))
	if r.stdout != "\"block-none\"\tfalse\n\"block-data\"\ttrue\n" {
		t.Fatalf("exists: %q", r.stdout)
	}
	r = mustOK(t, kv(t, nil, "node", "stats", "--server", s.addr, "--json"))
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st["blocks"] != float64(3) {
		t.Fatalf("stats --json: %v %s", err, r.stdout)
	}
	mustOK(t, kv(t, nil, append([]string{"block", "remove", "--key", "block-data"}, base...)...))
	r = kv(t, nil, append([]string{"block", "get", "--key", "block-data"}, base...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("get after remove: exit %d, stderr %q", r.code, r.stderr)
	}
	// Hex keys.
	mustOK(t, kv(t, []byte("x"), append([]string{"block", "put", "--hex", "--key", "00ff10"}, base...)...))
	r = mustOK(t, kv(t, nil, append([]string{"block", "get", "--hex", "--key", "00ff10", "--json"}, base...)...))
	if !strings.Contains(r.stdout, `"value_base64": "eA=="`) {
		t.Fatalf("get --json: %s", r.stdout)
	}
}

func TestGRPCurl(t *testing.T) {
	grpcurl := requireTool(t, "grpcurl")
	s := startServe(t, "--capacity", "16MiB")
	mustOK(t, kv(t, []byte("v"), "block", "put", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k1"))
	run := func(args ...string) string {
		out, err := exec.Command(grpcurl, append([]string{"-plaintext"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := run(s.addr, "list"); !strings.Contains(out, "kvpool.v1.KVPoolService") || !strings.Contains(out, "grpc.health.v1.Health") {
		t.Fatalf("grpcurl list: %s", out)
	}
	if out := run(s.addr, "describe", "kvpool.v1.KVPoolService.Locate"); !strings.Contains(out, "LocateRequest") {
		t.Fatalf("grpcurl describe: %s", out)
	}
	// "azE=" is base64 of "k1".
	if out := run("-d", `{"tenant":"t","namespace":"n","keys":["azE=","azI="]}`, s.addr, "kvpool.v1.KVPoolService/Locate"); !strings.Contains(out, `"prefixBlocks": 1`) {
		t.Fatalf("grpcurl Locate: %s", out)
	}
	if out := run("-d", `{"key":{"tenant":"t","namespace":"n","key":"azE="}}`, s.addr, "kvpool.v1.KVPoolService/Get"); !strings.Contains(out, `"chunk": "dg=="`) {
		t.Fatalf("grpcurl Get: %s", out)
	}
	if out := run(s.addr, "kvpool.v1.KVPoolService/Stats"); !strings.Contains(out, `"blocks": "1"`) {
		t.Fatalf("grpcurl Stats: %s", out)
	}
	if out := run(s.addr, "grpc.health.v1.Health/Check"); !strings.Contains(out, "SERVING") {
		t.Fatalf("grpcurl health: %s", out)
	}
}

func TestGracefulStop(t *testing.T) {
	s := startServe(t, "--capacity", "16MiB")
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		if err != nil {
			t.Fatalf("serve exited with %v after SIGTERM, want 0", err)
		}
		s.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
}
