package pool

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/metadata"
)

// tenantSetter applies a tenant's policy (nil: the node's default). *store.Store
// implements it.
type tenantSetter interface {
	SetTenant(name string, cfg *eviction.TenantConfig)
}

// applyPolicy applies a tenant policy record from etcd (nil: deleted).
// A record that does not decode is logged and counted, and the tenant
// keeps what it had.
func applyPolicy(st tenantSetter, bad prometheus.Counter, log *slog.Logger, tenant string, value []byte) {
	if value == nil {
		st.SetTenant(tenant, nil)
		log.Info("tenant policy removed; node defaults apply", "tenant", tenant)
		return
	}
	var cfg eviction.TenantConfig
	err := api.ValidateName("tenant", tenant)
	if err == nil {
		err = json.Unmarshal(value, &cfg)
	}
	if err != nil {
		bad.Inc()
		log.Warn("skipping a policy record", "tenant", tenant, "err", err)
		return
	}
	st.SetTenant(tenant, &cfg)
	log.Info("tenant policy applied", "tenant", tenant, "policy", cfg.Policy.String(), "quota_bytes", cfg.QuotaBytes,
		"high", cfg.High, "low", cfg.Low, "default_ttl", cfg.DefaultTTL.String())
}

// policies is where tenant policies are kept: in etcd, whose watch applies
// them on every daemon (applyPolicy), or on a standalone node in its own
// memory, applied at once. Safe for concurrent use.
type policies struct {
	etcd *metadata.Policies // nil: standalone
	st   tenantSetter

	mu    sync.Mutex
	local map[string]eviction.TenantConfig
}

func newPolicies(cli *clientv3.Client, prefix string, st tenantSetter) *policies {
	p := &policies{st: st, local: map[string]eviction.TenantConfig{}}
	if cli != nil {
		p.etcd = metadata.NewPolicies(cli, prefix)
	}
	return p
}

// Set stores tenant's policy.
func (p *policies) Set(ctx context.Context, tenant string, cfg eviction.TenantConfig) error {
	if p.etcd != nil {
		b, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		return p.etcd.Put(ctx, tenant, b)
	}
	p.mu.Lock()
	p.local[tenant] = cfg
	p.mu.Unlock()
	p.st.SetTenant(tenant, &cfg)
	return nil
}

// Delete removes tenant's policy.
func (p *policies) Delete(ctx context.Context, tenant string) error {
	if p.etcd != nil {
		return p.etcd.Delete(ctx, tenant)
	}
	p.mu.Lock()
	delete(p.local, tenant)
	p.mu.Unlock()
	p.st.SetTenant(tenant, nil)
	return nil
}

// List returns every stored policy. Records that do not decode are left
// out (daemons skip them too).
func (p *policies) List(ctx context.Context) (map[string]eviction.TenantConfig, error) {
	if p.etcd == nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		return maps.Clone(p.local), nil
	}
	all, err := p.etcd.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]eviction.TenantConfig, len(all))
	for tenant, b := range all {
		var cfg eviction.TenantConfig
		if json.Unmarshal(b, &cfg) == nil {
			out[tenant] = cfg
		}
	}
	return out, nil
}

// tenantConfigFromProto validates an operator's policy, reporting every
// problem as InvalidArgument.
func tenantConfigFromProto(p *kvpoolv1.TenantPolicy) (string, eviction.TenantConfig, error) {
	var errs []error
	tenant := p.GetTenant()
	if err := api.ValidateName("tenant", tenant); err != nil {
		errs = append(errs, err)
	}
	var cfg eviction.TenantConfig
	if p.GetPolicy() != "" {
		k, err := eviction.ParseKind(p.GetPolicy())
		if err != nil {
			errs = append(errs, err)
		}
		cfg.Policy = k
	}
	ttl := p.GetDefaultTtlSeconds()
	if math.IsNaN(ttl) || math.IsInf(ttl, 0) || ttl < 0 || ttl > 1e9 {
		errs = append(errs, api.Errorf(api.ErrInvalidArgument, "default TTL %v s: want 0 to 1e9", ttl))
		ttl = 0
	}
	cfg.QuotaBytes, cfg.High, cfg.Low = p.GetQuotaBytes(), p.GetHighWatermark(), p.GetLowWatermark()
	cfg.NoDisk, cfg.DiskQuotaBytes = p.GetNoDisk(), p.GetDiskQuotaBytes()
	cfg.DiskAdmitReads = int(min(p.GetDiskAdmitReads(), eviction.MaxDiskAdmitReads+1)) // past the bound: Validate says so
	cfg.DefaultTTL = time.Duration(ttl * float64(time.Second))
	if cfg.Policy != 0 || p.GetPolicy() == "" {
		cfg = cfg.WithDefaults()
		if err := cfg.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return "", cfg, api.Errorf(api.ErrInvalidArgument, "pool: %v", err)
	}
	return tenant, cfg, nil
}

func tenantPolicyProto(tenant string, c eviction.TenantConfig) *kvpoolv1.TenantPolicy {
	return &kvpoolv1.TenantPolicy{Tenant: tenant, Policy: c.Policy.String(), QuotaBytes: c.QuotaBytes,
		HighWatermark: c.High, LowWatermark: c.Low, DefaultTtlSeconds: c.DefaultTTL.Seconds(),
		NoDisk: c.NoDisk, DiskAdmitReads: uint32(c.DiskAdmitReads), DiskQuotaBytes: c.DiskQuotaBytes}
}
