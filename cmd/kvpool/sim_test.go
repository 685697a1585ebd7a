package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeTrace writes a small Mooncake-format trace: n requests 0.2 s
// apart sharing a 4-block prefix.
func writeTrace(t *testing.T, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 20, "hash_ids": [0, 1, 2, 3, %d, %d]}`+"\n",
			200*i, 5*512+100, 100+2*i, 101+2*i)
	}
	file := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestSimCommand(t *testing.T) {
	trace := writeTrace(t, 40)
	r := mustOK(t, kv(t, nil, "sim", "--trace", trace, "--nodes", "2", "--progress", "never"))
	for _, want := range []string{"40 requests", "round-robin", "least-loaded", "affinity", "cost", "pool-split", "oracle", "TTFT p50"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the table lacks %q:\n%s", want, r.stdout)
		}
	}
	// JSON over a grid: one row per policy and point, with the keys the
	// docs promise.
	r = mustOK(t, kv(t, nil, "sim", "--trace", trace, "--nodes", "2", "--policies", "cost,pool", "--sweep", "link-gbps=10,100",
		"--sweep", "model=llama3-8b,llama3-70b", "--json"))
	var rows []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("%v:\n%s", err, r.stdout)
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows for 2 policies × 2 links × 2 models", len(rows))
	}
	for _, k := range []string{"ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "output_tokens_per_s", "computed_tokens",
		"reused_tokens", "host_tokens", "fetched_tokens", "gpu_hit_ratio", "host_hit_ratio", "pool_hit_ratio", "network_bytes", "fetches_failed"} {
		if _, ok := rows[0][k]; !ok {
			t.Errorf("row lacks %q: %v", k, rows[0])
		}
	}
	if rows[0]["model"] != "llama3-8b" || rows[0]["link_gbps"] != 10.0 || rows[7]["model"] != "llama3-70b" || rows[7]["policy"] != "pool" {
		t.Errorf("grid order: first %v, last %v", rows[0], rows[7])
	}
	// What the router sees, compared in one run.
	r2 := mustOK(t, kv(t, nil, "sim", "--trace", trace, "--nodes", "2", "--policies", "cost", "--host-gb", "0", "--sweep", "router-sees=gpu+host,host"))
	if !strings.Contains(r2.stdout, "cost (host only)") || strings.Count(r2.stdout, "cost") != 2 {
		t.Errorf("a router-sees sweep's table:\n%s", r2.stdout)
	}
	if rows[0]["router_sees"] != "gpu+host" {
		t.Errorf("router_sees of the default run: %v", rows[0]["router_sees"])
	}
	// The same flags give the same numbers.
	again := mustOK(t, kv(t, nil, "sim", "--trace", trace, "--nodes", "2", "--policies", "cost,pool", "--sweep", "link-gbps=10,100",
		"--sweep", "model=llama3-8b,llama3-70b", "--json"))
	if again.stdout != r.stdout {
		t.Error("two runs of the same simulation differ")
	}
	// Plots, from a run and from saved JSON.
	dir := t.TempDir()
	saved := filepath.Join(dir, "runs.json")
	os.WriteFile(saved, []byte(r.stdout), 0o644)
	mustOK(t, kv(t, nil, "sim", "--plot", filepath.Join(dir, "plots"), "--plot-from", saved))
	for _, name := range []string{"ttft-p90-vs-link-llama3-8b-x1-n2-h200.png", "ttft-p90-vs-link-llama3-70b-x1-n2-h200.png", "ttft-p90-ratio-vs-kv-bytes.png"} {
		b, err := os.ReadFile(filepath.Join(dir, "plots", name))
		if err != nil || len(b) < 8 || string(b[1:4]) != "PNG" {
			t.Errorf("%s: %v (%d bytes)", name, err, len(b))
		}
	}
}

func TestSimUsageErrors(t *testing.T) {
	trace := writeTrace(t, 3)
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	os.WriteFile(bad, []byte(`{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [0]}`+"\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sim"}, "--trace is required"},
		{[]string{"sim", "--trace", trace, "--policies", "fastest"}, "unknown policy"},
		{[]string{"sim", "--trace", trace, "--model", "gpt-9"}, "unknown model"},
		{[]string{"sim", "--trace", trace, "--sweep", "colour=red"}, "unknown parameter"},
		{[]string{"sim", "--trace", trace, "--sweep", "link-gbps=fast"}, "link-gbps=fast"},
		{[]string{"sim", "--trace", trace, "--sweep", "nodes"}, "want NAME=V1,V2"},
		{[]string{"sim", "--trace", trace, "--nodes", "0"}, "nodes 0"},
		{[]string{"sim", "--trace", trace, "--router-sees", "everything"}, "--router-sees"},
		{[]string{"sim", "--trace", trace, "--sweep", "router-sees=gpu,host"}, `router-sees=gpu: "gpu": want gpu+host or host`},
		{[]string{"sim", "--trace", trace, "--host-gb", "0", "--policies", "pool"}, "needs host blocks"},
		{[]string{"sim", "--trace", trace, "--gpu-policy", "random"}, "--gpu-policy"},
		{[]string{"sim", "--trace", trace, "--weights-gb", "2000"}, "no room for KV"},
		{[]string{"sim", "--trace", bad}, "line 1"},
		{[]string{"sim", "--trace", filepath.Join(t.TempDir(), "none.jsonl")}, "no such file"},
		{[]string{"sim", "--plot-from", trace}, "needs --plot"},
		{[]string{"replay", "--trace", trace, "--block-bytes", "0"}, "--block-bytes"},
	} {
		r := kv(t, nil, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("kvpool %v: exit %d, stderr %q; want exit 2 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

// replay against three daemons started in process: the table, the
// daemons' latencies and the simulator's answer for the same cluster.
func TestReplayCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("runs in real time")
	}
	trace := writeTrace(t, 12)
	r := mustOK(t, kv(t, nil, "replay", "--trace", trace, "--block-bytes", "4096", "--host-gb", "1", "--json"))
	var rep struct {
		Replay  map[string]any `json:"replay"`
		Sim     map[string]any `json:"sim"`
		Daemons struct {
			PlanCalls int `json:"plan_calls"`
			PutCalls  int `json:"put_calls"`
		} `json:"daemons"`
		Ratio map[string]float64 `json:"sim_over_replay"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, r.stdout)
	}
	if rep.Replay["requests"] != 12.0 || rep.Sim["requests"] != 12.0 || rep.Daemons.PlanCalls != 36 || rep.Daemons.PutCalls == 0 || rep.Ratio["ttft_p50"] <= 0 {
		t.Fatalf("report: %+v", rep)
	}
	// Requests after the first reuse the shared prefix from their node's
	// daemon or fetch it from another (most of them: a block is found
	// once its location is published, a few ms after its put).
	if rep.Replay["host_tokens"].(float64)+rep.Replay["fetched_tokens"].(float64) < 9*4*512 {
		t.Errorf("the shared prefix was not reused: %v", rep.Replay)
	}
	t.Logf("replay p50 %.3f p90 %.3f; sim/replay %v", rep.Replay["ttft_p50_s"], rep.Replay["ttft_p90_s"], rep.Ratio)
}

// Plots of runs that span no range on an axis (one link, equal TTFTs,
// two models with the same KV size) still draw.
func TestSimPlotsDegenerateRanges(t *testing.T) {
	dir := t.TempDir()
	rows := []simRow{
		{Model: "a", LinkGbps: 100, TimeScale: 1, Nodes: 2, HostGB: 1, Policy: "cost", KVBytesPerToken: 1000, TTFTP90: 1},
		{Model: "a", LinkGbps: 100, TimeScale: 1, Nodes: 2, HostGB: 1, Policy: "pool-split", KVBytesPerToken: 1000, TTFTP90: 1},
		{Model: "b", LinkGbps: 100, TimeScale: 1, Nodes: 2, HostGB: 1, Policy: "cost", KVBytesPerToken: 1000, TTFTP90: 1},
		{Model: "b", LinkGbps: 100, TimeScale: 1, Nodes: 2, HostGB: 1, Policy: "pool-split", KVBytesPerToken: 1000, TTFTP90: 1},
	}
	if err := writeSimPlots(dir, rows); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 3 {
		t.Fatalf("%d plots, want 3", len(entries))
	}
}
