package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/test/cluster"
)

// A tenant policy set through the CLI on one daemon takes effect on all
// three daemons of a cluster within a second, and its quota then holds on
// each of them.
func TestLivePolicyChangeReachesEveryDaemon(t *testing.T) {
	c := cluster.New(t, cluster.Config{Nodes: 3})
	addr := c.Nodes[0].Node.Addr().String()
	// The CLI reports when etcd acknowledged the write; each daemon
	// records when it applied the change. Both clocks are this host's.
	kvpoolBin(t)
	cliStart := time.Now()
	r := mustOK(t, adminCLI(t, c, "admin", "policy", "set", "--server", addr, "--tenant", "acme", "--policy", "lfu", "--quota", "2MiB",
		"--high", "0.9", "--low", "0.5", "--ttl", "1h", "--json"))
	var setOut struct {
		StoredUnixMs int64 `json:"stored_unix_ms"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &setOut); err != nil || setOut.StoredUnixMs == 0 {
		t.Fatalf("policy set --json: %v\n%s", err, r.stdout)
	}
	stored := time.UnixMilli(setOut.StoredUnixMs)
	applied := make([]time.Time, 3)
	c.Eventually("every daemon applies the policy", 10*time.Second, func() bool {
		for i, d := range c.Running() {
			for _, ts := range d.Node.Store().TenantStats() {
				if ts.Tenant == "acme" && ts.Config.Policy.String() == "lfu" && ts.Config.QuotaBytes == 2<<20 && ts.Config.Low == 0.5 && ts.Config.DefaultTTL == time.Hour {
					applied[i] = ts.PolicyApplied
				}
			}
		}
		return !applied[0].IsZero() && !applied[1].IsZero() && !applied[2].IsZero()
	})
	for i, at := range applied {
		// Millisecond resolution: a daemon may apply the change before
		// the storing daemon has read its own clock.
		d := at.Sub(stored)
		t.Logf("node-%d applied the policy %v after etcd stored it (%v after the CLI process started)", i, d.Round(time.Millisecond), at.Sub(cliStart).Round(time.Millisecond))
		if d > time.Second {
			t.Errorf("node-%d took %v, more than 1 s", i, d)
		}
	}
	// The quota holds on every node: 4 MiB of puts keep at most 2 MiB.
	for i := range 3 {
		cl := c.Client(i, api.PathData)
		for j := range 16 {
			k := api.BlockKey{Tenant: "acme", Namespace: "m", Key: fmt.Appendf(nil, "n%d-%d", i, j)}
			if err := cl.Put(context.Background(), k, blockValue(j, 256<<10)); err != nil && api.Code(err).String() != "ResourceExhausted" {
				t.Fatal(err)
			}
		}
		r = mustOK(t, adminCLI(t, c, "stats", "--server", c.Nodes[i].Node.Addr().String(), "--json"))
		var st struct {
			Tenants []struct {
				Tenant      string `json:"tenant"`
				Policy      string `json:"policy"`
				StoredBytes int64  `json:"stored_bytes"`
				Evicted     int64  `json:"quota_evictions"`
				Rejected    int64  `json:"rejected"`
			} `json:"tenants"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
			t.Fatal(err)
		}
		ok := false
		for _, ts := range st.Tenants {
			if ts.Tenant == "acme" {
				ok = ts.Policy == "lfu" && ts.StoredBytes <= 2<<20 && ts.Evicted+ts.Rejected > 0
				t.Logf("node-%d: %+v", i, ts)
			}
		}
		if !ok {
			t.Fatalf("node-%d stats: %s", i, r.stdout)
		}
	}

	// Evictions are published like removals: every mirror ends up with
	// exactly what each store holds.
	c.Eventually("mirrors match the stores after the evictions", 10*time.Second, func() bool {
		for _, d := range c.Running() {
			held := map[string]bool{}
			d.Node.Store().ForEach(func(tenant, ns string, key []byte) bool {
				held[tenant+"/"+ns+"/"+string(key)] = true
				return true
			})
			for _, m := range c.Running() {
				recs := m.Node.Mirror().Blocks(d.ID, 0)
				if len(recs) != len(held) {
					return false
				}
				for _, r := range recs {
					if !held[r.Tenant+"/"+r.Namespace+"/"+r.Key] {
						return false
					}
				}
			}
		}
		return true
	})

	// get, list, delete; the answering daemon's tenants in admin stats.
	r = mustOK(t, adminCLI(t, c, "admin", "policy", "get", "--server", c.Nodes[2].Node.Addr().String(), "--tenant", "acme", "--json"))
	if !strings.Contains(r.stdout, `"policy": "lfu"`) || !strings.Contains(r.stdout, `"quota_bytes": 2097152`) {
		t.Fatalf("policy get: %s", r.stdout)
	}
	r = mustOK(t, adminCLI(t, c, "admin", "policy", "list", "--server", addr))
	if !strings.Contains(r.stdout, "acme") || !strings.Contains(r.stdout, "2.0 MiB") {
		t.Fatalf("policy list: %s", r.stdout)
	}
	r = mustOK(t, adminCLI(t, c, "admin", "stats", "--server", addr))
	if !strings.Contains(r.stdout, "tenants on node-0") || !strings.Contains(r.stdout, "acme") {
		t.Fatalf("admin stats: %s", r.stdout)
	}
	mustOK(t, adminCLI(t, c, "admin", "policy", "delete", "--server", addr, "--tenant", "acme"))
	c.Eventually("every daemon falls back to the default", 5*time.Second, func() bool {
		for _, d := range c.Running() {
			for _, ts := range d.Node.Store().TenantStats() {
				if ts.Tenant == "acme" && ts.Config.Policy.String() != "lru" {
					return false
				}
			}
		}
		return true
	})

	// Bad input: flags are usage errors (exit 2); settings the daemon
	// rejects are InvalidArgument, every problem named.
	for _, bad := range [][]string{
		{"set", "--tenant", "acme", "--quota", "1GiB"},
		{"set", "--tenant", "acme", "--policy", "lru"},
		{"set", "--tenant", "a b", "--policy", "lru", "--quota", "1GiB"},
		{"set", "--tenant", "acme", "--policy", "lru", "--quota", "-5"},
		{"get"},
	} {
		if r := kv(t, nil, append([]string{"admin", "policy"}, append(bad, "--server", addr)...)...); r.code != 2 {
			t.Errorf("policy %v: exit %d, %s", bad, r.code, r.stderr)
		}
	}
	r = adminCLI(t, c, "admin", "policy", "set", "--server", addr, "--tenant", "acme", "--policy", "mru", "--quota", "1GiB", "--high", "0.5", "--low", "0.8")
	if r.code == 0 || !strings.Contains(r.stderr, "invalid argument") || !strings.Contains(r.stderr, `unknown policy "mru"`) {
		t.Errorf("invalid policy: exit %d, %s", r.code, r.stderr)
	}
}

// adminCLI runs the CLI against cluster c with the credentials it needs
// there.
func adminCLI(t *testing.T, c *cluster.Cluster, args ...string) result {
	t.Helper()
	return kv(t, nil, append(args, c.CLIFlags()...)...)
}
