package eviction

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// A tenant config as the previous version stored it (no schema) decodes
// to what was written; this version writes the same fields with its
// schema first, which the previous version ignores; a newer schema is
// refused.
func TestSchemaV1PolicyDecodes(t *testing.T) {
	fixture, err := os.ReadFile("testdata/schema/v1/policy.json")
	if err != nil {
		t.Fatal(err)
	}
	want := TenantConfig{Policy: PrefixLRU, QuotaBytes: 8 << 30, High: 0.9, Low: 0.8, DefaultTTL: 90 * time.Second, DiskAdmitReads: 3, DiskQuotaBytes: 1 << 40}
	var got TenantConfig
	if err := json.Unmarshal(fixture, &got); err != nil || got != want {
		t.Fatalf("v1 policy: %+v, %v; want %+v", got, err, want)
	}
	enc, _ := json.Marshal(want)
	if v1 := strings.TrimSpace(string(fixture)); string(enc) != `{"schema":1,`+v1[1:] {
		t.Errorf("this version writes %s; schema 1 with its schema is %s", enc, `{"schema":1,`+v1[1:])
	}
	var old map[string]any // the previous version decoded into a struct without "schema", ignoring it
	if err := json.Unmarshal(enc, &old); err != nil || old["policy"] != "prefix-lru" {
		t.Errorf("this version's record: %v %v", old, err)
	}
	if err := json.Unmarshal([]byte(`{"schema":2,"policy":"lru"}`), &got); err == nil || !strings.Contains(err.Error(), "newer kvpool") {
		t.Errorf("a schema-2 policy: %v, want refused", err)
	}
}
