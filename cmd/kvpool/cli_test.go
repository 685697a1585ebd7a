package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/admin"
	"github.com/kvpool/kvpool/internal/eventually"
)

func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "prompt.txt")
	os.WriteFile(tokens, []byte("1 2 3 4 5 6 7 8"), 0o644)
	for _, args := range [][]string{
		{"frobnicate"},
		{"node"},
		{"node", "frobnicate"},
		{"node", "serve"}, // no capacity
		{"node", "serve", "--capacity", "12XB"},
		{"node", "serve", "--capacity", "1GiB", "--log-level", "loud"},
		{"node", "serve", "--capacity", "1GiB", "extra-argument"},
		{"block", "put", "--tenant", "t", "--namespace", "n"}, // no key
		{"block", "put", "--tenant", "a/b", "--namespace", "n", "--key", "k"},
		{"block", "get", "--tenant", "t", "--namespace", "n", "--key", "zz", "--hex"},
		{"block", "get", "--bogus-flag"},
		{"block", "locate", "--tenant", "t", "--namespace", "n"}, // no keys
		{"block", "fetch", "--tenant", "t", "--namespace", "n", "--keys", "a", "--dir", dir},
		{"node", "bench", "--op", "delete"},
		{"node", "bench", "--path", "carrier-pigeon"},
		// The node's arena is the other process's to place.
		{"node", "bench", "--path", "data", "--server", "127.0.0.1:1", "--segment-path", "/dev/shm/kvpool-nowhere"},
		{"chain"},
		{"chain", "keys", "--block-tokens", "0"},
		{"chain", "plan", "--tokens", "0"},
		{"cluster"},
		{"cluster", "frobnicate"},
		{"cluster", "locate"},
		{"cluster", "locate", "--tenant", "acme", "--namespace", "m"},
		{"cluster", "locate", "--tenant", "acme", "--namespace", "m", "--keys", "a", "--tokens-file", tokens},
		{"cluster", "locate", "--tenant", "a b", "--namespace", "m", "--keys", "a"},
		{"cluster", "locate", "--tenant", "acme", "--namespace", "m", "--tokens-file", tokens, "--block-tokens", "0"},
		{"cluster", "blocks"},
		{"cluster", "nodes", "--bogus"},
		{"policy", "set", "--tenant", "acme"},
		{"policy", "get"},
		// The previous release's names, with the same mistakes.
		{"serve"},
		{"put", "--tenant", "t", "--namespace", "n"},
		{"chain", "--block-tokens", "0"},
		{"admin"},
		{"admin", "frobnicate"},
		{"admin", "blocks"},
	} {
		r := kv(t, nil, args...)
		if r.code != 2 || r.stderr == "" || r.stdout != "" {
			t.Errorf("kvpool %v: exit %d, stdout %q, stderr %q; want exit 2 with a message on stderr", args, r.code, r.stdout, r.stderr)
		}
	}
}

func TestHelp(t *testing.T) {
	r := mustOK(t, kv(t, nil, "--help"))
	for _, noun := range []string{"node", "block", "chain", "cluster", "policy"} {
		if !strings.Contains(r.stdout, noun) {
			t.Errorf("--help does not list %q:\n%s", noun, r.stdout)
		}
	}
	for _, old := range []string{"  put ", "  admin ", "  serve "} {
		if strings.Contains(r.stdout, old) {
			t.Errorf("--help lists the hidden alias %q", old)
		}
	}
	for _, args := range [][]string{{"node", "serve", "--help"}, {"block", "--help"}, {"chain", "plan", "--help"}, {"cluster", "demo", "--help"}, {"policy", "set", "--help"}} {
		if r := kv(t, nil, args...); r.code != 0 || !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("kvpool %v: exit %d, %q", args, r.code, r.stdout)
		}
	}
}

// Every setting of node serve is a flag and a config file key, from the
// one table; the table names every flag.
func TestSettingsTable(t *testing.T) {
	c := nodeServeCmd(&env{stdout: io.Discard, stderr: io.Discard})
	var names []string
	for _, s := range settings {
		if c.Flags().Lookup(s.name) == nil {
			t.Errorf("setting %q has no flag", s.name)
		}
		if slices.Contains(names, s.name) {
			t.Errorf("setting %q twice", s.name)
		}
		names = append(names, s.name)
	}
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name != "config" && f.Name != "check-config" && f.Name != "help" && !slices.Contains(names, f.Name) {
			t.Errorf("flag --%s is not in the settings table", f.Name)
		}
	})
	// A config file may set every one of them.
	var yaml strings.Builder
	for _, s := range settings {
		v := c.Flags().Lookup(s.name).DefValue
		if strings.HasPrefix(v, "[") {
			fmt.Fprintf(&yaml, "%s: []\n", fileKey(s.name))
			continue
		}
		fmt.Fprintf(&yaml, "%s: %q\n", fileKey(s.name), v)
	}
	file := filepath.Join(t.TempDir(), "all.yaml")
	os.WriteFile(file, []byte(yaml.String()), 0o644)
	cfg, o := serveDefaults()
	var errs []error
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	settingFlags(fs, &cfg, &o, &errs)
	if err := applyFile(fs, file, &o); err != nil || len(errs) > 0 {
		t.Fatalf("a file of every default: %v %v\n%s", err, errs, yaml.String())
	}
}

// A node's refusal is exit 1 with the node's message, never a usage error,
// even when it is InvalidArgument.
func TestNodeErrorsAreNotUsageErrors(t *testing.T) {
	s := serve(t, "--capacity", "16MiB", "--standalone")
	r := kv(t, nil, "chain", "plan", "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--keys", "k0", "--model", "gpt-9")
	if r.code != 1 || !strings.Contains(r.stderr, "gpt-9") || !strings.Contains(r.stderr, "invalid argument") || strings.Contains(r.stderr, "--help") {
		t.Errorf("the node's InvalidArgument: exit %d, stderr %q; want exit 1 with its message", r.code, r.stderr)
	}
	r = kv(t, nil, "block", "get", "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--key", "none")
	if r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("a missing block: exit %d, stderr %q", r.code, r.stderr)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestBlockCommands(t *testing.T) {
	s := serve(t, "--capacity", "64MiB", "--standalone")
	value := randomBytes(3<<20 + 11)
	file := filepath.Join(t.TempDir(), "v.bin")
	os.WriteFile(file, value, 0o644)
	base := []string{"--server", s.addr, "--tenant", "acme", "--namespace", "llama3-8b"}
	with := func(verb string, args ...string) []string {
		return append(append([]string{"block", verb}, args...), base...)
	}
	for _, path := range []string{"shm", "data", "grpc"} {
		t.Run(path, func(t *testing.T) {
			k := "block-" + path
			var put putJSON
			decode(t, mustOK(t, kv(t, nil, with("put", "--key", k, "--file", file, "--json", "--path", path)...)), &put)
			if put.Existed || put.Path != path || put.Bytes != len(value) {
				t.Fatalf("put --json: %+v", put)
			}
			if r := mustOK(t, kv(t, nil, with("get", "--key", k, "--path", path)...)); !bytes.Equal([]byte(r.stdout), value) {
				t.Fatalf("get returned %d bytes that differ from the %d put", len(r.stdout), len(value))
			}
			decode(t, mustOK(t, kv(t, value, with("put", "--key", k, "--json", "--path", path)...)), &put)
			if !put.Existed {
				t.Fatalf("re-put of equal bytes: %+v", put)
			}
			other := bytes.Clone(value)
			other[0] ^= 1
			if r := kv(t, other, with("put", "--key", k, "--path", path)...); r.code != 1 || !strings.Contains(r.stderr, "different bytes") {
				t.Fatalf("overwrite with different bytes: exit %d, stderr %q", r.code, r.stderr)
			}
		})
	}
	var loc locateJSON
	decode(t, mustOK(t, kv(t, nil, with("locate", "--keys", "block-shm,block-data,block-grpc,block-none", "--json")...)), &loc)
	if loc.PrefixBlocks != 3 || loc.ChainBlocks != 4 || loc.LeaseUntil != "" {
		t.Fatalf("locate: %+v", loc)
	}
	decode(t, mustOK(t, kv(t, nil, with("locate", "--keys", "block-shm", "--lease", "--json")...)), &loc)
	if until, err := time.Parse(time.RFC3339Nano, loc.LeaseUntil); err != nil || time.Until(until) < 5*time.Second {
		t.Fatalf("locate --lease: %+v %v", loc, err)
	}
	if r := kv(t, nil, with("remove", "--key", "block-shm")...); r.code != 1 || !strings.Contains(r.stderr, "lease") {
		t.Fatalf("remove of a leased block: exit %d, %q", r.code, r.stderr)
	}
	mustOK(t, kv(t, nil, with("remove", "--key", "block-shm", "--force")...))
	if r := mustOK(t, kv(t, nil, with("exists", "--keys", "block-none,block-data")...)); r.stdout != "\"block-none\"\tfalse\n\"block-data\"\ttrue\n" {
		t.Fatalf("exists: %q", r.stdout)
	}
	var st api.NodeStats
	decode(t, mustOK(t, kv(t, nil, "node", "stats", "--server", s.addr, "--json")), &st)
	if st.Blocks != 2 || st.CapacityBytes != 64<<20 || len(st.Namespaces) != 1 || len(st.Tenants) != 1 {
		t.Fatalf("node stats --json: %+v", st)
	}
	var rm removeJSON
	decode(t, mustOK(t, kv(t, nil, with("remove", "--key", "block-data", "--json")...)), &rm)
	if !rm.Removed {
		t.Fatalf("remove --json: %+v", rm)
	}
	// Hex keys.
	mustOK(t, kv(t, []byte("x"), with("put", "--hex", "--key", "00ff10")...))
	var got getJSON
	decode(t, mustOK(t, kv(t, nil, with("get", "--hex", "--key", "00ff10", "--json")...)), &got)
	if got.ValueBase64 != "eA==" || got.Key != "00ff10" || got.Bytes != 1 {
		t.Fatalf("get --json: %+v", got)
	}
	// The previous release's verbs still work, and say what they are now.
	r := mustOK(t, kv(t, nil, append([]string{"get", "--hex", "--key", "00ff10"}, base...)...))
	if r.stdout != "x" || !strings.Contains(r.stderr, `is now "kvpool block get"`) {
		t.Fatalf("old get: %q, %q", r.stdout, r.stderr)
	}
	if r := mustOK(t, kv(t, nil, "stats", "--server", s.addr)); !strings.Contains(r.stdout, "capacity") || !strings.Contains(r.stderr, "node stats") {
		t.Fatalf("old stats: %q, %q", r.stdout, r.stderr)
	}
}

func TestChainKeys(t *testing.T) {
	var out chainKeysJSON
	decode(t, mustOK(t, kv(t, []byte("1 2 3 4 5 6 7 8 9"), "chain", "keys", "--block-tokens", "4", "--json")), &out)
	if len(out.Keys) != 2 || out.Tokens != 9 || out.Scheme != "sha256_cbor" {
		t.Fatalf("chain keys --json: %+v", out)
	}
	r := mustOK(t, kv(t, []byte("1 2 3 4 5 6 7 8 9"), "chain", "--block-tokens", "4", "--csv"))
	if strings.TrimSpace(r.stdout) != strings.Join(out.Keys, ",") || !strings.Contains(r.stderr, "chain keys") {
		t.Fatalf("chain with flags (the old form): %q, %q", r.stdout, r.stderr)
	}
	if r := kv(t, []byte("1 x 3"), "chain", "keys"); r.code != 2 || !strings.Contains(r.stderr, `"x"`) {
		t.Fatalf("a bad token: exit %d, %q", r.code, r.stderr)
	}
}

func near(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

// chain plan from profiles alone reproduces the H200 anchors' B* and
// computes fetch and recompute times at a given link speed.
func TestPlanFromProfiles(t *testing.T) {
	plan := func(args ...string) offlinePlanJSON {
		t.Helper()
		var out offlinePlanJSON
		decode(t, mustOK(t, kv(t, nil, append([]string{"chain", "plan", "--json"}, args...)...)), &out)
		return out
	}
	for _, tc := range []struct {
		model string
		gbps  float64
	}{{"llama3-8b", 4.68}, {"llama3-70b", 1.39}} {
		out := plan("--model", tc.model, "--tokens", "4096", "--accelerator", "h200")
		if !near(out.BreakevenGBps, tc.gbps, 0.05) || out.KVBytesPerToken == 0 || out.PrefillTokensPerSecond == 0 || out.RecomputeMs == 0 {
			t.Errorf("%s: %+v, want breakeven %v ± 5%%", tc.model, out, tc.gbps)
		}
		if out.LinkGBps != nil || out.Plan != "" {
			t.Errorf("%s: link fields without --link-gbps: %+v", tc.model, out)
		}
	}
	// 4096 tokens × 128 KiB = 512 MiB at 10 GB/s: 53.687 ms; recompute
	// at 35739 tokens/s: 114.609 ms.
	out := plan("--model", "llama3-8b", "--tokens", "4096", "--link-gbps", "10")
	if out.FetchMs == nil || !near(*out.FetchMs, 4096*131072/10e9*1e3, 1e-6) || !near(out.RecomputeMs, 4096.0/35739*1e3, 1e-6) {
		t.Errorf("fetch/recompute: %+v", out)
	}
	if out.Plan != "split" || out.KVBytesPerToken != 131072 {
		t.Errorf("at 10 GB/s: %+v", out)
	}
	// MLA with a given prefill speed: 70272 B/token × 10000 tokens/s.
	if out := plan("--model", "deepseek-v3", "--tokens", "2048", "--prefill-tps", "10000"); !near(out.BreakevenGBps, 0.70272, 1e-9) {
		t.Errorf("deepseek-v3: %+v", out)
	}
	// A profiles file adds a model and its curve; an anchor document
	// loads as curves.
	dir := t.TempDir()
	prof := filepath.Join(dir, "profiles.yaml")
	os.WriteFile(prof, []byte(`models:
- name: tiny
  layers: 2
  kv_heads: 1
  head_dim: 64
curves:
- model: tiny
  accelerator: l4
  points: [{tokens: 1000, tokens_per_s: 50000}]
`), 0o600)
	if out := plan("--profiles", prof, "--model", "tiny", "--accelerator", "l4", "--tokens", "1000"); out.KVBytesPerToken != 512 || !near(out.BreakevenGBps, 512*50000/1e9, 1e-9) {
		t.Errorf("tiny: %+v", out)
	}
	if out := plan("--profiles", "../../transfer/cost/testdata/gpu-anchor-h200.json", "--model", "llama3-70b", "--tokens", "16384"); !near(out.BreakevenGBps, 1.21, 0.01) {
		t.Errorf("anchor file: %+v", out)
	}
	for _, bad := range [][]string{
		{"--tokens", "0"},
		{"--tokens", "100", "--model", "gpt-9"},
		{"--tokens", "100", "--link-gbps", "-1"},
		{"--tokens", "100", "--cached-tokens", "200"},
		{"--tokens", "100", "--model", "deepseek-v3"}, // no curve
		{"--tokens", "100", "--profiles", filepath.Join(dir, "missing.yaml")},
	} {
		if r := kv(t, nil, append([]string{"chain", "plan"}, bad...)...); r.code != 2 || r.stderr == "" {
			t.Errorf("chain plan %v: exit %d, stderr %q; want 2 and a message", bad, r.code, r.stderr)
		}
	}
	// The old verb.
	if r := mustOK(t, kv(t, nil, "plan", "--model", "llama3-70b", "--tokens", "4096", "--link-gbps", "3")); !strings.Contains(r.stdout, "break-even B*       1.39 GB/s") {
		t.Errorf("plan (old verb): %s", r.stdout)
	}
}

// chain plan --server plans against a running daemon: the node's own
// prefix, its profiles (from flags and from its config file), the table
// and the JSON.
func TestPlanAgainstANode(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "profiles.yaml")
	os.WriteFile(prof, []byte(`curves:
- model: llama3-8b
  accelerator: l40s
  points: [{tokens: 1024, tokens_per_s: 12000}, {tokens: 8192, tokens_per_s: 10000}]
`), 0o600)
	s := serve(t, "--capacity", "64MiB", "--standalone", "--profiles", prof, "--accelerator", "l40s", "--block-tokens", "64")
	for _, k := range []string{"k0", "k1"} {
		mustOK(t, kv(t, []byte(strings.Repeat("x", 4096)), "block", "put", "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--key", k))
	}
	args := []string{"chain", "plan", "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--keys", "k0,k1,k2,k3", "--block-tokens", "64"}
	var out planJSON
	decode(t, mustOK(t, kv(t, nil, append(args, "--json")...)), &out)
	if len(out.Nodes) != 1 || out.PromptTokens != 256 || out.ReferenceAccelerator != "l40s" {
		t.Fatalf("plan: %+v", out)
	}
	// 2 of 4 blocks local; 128 more tokens at 12000 tokens/s.
	n := out.Nodes[0]
	if n.LocalBlocks != 2 || n.Plan != "recompute" || !near(n.RecomputeMs, 128.0/12000*1e3, 1e-6) || out.Winner != n.Node {
		t.Fatalf("node plan: %+v", n)
	}
	r := mustOK(t, kv(t, nil, args...))
	for _, want := range []string{"NODE", "QUEUE ms", "RECOMPUTE ms", "winner: " + n.Node} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, r.stdout)
		}
	}
	// Profile-only flags make no sense against a node.
	if r := kv(t, nil, "chain", "plan", "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--keys", "k0", "--tokens", "5"); r.code != 2 {
		t.Errorf("--tokens with --server: exit %d", r.code)
	}
	// The config file sets the node's model, accelerator and block size,
	// with an inline model and curve; a plan without them takes them.
	cfg := filepath.Join(dir, "node.yaml")
	os.WriteFile(cfg, []byte(`capacity: 32MiB
standalone: true
model: tiny
accelerator: l4
block_tokens: 32
models:
- {name: tiny, layers: 2, kv_heads: 1, head_dim: 64}
curves:
- {model: tiny, accelerator: l4, points: [{tokens: 1000, tokens_per_s: 50000}]}
`), 0o600)
	s2 := serve(t, "--config", cfg)
	decode(t, mustOK(t, kv(t, nil, "chain", "plan", "--server", s2.addr, "--tenant", "acme", "--namespace", "m", "--keys", "a,b", "--json")), &out)
	if out.Model != "tiny" || out.ReferenceAccelerator != "l4" || out.BlockTokens != 32 || out.KVBytesPerToken != 512 {
		t.Fatalf("config file profiles: %+v", out)
	}
	// A node whose accelerator has no curve for its model does not start.
	if r := kv(t, nil, "node", "serve", "--capacity", "64MiB", "--standalone", "--accelerator", "tpu-v9", "--listen", "127.0.0.1:0"); r.code != 2 || !strings.Contains(r.stderr, "tpu-v9") {
		t.Errorf("serve with an unknown accelerator: exit %d, %s", r.code, r.stderr)
	}
}

func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "node.yaml")
	os.WriteFile(good, []byte("capacity: 32MiB\npage_size: 8KiB\nmax_block_size: 4MiB\nreservation_timeout: 10s\nstandalone: true\n"+
		"transport: grpc\ntransfer_conns: 3\nfetch_timeout: 2s\nlink_seed_rate: 100MB\n"+
		"default_policy: fifo\nhigh_watermark: 0.8\nlow_watermark: 0.6\nlease_default: 5s\nlease_max: 30s\n"), 0o644)
	s := serve(t, "--config", good, "--page-size", "16KiB") // the command line wins
	var st api.NodeStats
	decode(t, mustOK(t, kv(t, nil, "node", "stats", "--server", s.addr, "--json")), &st)
	if st.CapacityBytes != 32<<20 || st.PageBytes != 16<<10 {
		t.Fatalf("config not applied: %+v", st)
	}
	var links admin.Links
	decode(t, mustOK(t, kv(t, nil, "cluster", "links", "--server", s.addr, "--json")), &links)
	if links.Transport != "grpc" {
		t.Fatalf("transport from the config file not applied: %+v", links)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("capacity: 32MiB\ncapacty_typo: 1\ntransport: rdma\n"), 0o644)
	if r := kv(t, nil, "node", "serve", "--config", bad); r.code != 2 || !strings.Contains(r.stderr, "capacty_typo") || !strings.Contains(r.stderr, "rdma") {
		t.Fatalf("unknown config key and bad value: exit %d, %q", r.code, r.stderr)
	}
	// Every bad setting is reported, all at once, before etcd starts.
	if r := kv(t, nil, "node", "serve", "--capacity", "32MiB", "--transport", "rdma", "--transfer-conns", "65", "--fetch-timeout", "-1s", "--transfer-send-buffer", "1KiB"); r.code != 2 ||
		!strings.Contains(r.stderr, `"rdma"`) || !strings.Contains(r.stderr, "transfer connections 65") || !strings.Contains(r.stderr, "fetch timeout") ||
		!strings.Contains(r.stderr, "transfer send buffer 1024 bytes") ||
		strings.Contains(r.stderr, "etcd") {
		t.Fatalf("bad transfer flags: exit %d, %q", r.code, r.stderr)
	}
}

func TestMetricsAndHealth(t *testing.T) {
	s := serve(t, "--capacity", "16MiB", "--standalone")
	mustOK(t, kv(t, []byte("some kv bytes"), "block", "put", "--server", s.addr, "--tenant", "t", "--namespace", "n", "--key", "k"))
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

// The cluster and policy commands against two daemons sharing the first
// one's embedded etcd.
func TestClusterAndPolicyCommands(t *testing.T) {
	a := serve(t, "--capacity", "32MiB")
	if a.etcd == "" {
		t.Fatal("the first daemon did not report its embedded etcd")
	}
	b := serve(t, "--capacity", "32MiB", "--node-id", "cmd-second", "--etcd-endpoints", a.etcd, "--zone", "rack-b")
	tokens := filepath.Join(t.TempDir(), "prompt.txt")
	os.WriteFile(tokens, []byte("1 2 3 4 5 6 7 8 9 10 11 12 13 14"), 0o644)
	keys := strings.Split(strings.TrimSpace(mustOK(t, kv(t, nil, "chain", "keys", "--tokens-file", tokens, "--block-tokens", "4", "--csv")).stdout), ",")
	if len(keys) != 3 {
		t.Fatalf("chain keys: %q", keys)
	}
	for _, k := range keys[:2] {
		mustOK(t, kv(t, []byte("kv bytes"), "block", "put", "--server", b.addr, "--tenant", "acme", "--namespace", "m", "--hex", "--key", k))
	}
	// Ask a (not b) where they are, by tokens and by keys.
	var loc admin.Location
	eventually.True(t, "a's mirror to see the chain", 20*time.Second, func() bool {
		decode(t, mustOK(t, kv(t, nil, "cluster", "locate", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--tokens-file", tokens, "--block-tokens", "4", "--json")), &loc)
		return loc.DeepestBlocks == 2
	})
	if loc.ChainBlocks != 3 || fmt.Sprint(loc.DeepestNodes) != "[cmd-second]" || loc.PoolPrefixBlocks != 2 {
		t.Fatalf("cluster locate --json: %+v", loc)
	}
	r := mustOK(t, kv(t, nil, "cluster", "locate", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--hex", "--keys", strings.Join(keys, ",")))
	if !strings.Contains(r.stdout, "deepest prefix: 2 blocks on cmd-second") {
		t.Fatalf("cluster locate table: %s", r.stdout)
	}
	var blocks admin.BlockList
	decode(t, mustOK(t, kv(t, nil, "cluster", "blocks", "--server", a.addr, "--node", "cmd-second", "--json")), &blocks)
	if blocks.Total != 2 || len(blocks.Blocks) != 2 || !slices.ContainsFunc(blocks.Blocks, func(b admin.BlockRef) bool { return hex.EncodeToString(b.Key) == keys[0] }) {
		t.Fatalf("cluster blocks: %+v", blocks)
	}
	var nodes admin.Nodes
	eventually.True(t, "both nodes alive in gossip and registered", 20*time.Second, func() bool {
		decode(t, mustOK(t, kv(t, nil, "cluster", "nodes", "--server", a.addr, "--json")), &nodes)
		alive := 0
		for _, n := range nodes.Nodes {
			if n.GossipState == "alive" && n.EtcdState == "registered" {
				alive++
			}
		}
		return alive == 2
	})
	if r := mustOK(t, kv(t, nil, "cluster", "nodes", "--server", b.addr)); !strings.Contains(r.stdout, "GOSSIP") || !strings.Contains(r.stdout, "rack-b") {
		t.Fatalf("cluster nodes table: %s", r.stdout)
	}
	var st admin.Stats
	decode(t, mustOK(t, kv(t, nil, "cluster", "stats", "--server", a.addr, "--json")), &st)
	if st.Nodes != 2 || st.MirrorBlocks != 2 || st.LiveNodes != 2 {
		t.Fatalf("cluster stats: %+v", st)
	}
	mustOK(t, kv(t, nil, "cluster", "stats", "--server", a.addr))
	// A node that does not exist is the node's error, not a usage error.
	if r := kv(t, nil, "cluster", "blocks", "--server", a.addr, "--node", "ghost"); r.code != 1 || !strings.Contains(r.stderr, "no node") {
		t.Errorf("blocks of a ghost node: exit %d, %q", r.code, r.stderr)
	}
	// The previous release's admin verbs.
	if r := mustOK(t, kv(t, nil, "admin", "stats", "--server", a.addr)); !strings.Contains(r.stdout, "nodes") || !strings.Contains(r.stderr, `"kvpool cluster stats"`) {
		t.Errorf("admin stats (old): %q %q", r.stdout, r.stderr)
	}

	// Policies, set on a and read back through b.
	var p admin.Policy
	decode(t, mustOK(t, kv(t, nil, "policy", "set", "--server", a.addr, "--tenant", "acme", "--policy", "lfu", "--quota", "2MiB", "--high", "0.9", "--low", "0.5", "--ttl", "1h",
		"--disk-admit-reads", "3", "--disk-quota", "8MiB", "--json")), &p)
	if p.Kind != "lfu" || p.QuotaBytes != 2<<20 || p.DefaultTTLSeconds != 3600 || p.StoredUnixMs == 0 || p.DiskAdmitReads != 3 || p.DiskQuotaBytes != 8<<20 || p.NoDisk {
		t.Fatalf("policy set --json: %+v", p)
	}
	var got admin.Policy
	decode(t, mustOK(t, kv(t, nil, "policy", "get", "--server", b.addr, "--tenant", "acme", "--json")), &got)
	if got.Kind != "lfu" || got.High != 0.9 || got.StoredUnixMs != 0 || got.DiskAdmitReads != 3 || got.DiskQuotaBytes != 8<<20 {
		t.Fatalf("policy get --json: %+v", got)
	}
	var ps []admin.Policy
	decode(t, mustOK(t, kv(t, nil, "admin", "policy", "list", "--server", b.addr, "--json")), &ps)
	if len(ps) != 1 || ps[0].Tenant != "acme" {
		t.Fatalf("admin policy list (old) --json: %+v", ps)
	}
	if r := kv(t, nil, "policy", "set", "--server", a.addr, "--tenant", "acme", "--policy", "mru", "--quota", "0"); r.code != 1 || !strings.Contains(r.stderr, "mru") {
		t.Errorf("an unknown policy is the node's InvalidArgument: exit %d, %q", r.code, r.stderr)
	}
	mustOK(t, kv(t, nil, "policy", "delete", "--server", a.addr, "--tenant", "acme"))
	if r := kv(t, nil, "policy", "get", "--server", a.addr, "--tenant", "acme"); r.code != 1 || !strings.Contains(r.stderr, "no policy") {
		t.Errorf("get after delete: exit %d, %q", r.code, r.stderr)
	}

	// Drain b, asking a: a pulls b's two blocks, and b's daemon exits 0
	// (the cleanup checks).
	if r := kv(t, nil, "cluster", "drain", "--server", a.addr); r.code != 2 || !strings.Contains(r.stderr, "--node is required") {
		t.Errorf("drain without --node: exit %d, %q", r.code, r.stderr)
	}
	if r := kv(t, nil, "cluster", "drain", "--server", a.addr, "--node", "ghost"); r.code != 1 || !strings.Contains(r.stderr, `no node "ghost"`) {
		t.Errorf("drain of a ghost node: exit %d, %q", r.code, r.stderr)
	}
	var dr admin.DrainReport
	decode(t, mustOK(t, kv(t, nil, "cluster", "drain", "--server", a.addr, "--node", "cmd-second", "--budget", "20s", "--json")), &dr)
	if dr.NodeID != "cmd-second" || dr.Blocks != 2 || dr.HandedOffBlocks != 2 || dr.KeptBlocks != 0 || dr.PeerBlocks[nodes.AnsweredBy] != 2 {
		t.Fatalf("cluster drain --json: %+v", dr)
	}
	for _, k := range keys[:2] {
		mustOK(t, kv(t, nil, "block", "get", "--server", a.addr, "--tenant", "acme", "--namespace", "m", "--hex", "--key", k))
	}
}

func TestDemo(t *testing.T) {
	r := mustOK(t, kv(t, nil, "cluster", "demo"))
	for _, want := range []string{"3 daemons up", "node-0  -    12", "node-1  -    6", "node-2  -    3", "deepest prefix: 12 blocks on node-0",
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
		// A batched put over shm, two clients: each client's sources
		// and the baseline's, made before the clock starts.
		{"--op", "put", "--path", "shm", "--clients", "2", "--batch", "2", "--block-size", "1MiB"},
		// The same-host session on its socket alone, the A/B of the
		// mailbox.
		{"--op", "put", "--path", "shm", "--no-shm-mailbox", "--block-size", "1MiB"},
		// Fetches between two nodes: the streaming baseline and the
		// request/response floor.
		{"--remote", "--chain-blocks", "2", "--block-size", "256KiB"},
		// The arena in a file (on a hugetlbfs mount it would be huge
		// pages), the baseline's memory in one beside it.
		{"--op", "put", "--path", "shm", "--block-size", "1MiB", "--segment-path", fmt.Sprintf("/dev/shm/kvpool-bench-smoke-%d", os.Getpid())},
		{"--remote", "--chain-blocks", "2", "--block-size", "256KiB", "--segment-path", fmt.Sprintf("/dev/shm/kvpool-bench-smoke-remote-%d", os.Getpid())},
		// A put over TCP into an arena in a file, the raw-TCP
		// baseline receiving into memory beside it.
		{"--op", "put", "--block-size", "1MiB", "--segment-path", fmt.Sprintf("/dev/shm/kvpool-bench-smoke-data-%d", os.Getpid())},
		// Batched puts over TCP from two clients: the floor sends each
		// call's two values and waits for one answer.
		{"--op", "put", "--block-size", "256KiB", "--batch", "2", "--clients", "2"},
	} {
		r := mustOK(t, kv(t, nil, append([]string{"node", "bench", "--duration", "300ms", "--working-set", "8MiB", "--capacity", "64MiB", "--json"}, args...)...))
		var res map[string]any
		decode(t, r, &res)
		for _, f := range []string{"op", "block_bytes", "clients", "gbps", "ops_per_s", "p50_ms", "p99_ms", "baseline_gbps", "ratio_to_baseline"} {
			if _, ok := res[f]; !ok {
				t.Errorf("bench %v JSON lacks %q", args, f)
			}
		}
		if res["gbps"].(float64) <= 0 || res["baseline_gbps"].(float64) <= 0 {
			t.Errorf("bench %v measured nothing: %s", args, r.stdout)
		}
		if slices.Contains(args, "--segment-path") {
			seg := args[len(args)-1]
			want := "beside " + seg
			if slices.Contains(args, "shm") && args[1] == "put" {
				// A put's memcpy writes into frames of the arena itself.
				want = "frames reserved in the node's arena"
			}
			if !strings.Contains(fmt.Sprint(res["baseline"]), want) {
				t.Errorf("bench %v: baseline %q, want %q", args, res["baseline"], want)
			}
			if left, _ := filepath.Glob(seg + "*"); len(left) > 0 {
				t.Errorf("bench %v left %v behind", args, left)
			}
		}
		// Fetches, and puts over TCP, are judged against a raw-TCP
		// request/response floor as well as the streaming baseline.
		wantFloor := ""
		switch {
		case args[0] == "--remote":
			wantFloor = "request/response, 2 connections"
		case args[1] == "put" && !slices.Contains(args, "shm"):
			wantFloor = "request/response, 1 connection"
			if i := slices.Index(args, "--clients"); i >= 0 && args[i+1] != "1" {
				wantFloor = "request/response, " + args[i+1] + " connections"
			}
		}
		if floor, _ := res["floor_gbps"].(float64); wantFloor != "" && (floor <= 0 || res["ratio_to_floor"] == nil || !strings.Contains(fmt.Sprint(res["floor"]), wantFloor)) {
			t.Errorf("bench %v measured no request/response floor (%q): %s", args, wantFloor, r.stdout)
		}
		if wantFloor == "" && res["floor"] != nil {
			t.Errorf("bench %v measured a floor it has none of: %s", args, r.stdout)
		}
		// Every run over raw TCP in this process also measures the
		// streams checked as kvpool's ends check them.
		wantChecked := ""
		switch {
		case args[0] == "--remote":
			wantChecked = "each block checksummed as it arrives"
		case slices.Contains(args, "shm"):
		case args[1] == "put":
			wantChecked = "each value checksummed as it is sent and as it arrives"
		default:
			wantChecked = "each block checksummed as it arrives"
		}
		checked, _ := res["checked_gbps"].(float64)
		switch {
		case wantChecked != "" && (checked <= 0 || res["ratio_to_checked"] == nil || !strings.Contains(fmt.Sprint(res["checked"]), wantChecked)):
			t.Errorf("bench %v measured no checked streams (%q): %s", args, wantChecked, r.stdout)
		case wantChecked == "" && res["checked"] != nil:
			t.Errorf("bench %v measured checked streams it has none of: %s", args, r.stdout)
		}
		// Fetches over TCP also measure the relayed, checked floor.
		relayed, _ := res["relayed_gbps"].(float64)
		switch wantRelayed := args[0] == "--remote"; {
		case wantRelayed && (relayed <= 0 || res["ratio_to_relayed"] == nil || !strings.Contains(fmt.Sprint(res["relayed"]), "through a relay that checksums")):
			t.Errorf("bench %v measured no relayed floor: %s", args, r.stdout)
		case !wantRelayed && res["relayed"] != nil:
			t.Errorf("bench %v measured a relayed floor it has none of: %s", args, r.stdout)
		}
		if !strings.Contains(r.stderr, "100%") {
			t.Errorf("bench %v drew no progress bar on stderr: %q", args, r.stderr)
		}
	}
}
