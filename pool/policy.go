package pool

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/metadata"
)

// applyPolicy applies a tenant policy record from etcd (nil: deleted) to
// the store. A record that does not decode is logged and counted, and the
// tenant keeps what it had.
func (n *Node) applyPolicy(tenant string, value []byte) {
	if value == nil {
		n.store.SetTenant(tenant, nil)
		n.log.Info("tenant policy removed; node defaults apply", "tenant", tenant)
		return
	}
	var cfg eviction.TenantConfig
	if err := api.ValidateName("tenant", tenant); err != nil {
		n.metrics.badPolicies.Inc()
		n.log.Warn("skipping a policy record", "tenant", tenant, "err", err)
		return
	}
	if err := json.Unmarshal(value, &cfg); err != nil {
		n.metrics.badPolicies.Inc()
		n.log.Warn("skipping a policy record", "tenant", tenant, "err", err)
		return
	}
	n.store.SetTenant(tenant, &cfg)
	n.log.Info("tenant policy applied", "tenant", tenant, "policy", cfg.Policy.String(), "quota_bytes", cfg.QuotaBytes,
		"high", cfg.High, "low", cfg.Low, "default_ttl", cfg.DefaultTTL.String())
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
		HighWatermark: c.High, LowWatermark: c.Low, DefaultTtlSeconds: c.DefaultTTL.Seconds()}
}

// policies is where the node reads and writes tenant policies: etcd, or
// on a standalone node its own memory.
func (a *adminService) policies() *metadata.Policies {
	if a.n.cfg.Etcd == nil {
		return nil
	}
	return metadata.NewPolicies(a.n.cfg.Etcd, a.n.cfg.MetadataPrefix)
}

func (a *adminService) SetPolicy(ctx context.Context, req *kvpoolv1.SetPolicyRequest) (*kvpoolv1.SetPolicyResponse, error) {
	tenant, cfg, err := tenantConfigFromProto(req.GetPolicy())
	if err != nil {
		return nil, api.ToStatus(err)
	}
	if p := a.policies(); p != nil {
		b, _ := json.Marshal(cfg)
		if err := p.Put(ctx, tenant, b); err != nil {
			return nil, api.ToStatus(err)
		}
	} else {
		a.n.localPolicy(tenant, &cfg)
	}
	return &kvpoolv1.SetPolicyResponse{Policy: tenantPolicyProto(tenant, cfg), StoredUnixMs: a.n.cfg.Now().UnixMilli()}, nil
}

func (a *adminService) GetPolicy(ctx context.Context, req *kvpoolv1.GetPolicyRequest) (*kvpoolv1.GetPolicyResponse, error) {
	all, err := a.listPolicies(ctx)
	if err != nil {
		return nil, api.ToStatus(err)
	}
	if err := api.ValidateName("tenant", req.GetTenant()); err != nil {
		return nil, api.ToStatus(err)
	}
	for _, p := range all {
		if p.GetTenant() == req.GetTenant() {
			return &kvpoolv1.GetPolicyResponse{Policy: p}, nil
		}
	}
	return nil, api.ToStatus(api.Errorf(api.ErrNotFound, "pool: no policy for tenant %s; it gets the node's default", req.GetTenant()))
}

func (a *adminService) ListPolicies(ctx context.Context, _ *kvpoolv1.ListPoliciesRequest) (*kvpoolv1.ListPoliciesResponse, error) {
	all, err := a.listPolicies(ctx)
	if err != nil {
		return nil, api.ToStatus(err)
	}
	return &kvpoolv1.ListPoliciesResponse{Policies: all}, nil
}

func (a *adminService) DeletePolicy(ctx context.Context, req *kvpoolv1.DeletePolicyRequest) (*kvpoolv1.DeletePolicyResponse, error) {
	if err := api.ValidateName("tenant", req.GetTenant()); err != nil {
		return nil, api.ToStatus(err)
	}
	if p := a.policies(); p != nil {
		if err := p.Delete(ctx, req.GetTenant()); err != nil {
			return nil, api.ToStatus(err)
		}
	} else {
		a.n.localPolicy(req.GetTenant(), nil)
	}
	return &kvpoolv1.DeletePolicyResponse{}, nil
}

// listPolicies reads every stored policy, sorted by tenant. Records that
// do not decode are left out (daemons skip them too).
func (a *adminService) listPolicies(ctx context.Context) ([]*kvpoolv1.TenantPolicy, error) {
	var out []*kvpoolv1.TenantPolicy
	if p := a.policies(); p != nil {
		all, err := p.List(ctx)
		if err != nil {
			return nil, err
		}
		for tenant, b := range all {
			var cfg eviction.TenantConfig
			if json.Unmarshal(b, &cfg) == nil {
				out = append(out, tenantPolicyProto(tenant, cfg))
			}
		}
	} else {
		a.n.localMu.Lock()
		for tenant, cfg := range a.n.localPolicies {
			out = append(out, tenantPolicyProto(tenant, cfg))
		}
		a.n.localMu.Unlock()
	}
	slices.SortFunc(out, func(x, y *kvpoolv1.TenantPolicy) int { return strings.Compare(x.GetTenant(), y.GetTenant()) })
	return out, nil
}

// localPolicy applies and remembers a policy on a standalone node (nil:
// delete).
func (n *Node) localPolicy(tenant string, cfg *eviction.TenantConfig) {
	n.localMu.Lock()
	if n.localPolicies == nil {
		n.localPolicies = map[string]eviction.TenantConfig{}
	}
	if cfg == nil {
		delete(n.localPolicies, tenant)
	} else {
		n.localPolicies[tenant] = *cfg
	}
	n.localMu.Unlock()
	n.store.SetTenant(tenant, cfg)
}
