package eviction

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestTenantConfigJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want TenantConfig
		err  []string
	}{
		{in: `{"policy":"prefix-lru","quota_bytes":1048576,"high_watermark":0.9,"low_watermark":0.5,"default_ttl_seconds":30}`,
			want: TenantConfig{Policy: PrefixLRU, QuotaBytes: 1 << 20, High: 0.9, Low: 0.5, DefaultTTL: 30 * time.Second, DiskAdmitReads: 2}},
		{in: `{}`, want: TenantConfig{Policy: LRU, High: 0.95, Low: 0.85, DiskAdmitReads: 2}},
		{in: `{"policy":"lfu","low_watermark":0.99}`, want: TenantConfig{Policy: LFU, High: 0.99, Low: 0.99, DiskAdmitReads: 2}},
		{in: `{"no_disk":true}`, want: TenantConfig{Policy: LRU, High: 0.95, Low: 0.85, NoDisk: true, DiskAdmitReads: 2}},
		{in: `{"disk_admit_reads":1,"disk_quota_bytes":4096}`, want: TenantConfig{Policy: LRU, High: 0.95, Low: 0.85, DiskAdmitReads: 1, DiskQuotaBytes: 4096}},
		{in: `{"disk_admit_reads":128,"disk_quota_bytes":-1}`, err: []string{"disk admission after 128 reads: want 1 to 127", "disk quota -1 bytes"}},
		{in: `{"policy":"mru"}`, err: []string{`unknown policy "mru"`, "prefix-lru"}},
		{in: `{"quota_bytes":-1}`, err: []string{"quota -1 bytes must not be negative"}},
		{in: `{"high_watermark":0.5,"low_watermark":0.8}`, err: []string{"low watermark 0.8 is above the high watermark 0.5"}},
		{in: `{"high_watermark":1.5}`, err: []string{"must be in (0, 1]"}},
		{in: `{"default_ttl_seconds":-3}`, err: []string{"default TTL -3 s"}},
		{in: `{"quota_bytes":-1,"high_watermark":0.5,"low_watermark":0.8}`, err: []string{"quota -1", "low watermark 0.8"}},
		{in: `[`, err: []string{"unexpected end of JSON input"}},
	} {
		var got TenantConfig
		err := json.Unmarshal([]byte(tc.in), &got)
		if len(tc.err) > 0 {
			for _, w := range tc.err {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %v, want it to mention %q", tc.in, err, w)
				}
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: got %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		b, _ := json.Marshal(got)
		var again TenantConfig
		if err := json.Unmarshal(b, &again); err != nil || again != got {
			t.Errorf("%s: round trip %s gave %+v, %v", tc.in, b, again, err)
		}
	}
}

func TestPickTenant(t *testing.T) {
	for _, tc := range []struct {
		name string
		ts   []TenantUsage
		want int
		ok   bool
	}{
		{"nobody", nil, -1, false},
		{"within quotas are never chosen", []TenantUsage{{100, 200, true}, {200, 200, true}}, -1, false},
		{"over quota first, furthest over", []TenantUsage{{900, 0, true}, {300, 200, true}, {500, 300, true}}, 2, true},
		{"else the largest tenant without a quota", []TenantUsage{{100, 0, true}, {100, 200, true}, {400, 0, true}}, 2, true},
		{"pinned tenants are skipped", []TenantUsage{{400, 0, false}, {100, 0, true}}, 1, true},
		{"empty tenants are skipped", []TenantUsage{{0, 0, true}}, -1, false},
	} {
		i, ok := PickTenant(tc.ts)
		if i != tc.want || ok != tc.ok {
			t.Errorf("%s: got %d %v, want %d %v", tc.name, i, ok, tc.want, tc.ok)
		}
	}
}

func FuzzTenantConfigJSON(f *testing.F) {
	f.Add([]byte(`{"policy":"ttl","quota_bytes":5,"high_watermark":1,"low_watermark":0.1,"default_ttl_seconds":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c TenantConfig
		if json.Unmarshal(b, &c) != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("decoded an invalid config %+v: %v", c, err)
		}
	})
}
