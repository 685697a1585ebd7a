package main

import (
	"strings"
	"testing"

	"github.com/kvpool/kvpool/api/chain"
	"github.com/kvpool/kvpool/metadata/engines"
)

func TestEngineSpecs(t *testing.T) {
	var got []engines.EngineConfig
	v := &engineEventsV{p: &got}
	if err := v.Set("vllm-0=tcp://127.0.0.1:5557;replay=tcp://127.0.0.1:5558;keying=sha256_cbor:42;tenant=acme;namespace=llama3-8b,vllm-1=tcp://127.0.0.1:5567"); err != nil {
		t.Fatal(err)
	}
	want := []engines.EngineConfig{
		{Name: "vllm-0", Endpoint: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558", Tenant: "acme", Namespace: "llama3-8b"},
		{Name: "vllm-1", Endpoint: "tcp://127.0.0.1:5567"},
	}
	want[0].Keying.Chain = chain.Config{Scheme: chain.SHA256CBOR, Seed: "42"}
	if len(got) != 2 || got[0].Name != want[0].Name || got[0].Replay != want[0].Replay || got[0].Keying.Chain.Scheme != chain.SHA256CBOR ||
		got[0].Keying.Chain.Seed != "42" || got[0].Tenant != "acme" || got[0].Namespace != "llama3-8b" || got[1].Name != want[1].Name || got[1].Endpoint != want[1].Endpoint || got[1].Keying.Chain.Scheme != 0 {
		t.Fatalf("parsed %+v", got)
	}
	for spec, wantErr := range map[string]string{
		"vllm-0":                   "want NAME=ENDPOINT",
		"=tcp://x:1":               "want NAME=ENDPOINT",
		"e=tcp://x:1;keying=md5:1": "keying",
		"e=tcp://x:1;colour=red":   "unknown option",
	} {
		if err := v.Set(spec); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%q: got %v, want an error about %q", spec, err, wantErr)
		}
	}
	// A bad endpoint is the node's to refuse, with every problem.
	r := kv(t, nil, "node", "serve", "--capacity", "64MiB", "--standalone", "--kv-events", "e=http://x:1", "--host-to-gpu-gbps", "0")
	if r.code != 2 || !strings.Contains(r.stderr, "want tcp://host:port") || !strings.Contains(r.stderr, "--host-to-gpu-gbps") {
		t.Errorf("serve with a bad engine endpoint: exit %d, %s", r.code, r.stderr)
	}
}
