package test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func planJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	r := mustOK(t, kv(t, nil, append([]string{"plan", "--json"}, args...)...))
	var out map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("plan %v: %v\n%s", args, err, r.stdout)
	}
	return out
}

func near(got any, want, rel float64) bool {
	f, ok := got.(float64)
	return ok && math.Abs(f-want) <= rel*math.Abs(want)
}

// kvpool plan from profiles alone reproduces the H200 anchors' B* and
// computes fetch and recompute times at a given link speed.
func TestPlanCLIProfiles(t *testing.T) {
	for _, tc := range []struct {
		model string
		gbps  float64
	}{{"llama3-8b", 4.68}, {"llama3-70b", 1.39}} {
		out := planJSON(t, "--model", tc.model, "--tokens", "4096", "--accelerator", "h200")
		if !near(out["breakeven_gbps"], tc.gbps, 0.05) {
			t.Errorf("%s: breakeven_gbps %v, want %v ± 5%%", tc.model, out["breakeven_gbps"], tc.gbps)
		}
		for _, f := range []string{"kv_bytes_per_token", "prefill_tokens_per_s", "recompute_ms"} {
			if _, ok := out[f]; !ok {
				t.Errorf("%s: no %q in %v", tc.model, f, out)
			}
		}
	}
	// 4096 tokens × 128 KiB = 512 MiB at 10 GB/s: 53.687 ms; recompute
	// at 35739 tokens/s: 114.609 ms.
	out := planJSON(t, "--model", "llama3-8b", "--tokens", "4096", "--link-gbps", "10")
	if !near(out["fetch_ms"], 4096*131072/10e9*1e3, 1e-6) || !near(out["recompute_ms"], 4096.0/35739*1e3, 1e-6) {
		t.Errorf("fetch/recompute: %v / %v", out["fetch_ms"], out["recompute_ms"])
	}
	if out["plan"] != "split" || !near(out["kv_bytes_per_token"], 131072, 0) {
		t.Errorf("at 10 GB/s: %v", out)
	}
	// MLA with a given prefill speed: 70272 B/token × 10000 tokens/s.
	out = planJSON(t, "--model", "deepseek-v3", "--tokens", "2048", "--prefill-tps", "10000")
	if !near(out["breakeven_gbps"], 0.70272, 1e-9) {
		t.Errorf("deepseek-v3: %v", out)
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
	out = planJSON(t, "--profiles", prof, "--model", "tiny", "--accelerator", "l4", "--tokens", "1000")
	if !near(out["kv_bytes_per_token"], 512, 0) || !near(out["breakeven_gbps"], 512*50000/1e9, 1e-9) {
		t.Errorf("tiny: %v", out)
	}
	out = planJSON(t, "--profiles", "../transfer/cost/testdata/gpu-anchor-h200.json", "--model", "llama3-70b", "--tokens", "16384")
	if !near(out["breakeven_gbps"], 1.21, 0.01) {
		t.Errorf("anchor file: %v", out)
	}

	for _, bad := range [][]string{
		{"--tokens", "0"},
		{"--tokens", "100", "--model", "gpt-9"},
		{"--tokens", "100", "--link-gbps", "-1"},
		{"--tokens", "100", "--cached-tokens", "200"},
		{"--tokens", "100", "--model", "deepseek-v3"}, // no curve
		{"--tokens", "100", "--profiles", filepath.Join(dir, "missing.yaml")},
	} {
		r := kv(t, nil, append([]string{"plan"}, bad...)...)
		if r.code != 2 || r.stderr == "" {
			t.Errorf("plan %v: exit %d, stderr %q; want 2 and a message", bad, r.code, r.stderr)
		}
	}
}

// kvpool plan --server plans against a running daemon: the node's own
// prefix, its profiles, the table and the JSON.
func TestPlanCLIServer(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "profiles.yaml")
	os.WriteFile(prof, []byte(`curves:
- model: llama3-8b
  accelerator: l40s
  points: [{tokens: 1024, tokens_per_s: 12000}, {tokens: 8192, tokens_per_s: 10000}]
`), 0o600)
	s := startServe(t, "--capacity", "64MiB", "--profiles", prof, "--accelerator", "l40s", "--block-tokens", "64")
	for _, k := range []string{"k0", "k1"} {
		mustOK(t, kv(t, []byte(strings.Repeat("x", 4096)), "put", "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--key", k))
	}
	out := planJSON(t, "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--keys", "k0,k1,k2,k3", "--block-tokens", "64")
	nodes, _ := out["nodes"].([]any)
	if len(nodes) != 1 || out["prompt_tokens"] != 256.0 || out["reference_accelerator"] != "l40s" {
		t.Fatalf("plan: %v", out)
	}
	n := nodes[0].(map[string]any)
	// 2 of 4 blocks local; 128 more tokens at 12000 tokens/s.
	if n["local_blocks"] != 2.0 || n["plan"] != "recompute" || !near(n["recompute_ms"], 128.0/12000*1e3, 1e-6) || out["winner"] != n["node"] {
		t.Fatalf("node plan: %v", n)
	}
	r := mustOK(t, kv(t, nil, "plan", "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--keys", "k0,k1,k2,k3", "--block-tokens", "64"))
	for _, want := range []string{"NODE", "QUEUE ms", "RECOMPUTE ms", "winner: " + n["node"].(string)} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, r.stdout)
		}
	}
	// Profile-only flags make no sense against a server; an unknown
	// model is the server's InvalidArgument.
	if r := kv(t, nil, "plan", "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--keys", "k0", "--tokens", "5"); r.code != 2 {
		t.Errorf("--tokens with --server: exit %d", r.code)
	}
	if r := kv(t, nil, "plan", "--server", s.addr, "--tenant", "acme", "--namespace", "m", "--keys", "k0", "--model", "gpt-9"); r.code == 0 || !strings.Contains(r.stderr, "gpt-9") {
		t.Errorf("unknown model: exit %d, %s", r.code, r.stderr)
	}
	// The config file sets the node's model, accelerator and block size,
	// with an inline model and curve; a plan without them takes them.
	cfg := filepath.Join(dir, "node.yaml")
	os.WriteFile(cfg, []byte(`capacity: 32MiB
model: tiny
accelerator: l4
block_tokens: 32
models:
- {name: tiny, layers: 2, kv_heads: 1, head_dim: 64}
curves:
- {model: tiny, accelerator: l4, points: [{tokens: 1000, tokens_per_s: 50000}]}
`), 0o600)
	s2 := startServe(t, "--config", cfg)
	out = planJSON(t, "--server", s2.addr, "--tenant", "acme", "--namespace", "m", "--keys", "a,b")
	if out["model"] != "tiny" || out["reference_accelerator"] != "l4" || out["block_tokens"] != 32.0 || out["kv_bytes_per_token"] != 512.0 {
		t.Fatalf("config file profiles: %v", out)
	}
	// A node whose accelerator has no curve for its model does not start.
	if r := kv(t, nil, "serve", "--capacity", "64MiB", "--standalone", "--accelerator", "tpu-v9", "--listen", "127.0.0.1:0"); r.code != 2 || !strings.Contains(r.stderr, "tpu-v9") {
		t.Errorf("serve with an unknown accelerator: exit %d, %s", r.code, r.stderr)
	}
}
