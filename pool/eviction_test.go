package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/pool/store"
)

func tenantStats(t *testing.T, n *Node, tenant string) store.TenantStats {
	t.Helper()
	for _, ts := range n.Store().TenantStats() {
		if ts.Tenant == tenant {
			return ts
		}
	}
	t.Fatalf("no tenant %s", tenant)
	return store.TenantStats{}
}

// 16 goroutines put into one tenant with a 1 MiB quota: its stored bytes
// never exceed the quota by more than one block (here: never at all),
// and the quota's evictions keep every put succeeding.
func TestQuotaUnderConcurrentPuts(t *testing.T) {
	const block, quota = 64 << 10, 1 << 20
	n := startNode(t)
	n.Store().SetTenant("q", &eviction.TenantConfig{Policy: eviction.LRU, QuotaBytes: quota})
	var maxSeen atomic.Int64
	stop := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := tenantStats(t, n, "q")
			if s.StoredBytes > maxSeen.Load() {
				maxSeen.Store(s.StoredBytes)
			}
		}
	})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			c := dial(t, n, api.PathData)
			for i := range 40 {
				k := api.BlockKey{Tenant: "q", Namespace: "m", Key: fmt.Appendf(nil, "g%d-%d", g, i)}
				if err := c.Put(context.Background(), k, value(uint64(g*1000+i), block)); err != nil {
					failed.Add(1)
					t.Errorf("put %s: %v", k, err)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	watcher.Wait()
	s := tenantStats(t, n, "q")
	if maxSeen.Load() > quota+block || s.StoredBytes > quota {
		t.Fatalf("stored %d bytes at most (now %d); quota %d, one block %d", maxSeen.Load(), s.StoredBytes, quota, block)
	}
	if s.QuotaEvictions < 640-quota/block || failed.Load() > 0 {
		t.Fatalf("%d quota evictions, %d failed puts: %+v", s.QuotaEvictions, failed.Load(), s)
	}
	t.Logf("640 puts of 64 KiB into a 1 MiB quota: at most %d bytes stored, %d quota evictions", maxSeen.Load(), s.QuotaEvictions)
	if err := n.Store().Check(); err != nil {
		t.Fatal(err)
	}
}

// Pressure from tenant a (no quota) fills the arena many times over;
// tenant b keeps everything up to its quota, and a's oldest blocks go.
func TestPressureSparesTenantsWithinQuota(t *testing.T) {
	const block = 256 << 10
	n := startNode(t, func(c *Config) { c.CapacityBytes, c.MaxBlockBytes = 8<<20, 1<<20 })
	n.Store().SetTenant("b", &eviction.TenantConfig{Policy: eviction.LRU, QuotaBytes: 3 << 20, High: 1, Low: 1})
	c := dial(t, n, api.PathData)
	ctx := context.Background()
	var bKeys []api.BlockKey
	for i := range 12 { // exactly b's quota
		k := api.BlockKey{Tenant: "b", Namespace: "m", Key: fmt.Appendf(nil, "b%d", i)}
		if err := c.Put(ctx, k, value(uint64(i), block)); err != nil {
			t.Fatal(err)
		}
		bKeys = append(bKeys, k)
	}
	for i := range 200 { // 50 MiB through an 8 MiB arena
		k := api.BlockKey{Tenant: "a", Namespace: "m", Key: fmt.Appendf(nil, "a%d", i)}
		if err := c.Put(ctx, k, value(uint64(1000+i), block)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	for i, k := range bKeys {
		got, err := c.GetValue(ctx, k)
		if err != nil || !bytes.Equal(got, value(uint64(i), block)) {
			t.Fatalf("tenant b lost block %d to a's pressure: %v", i, err)
		}
	}
	a, b := tenantStats(t, n, "a"), tenantStats(t, n, "b")
	if b.StoredBytes != 3<<20 || b.PressureEvictions != 0 || a.PressureEvictions == 0 {
		t.Fatalf("a %+v\nb %+v", a, b)
	}
	// a's newest block is there, its first is gone (LRU).
	if _, err := c.GetValue(ctx, api.BlockKey{Tenant: "a", Namespace: "m", Key: []byte("a199")}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetValue(ctx, api.BlockKey{Tenant: "a", Namespace: "m", Key: []byte("a0")}); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a's oldest block: %v", err)
	}
	// A quota lowered live is over-quota at once: b evicts down to its
	// new low watermark.
	n.Store().SetTenant("b", &eviction.TenantConfig{Policy: eviction.LRU, QuotaBytes: 1 << 20, High: 1, Low: 1})
	if b := tenantStats(t, n, "b"); b.StoredBytes > 1<<20 || b.QuotaEvictions != 8 {
		t.Fatalf("after lowering b's quota: %+v", b)
	}
	if err := n.Store().Check(); err != nil {
		t.Fatal(err)
	}
}

// A lease held across an eviction storm keeps its blocks readable; a
// leased block is removed only with force; when the lease ends the
// blocks can go.
func TestLeaseSurvivesEvictionStorm(t *testing.T) {
	const block = 256 << 10
	n := startNode(t, func(c *Config) { c.CapacityBytes, c.MaxBlockBytes = 8<<20, 1<<20 })
	c := dial(t, n, api.PathGRPC)
	ctx := context.Background()
	var chain [][]byte
	for i := range 8 {
		k := fmt.Appendf(nil, "leased-%d", i)
		if err := c.Put(ctx, api.BlockKey{Tenant: "t", Namespace: "m", Key: k}, value(uint64(i), block)); err != nil {
			t.Fatal(err)
		}
		chain = append(chain, k)
	}
	// The longest lease a node grants: the storm takes seconds under -race
	// on a loaded machine, and a lease that ends during it lets the
	// blocks go (5 s did, once). Its end is tested with an explicit clock.
	got, until, err := c.LocateLease(ctx, "t", "m", chain, time.Minute)
	if err != nil || got != 8 || until.IsZero() {
		t.Fatalf("locate with lease: %d %v %v", got, until, err)
	}
	// The storm: the same tenant and another write 60 MiB.
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			cl := dial(t, n, api.PathData)
			for i := range 120 {
				k := api.BlockKey{Tenant: []string{"t", "other"}[g], Namespace: "m", Key: fmt.Appendf(nil, "storm-%d-%d", g, i)}
				if err := cl.Put(ctx, k, value(uint64(i), block)); err != nil {
					t.Errorf("storm put: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i, k := range chain {
		got, err := c.GetValue(ctx, api.BlockKey{Tenant: "t", Namespace: "m", Key: k})
		if err != nil || !bytes.Equal(got, value(uint64(i), block)) {
			t.Fatalf("leased block %d after the storm: %v", i, err)
		}
	}
	if st := tenantStats(t, n, "t"); st.PressureEvictions == 0 {
		t.Fatalf("the storm evicted nothing: %+v", st)
	}
	k0 := api.BlockKey{Tenant: "t", Namespace: "m", Key: chain[0]}
	if err := c.Remove(ctx, k0); api.Code(err).String() != "FailedPrecondition" {
		t.Fatalf("remove of a leased block: %v", err)
	}
	if err := c.RemoveForce(ctx, k0); err != nil {
		t.Fatal(err)
	}
	// Past the lease the sweeper drops it and the blocks are evictable.
	n.Store().Sweep(until.Add(time.Second))
	if got := n.Store().LeasedBlocks(until.Add(time.Second)); got != 0 {
		t.Fatalf("%d leases left after they ended", got)
	}
	if err := n.Store().Check(); err != nil {
		t.Fatal(err)
	}
}

// A tenant's TTL: blocks expire when the sweeper passes their time, not
// before; a block being read waits.
func TestTTLExpires(t *testing.T) {
	n := startNode(t)
	n.Store().SetTenant("ttl", &eviction.TenantConfig{Policy: eviction.TTL, DefaultTTL: time.Minute})
	c := dial(t, n, api.PathData)
	ctx := context.Background()
	for i := range 4 {
		if err := c.Put(ctx, api.BlockKey{Tenant: "ttl", Namespace: "m", Key: fmt.Appendf(nil, "k%d", i)}, value(uint64(i), 4096)); err != nil {
			t.Fatal(err)
		}
	}
	pin, err := n.Store().Acquire([]byte("ttl"), []byte("m"), []byte("k0"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if got := n.Store().Sweep(now.Add(30 * time.Second)); got != 0 {
		t.Fatalf("%d expired half way", got)
	}
	if got := n.Store().Sweep(now.Add(2 * time.Minute)); got != 3 {
		t.Fatalf("%d expired after the TTL, want 3 (k0 is being read)", got)
	}
	n.Store().Release(pin)
	if got := n.Store().Sweep(now.Add(3 * time.Minute)); got != 1 {
		t.Fatalf("k0: %d expired after its reader left", got)
	}
	if st := tenantStats(t, n, "ttl"); st.Blocks != 0 || st.Expirations != 4 {
		t.Fatalf("%+v", st)
	}
}

// Changing a tenant's policy live keeps its blocks; hits and misses are
// counted; an invalid policy is InvalidArgument with every problem named.
func TestPolicyChangeAndStats(t *testing.T) {
	n := startNode(t)
	c := dial(t, n, api.PathData)
	ctx := context.Background()
	for i := range 5 {
		if err := c.Put(ctx, api.BlockKey{Tenant: "p", Namespace: "m", Key: fmt.Appendf(nil, "k%d", i)}, value(uint64(i), 4096)); err != nil {
			t.Fatal(err)
		}
	}
	c.GetValue(ctx, api.BlockKey{Tenant: "p", Namespace: "m", Key: []byte("k1")})
	c.GetValue(ctx, api.BlockKey{Tenant: "p", Namespace: "m", Key: []byte("nope")})
	admin := kvpoolv1.NewAdminServiceClient(dial(t, n, api.PathGRPC).Conn())
	if _, err := admin.SetPolicy(ctx, &kvpoolv1.SetPolicyRequest{Policy: &kvpoolv1.TenantPolicy{Tenant: "p", Policy: "prefix-lru", QuotaBytes: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	st := tenantStats(t, n, "p")
	if st.Config.Policy != eviction.PrefixLRU || st.Config.QuotaBytes != 1<<20 || st.Blocks != 5 || st.Hits != 1 || st.Misses != 1 {
		t.Fatalf("%+v", st)
	}
	got, err := admin.GetPolicy(ctx, &kvpoolv1.GetPolicyRequest{Tenant: "p"})
	if err != nil || got.GetPolicy().GetPolicy() != "prefix-lru" || got.GetPolicy().GetHighWatermark() != 0.95 {
		t.Fatalf("get: %v %v", got, err)
	}
	_, err = admin.SetPolicy(ctx, &kvpoolv1.SetPolicyRequest{Policy: &kvpoolv1.TenantPolicy{Tenant: "p", Policy: "mru", QuotaBytes: -1, HighWatermark: 0.5, LowWatermark: 0.8}})
	if api.Code(err).String() != "InvalidArgument" || !strings.Contains(err.Error(), "mru") {
		t.Fatalf("unknown policy: %v", err)
	}
	_, err = admin.SetPolicy(ctx, &kvpoolv1.SetPolicyRequest{Policy: &kvpoolv1.TenantPolicy{Tenant: "p", Policy: "lru", QuotaBytes: -1, HighWatermark: 0.5, LowWatermark: 0.8}})
	if api.Code(err).String() != "InvalidArgument" || !strings.Contains(err.Error(), "quota -1") || !strings.Contains(err.Error(), "low watermark 0.8") {
		t.Fatalf("negative quota and low above high: %v", err)
	}
	// A lease asked for without a length is the node's default, 10 s.
	gc := dial(t, n, api.PathGRPC)
	held, until, err := gc.LocateLease(ctx, "p", "m", [][]byte{[]byte("k0"), []byte("k1")}, 0)
	if d := time.Until(until); err != nil || held != 2 || d < 9*time.Second || d > 11*time.Second {
		t.Fatalf("default lease: %d blocks until %v (%v), %v", held, until, d, err)
	}
	// Per-tenant metrics.
	mfs, err := n.cfg.Gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = true
	}
	for _, name := range []string{"kvpool_eviction_tenant_stored_bytes", "kvpool_eviction_tenant_hits_total", "kvpool_eviction_tenant_misses_total", "kvpool_eviction_tenant_evictions_total"} {
		if !found[name] {
			t.Errorf("no metric %s", name)
		}
	}
	if err := n.Store().Check(); err != nil {
		t.Fatal(err)
	}
}
