// Package test holds end-to-end tests that run the kvpool binary as
// operators do: a separate serve process, the CLI in other processes, and
// grpcurl against it. Nothing imports this package.
package test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
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
	binPath   string
	buildErr  error
)

// kvpoolBin builds the kvpool binary once per test run, with the race
// detector when the tests have it (the build then reuses the test build's
// cache).
func kvpoolBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvpool-e2e-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "kvpool")
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

// server is a `kvpool serve` child process.
type server struct {
	cmd     *exec.Cmd
	addr    string
	metrics string
	shm     string
	etcd    string // the embedded etcd's client URL, when it started one
	done    chan error
}

// startServe runs `kvpool serve` with extra args and waits until it logs
// its addresses.
func startServe(t *testing.T, extra ...string) *server {
	t.Helper()
	bin := kvpoolBin(t)
	dir := t.TempDir()
	s := &server{shm: filepath.Join(dir, "shm.sock"), done: make(chan error, 1)}
	args := []string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--node-id", "e2e-" + strings.ReplaceAll(t.Name(), "/", "-"),
		"--shm-socket", s.shm, "--log-format", "json", "--embedded-etcd-listen", "127.0.0.1:0", "--data-dir", filepath.Join(dir, "etcd")}
	args = append(args, extra...)
	s.cmd = exec.Command(bin, args...)
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
			r := mustOK(t, kv(t, nil, append([]string{"put", "--key", k, "--file", file, "--json"}, p...)...))
			var put map[string]any
			if err := json.Unmarshal([]byte(r.stdout), &put); err != nil || put["existed"] != false || put["path"] != path {
				t.Fatalf("put --json: %v %s", err, r.stdout)
			}
			r = mustOK(t, kv(t, nil, append([]string{"get", "--key", k}, p...)...))
			if !bytes.Equal([]byte(r.stdout), value) {
				t.Fatalf("get returned %d bytes that differ from the %d put", len(r.stdout), len(value))
			}
			// Put from stdin again: equal bytes, so it existed.
			r = mustOK(t, kv(t, value, append([]string{"put", "--key", k, "--json"}, p...)...))
			if !strings.Contains(r.stdout, `"existed": true`) {
				t.Fatalf("re-put: %s", r.stdout)
			}
			other := append([]byte{}, value...)
			other[0] ^= 1
			r = kv(t, other, append([]string{"put", "--key", k}, p...)...)
			if r.code != 1 || !strings.Contains(r.stderr, "different bytes") {
				t.Fatalf("overwrite with different bytes: exit %d, stderr %q", r.code, r.stderr)
			}
		})
	}
	r := mustOK(t, kv(t, nil, append([]string{"locate", "--keys", "block-shm,block-data,block-grpc,block-none", "--json"}, base...)...))
	if !strings.Contains(r.stdout, `"prefix_blocks": 3`) {
		t.Fatalf("locate: %s", r.stdout)
	}
	r = mustOK(t, kv(t, nil, append([]string{"exists", "--keys", "block-none,block-data"}, base...)...))
	if r.stdout != "\"block-none\"\tfalse\n\"block-data\"\ttrue\n" {
		t.Fatalf("exists: %q", r.stdout)
	}
	r = mustOK(t, kv(t, nil, "stats", "--server", s.addr, "--json"))
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st["blocks"] != float64(3) {
		t.Fatalf("stats --json: %v %s", err, r.stdout)
	}
	mustOK(t, kv(t, nil, append([]string{"remove", "--key", "block-data"}, base...)...))
	r = kv(t, nil, append([]string{"get", "--key", "block-data"}, base...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("get after remove: exit %d, stderr %q", r.code, r.stderr)
	}
	// Hex keys.
	mustOK(t, kv(t, []byte("x"), append([]string{"put", "--hex", "--key", "00ff10"}, base...)...))
	r = mustOK(t, kv(t, nil, append([]string{"get", "--hex", "--key", "00ff10", "--json"}, base...)...))
	if !strings.Contains(r.stdout, `"value_base64": "eA=="`) {
		t.Fatalf("get --json: %s", r.stdout)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	s := startServe(t, "--capacity", "16MiB")
	mustOK(t, kv(t, []byte("some kv bytes"), "put", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k"))
	get := func(path string) string {
		resp, err := http.Get("http://" + s.metrics + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %s", path, resp.Status)
		}
		return string(b)
	}
	m := get("/metrics")
	for _, want := range []string{"kvpool_pool_blocks 1", "kvpool_pool_stored_bytes 13", "kvpool_pool_capacity_bytes 1.6777216e+07",
		"kvpool_pool_external_fragmentation_ratio", `kvpool_pool_requests_total{code="OK",op=`, "go_gc_duration_seconds"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if get("/healthz") != "ok\n" || get("/readyz") != "ready\n" {
		t.Error("health endpoints")
	}
}

func TestGRPCurl(t *testing.T) {
	grpcurl := requireTool(t, "grpcurl")
	s := startServe(t, "--capacity", "16MiB")
	mustOK(t, kv(t, []byte("v"), "put", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k1"))
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

func TestBadFlagsAreUsageErrors(t *testing.T) {
	cases := [][]string{
		{"frobnicate"},
		{"serve"}, // no capacity
		{"serve", "--capacity", "12XB"},
		{"serve", "--capacity", "1GiB", "--log-level", "loud"},
		{"put", "--tenant", "t", "--namespace", "n"}, // no key
		{"put", "--tenant", "a/b", "--namespace", "n", "--key", "k"},
		{"get", "--tenant", "t", "--namespace", "n", "--key", "zz", "--hex"},
		{"locate", "--tenant", "t", "--namespace", "n"}, // no keys
		{"bench", "--op", "delete"},
		{"bench", "--path", "carrier-pigeon"},
		{"get", "--bogus-flag"},
		{"chain", "--block-tokens", "0"},
	}
	for _, args := range cases {
		r := kv(t, nil, args...)
		if r.code != 2 || r.stderr == "" {
			t.Errorf("kvpool %v: exit %d, stderr %q; want exit 2 with a message", args, r.code, r.stderr)
		}
	}
	r := kv(t, nil, "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "serve") {
		t.Errorf("--help: exit %d, %q", r.code, r.stdout)
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "node.yaml")
	os.WriteFile(good, []byte("capacity: 32MiB\npage_size: 8KiB\nmax_block_size: 4MiB\nreservation_timeout: 10s\n"+
		"transport: grpc\ntransfer_conns: 3\nfetch_timeout: 2s\nlink_seed_rate: 100MB\n"+
		"default_policy: fifo\nhigh_watermark: 0.8\nlow_watermark: 0.6\nlease_default: 5s\nlease_max: 30s\n"), 0o644)
	s := startServe(t, "--config", good)
	r := mustOK(t, kv(t, nil, "stats", "--server", s.addr, "--json"))
	if !strings.Contains(r.stdout, `"capacity_bytes": 33554432`) || !strings.Contains(r.stdout, `"page_bytes": 8192`) {
		t.Fatalf("config not applied: %s", r.stdout)
	}
	r = mustOK(t, kv(t, nil, "admin", "links", "--server", s.addr, "--json"))
	if !strings.Contains(r.stdout, `"transport": "grpc"`) {
		t.Fatalf("transport from the config file not applied: %s", r.stdout)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("capacity: 32MiB\ncapacty_typo: 1\n"), 0o644)
	if r := kv(t, nil, "serve", "--config", bad); r.code != 2 || !strings.Contains(r.stderr, "capacty_typo") {
		t.Fatalf("unknown config key: exit %d, %q", r.code, r.stderr)
	}
	// Every bad transfer setting is reported, all at once.
	if r := kv(t, nil, "serve", "--capacity", "32MiB", "--transport", "rdma", "--transfer-conns", "65", "--fetch-timeout", "-1s"); r.code != 2 ||
		!strings.Contains(r.stderr, `transport "rdma"`) || !strings.Contains(r.stderr, "transfer connections 65") || !strings.Contains(r.stderr, "fetch timeout") ||
		strings.Contains(r.stderr, "etcd") {
		t.Fatalf("bad transfer flags: exit %d, %q", r.code, r.stderr)
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

func TestDemo(t *testing.T) {
	r := mustOK(t, kv(t, nil, "demo"))
	for _, want := range []string{"3 daemons up", "node-0  12", "node-1  6", "node-2  3", "deepest prefix: 12 blocks on node-0",
		"every byte checked", "=> fetch wins: node-2", "=> recompute wins: node-2", "3 (3 alive in gossip)", "demo ok"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestBenchSmoke(t *testing.T) {
	for _, args := range [][]string{
		{"--op", "get", "--clients", "2", "--block-size", "256KiB"},
		{"--op", "put", "--clients", "1", "--block-size", "1MiB"},
		{"--op", "get", "--path", "shm", "--block-size", "1MiB"},
	} {
		r := mustOK(t, kv(t, nil, append([]string{"bench", "--duration", "300ms", "--working-set", "8MiB", "--capacity", "64MiB", "--json"}, args...)...))
		var res map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatalf("bench %v: %v\n%s", args, err, r.stdout)
		}
		for _, f := range []string{"op", "block_bytes", "clients", "gbps", "ops_per_s", "p50_ms", "p99_ms", "baseline_gbps", "ratio_to_baseline"} {
			if _, ok := res[f]; !ok {
				t.Errorf("bench %v JSON lacks %q", args, f)
			}
		}
		if res["gbps"].(float64) <= 0 || res["baseline_gbps"].(float64) <= 0 {
			t.Errorf("bench %v measured nothing: %s", args, r.stdout)
		}
		if !strings.Contains(r.stderr, "100%") {
			t.Errorf("bench %v drew no progress bar on stderr: %q", args, r.stderr)
		}
	}
}

func TestAdminCLI(t *testing.T) {
	a := startServe(t, "--capacity", "32MiB")
	if a.etcd == "" {
		t.Fatal("the first daemon did not report its embedded etcd")
	}
	b := startServe(t, "--capacity", "32MiB", "--node-id", "e2e-second", "--etcd-endpoints", a.etcd, "--zone", "rack-b")
	// Store a chain computed from tokens on b.
	tokens := filepath.Join(t.TempDir(), "prompt.txt")
	os.WriteFile(tokens, []byte("1 2 3 4 5 6 7 8 9 10 11 12 13 14"), 0o644)
	r := mustOK(t, kv(t, nil, "chain", "--tokens-file", tokens, "--block-tokens", "4", "--csv"))
	keys := strings.Split(strings.TrimSpace(r.stdout), ",")
	if len(keys) != 3 {
		t.Fatalf("chain: %q", r.stdout)
	}
	for _, k := range keys[:2] {
		mustOK(t, kv(t, []byte("kv bytes"), "put", "--server", b.addr, "--tenant", "acme", "--namespace", "m", "--hex", "--key", k))
	}
	// Ask a (not b) where they are, by tokens and by keys.
	var loc map[string]any
	deadline := time.Now().Add(20 * time.Second)
	for {
		r = mustOK(t, kv(t, nil, "admin", "locate", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--tokens-file", tokens, "--block-tokens", "4", "--json"))
		json.Unmarshal([]byte(r.stdout), &loc)
		if loc["deepest_blocks"] == float64(2) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin locate never saw the chain: %s", r.stdout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if loc["chain_blocks"] != float64(3) || fmt.Sprint(loc["deepest_nodes"]) != "[e2e-second]" || loc["pool_prefix_blocks"] != float64(2) {
		t.Fatalf("admin locate --json: %s", r.stdout)
	}
	r = mustOK(t, kv(t, nil, "admin", "locate", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--hex", "--keys", strings.Join(keys, ",")))
	if !strings.Contains(r.stdout, "e2e-second") || !strings.Contains(r.stdout, "deepest prefix: 2 blocks on e2e-second") {
		t.Fatalf("admin locate table: %s", r.stdout)
	}
	r = mustOK(t, kv(t, nil, "admin", "blocks", "--server", a.addr, "--node", "e2e-second", "--json"))
	if !strings.Contains(r.stdout, keys[0]) || !strings.Contains(r.stdout, `"total": 2`) {
		t.Fatalf("admin blocks: %s", r.stdout)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		r = mustOK(t, kv(t, nil, "admin", "nodes", "--server", a.addr, "--json"))
		if strings.Count(r.stdout, `"gossip_state": "alive"`) == 2 && strings.Count(r.stdout, `"etcd_state": "registered"`) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin nodes never showed both nodes alive: %s", r.stdout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r = mustOK(t, kv(t, nil, "admin", "nodes", "--server", b.addr))
	if !strings.Contains(r.stdout, "GOSSIP") || !strings.Contains(r.stdout, "rack-b") {
		t.Fatalf("admin nodes table: %s", r.stdout)
	}
	r = mustOK(t, kv(t, nil, "admin", "stats", "--server", a.addr, "--json"))
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st["nodes"] != float64(2) || st["mirror_blocks"] != float64(2) {
		t.Fatalf("admin stats: %v %s", err, r.stdout)
	}
	mustOK(t, kv(t, nil, "admin", "stats", "--server", a.addr))
	// Bad admin flags are usage errors.
	for _, args := range [][]string{
		{"admin"},
		{"admin", "locate", "--server", a.addr},
		{"admin", "locate", "--server", a.addr, "--tenant", "acme", "--namespace", "m"},
		{"admin", "locate", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--keys", "a", "--tokens-file", tokens},
		{"admin", "locate", "--server", a.addr, "--tenant", "a b", "--namespace", "m", "--keys", "a"},
		{"admin", "locate", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--tokens-file", tokens, "--block-tokens", "0"},
		{"admin", "blocks", "--server", a.addr},
		{"admin", "nodes", "--bogus"},
		{"admin", "frobnicate"},
	} {
		if r := kv(t, nil, args...); r.code != 2 || r.stderr == "" {
			t.Errorf("kvpool %v: exit %d, stderr %q; want exit 2", args, r.code, r.stderr)
		}
	}
	// A node that does not exist is an error, not a usage error.
	if r := kv(t, nil, "admin", "blocks", "--server", a.addr, "--node", "ghost"); r.code != 1 || !strings.Contains(r.stderr, "no node") {
		t.Errorf("blocks of a ghost node: exit %d, %q", r.code, r.stderr)
	}
}
