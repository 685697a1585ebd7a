package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
	kvpoolv1 "github.com/kvpool/kvpool/api/kvpool/v1"
)

func adminPolicyCmd(e *env) *cobra.Command {
	c := &cobra.Command{
		Use:   "policy",
		Short: "Set, show and list per-tenant eviction policies, quotas, watermarks and TTLs",
		Long: `policy manages how each tenant's blocks are kept. A policy is stored in etcd and
every daemon applies it within a second, with no restart (a standalone daemon
keeps it in memory).

  --policy   lru, lfu (TinyLFU admission), fifo, ttl or prefix-lru (within a
             chain the deepest block goes first; blocks whose prefix is gone
             before anything else)
  --quota    per node: the most the tenant stores, and what node-wide
             pressure never evicts it below; 0 means no quota
  --high, --low
             fractions of the quota: past high, the tenant evicts down to low
             (defaults 0.95 and 0.85)
  --ttl      blocks expire this long after they are stored (0: never)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{error: errors.New("policy needs a subcommand: set, get, list or delete")}
		},
	}
	c.AddCommand(policySetCmd(e), policyGetCmd(e), policyListCmd(e), policyDeleteCmd(e))
	return c
}

func policySetCmd(e *env) *cobra.Command {
	var f adminFlags
	var tenant, policy string
	var quota int64
	var ttl time.Duration
	var high, low float64
	c := &cobra.Command{
		Use:     "set",
		Short:   "Set a tenant's policy; every daemon applies it within a second",
		Example: `  kvpool admin policy set --tenant acme --policy prefix-lru --quota 16GiB --high 0.9 --low 0.7 --ttl 1h`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var errs []error
			errs = append(errs, api.ValidateName("--tenant", tenant))
			if policy == "" {
				errs = append(errs, errors.New("--policy is required: lru, lfu, fifo, ttl or prefix-lru"))
			}
			if !cmd.Flags().Changed("quota") {
				errs = append(errs, errors.New("--quota is required: a size such as 16GiB, or 0 for none"))
			}
			if ttl < 0 {
				errs = append(errs, fmt.Errorf("--ttl %v must not be negative", ttl))
			}
			if err := errors.Join(errs...); err != nil {
				return usageError{error: err}
			}
			return f.call(cmd, func(ctx context.Context, a kvpoolv1.AdminServiceClient) error {
				r, err := a.SetPolicy(ctx, &kvpoolv1.SetPolicyRequest{Policy: &kvpoolv1.TenantPolicy{
					Tenant: tenant, Policy: policy, QuotaBytes: quota, HighWatermark: high, LowWatermark: low, DefaultTtlSeconds: ttl.Seconds(),
				}})
				if err != nil {
					return err
				}
				if f.asJSON {
					out := policyJSON(r.GetPolicy())
					out["stored_unix_ms"] = r.GetStoredUnixMs()
					return printJSON(e.stdout, out)
				}
				printPolicies(e.stdout, []*kvpoolv1.TenantPolicy{r.GetPolicy()})
				fmt.Fprintln(e.stdout, "stored; every daemon applies it on its next etcd watch event (milliseconds)")
				return nil
			})
		},
	}
	f.register(c)
	fl := c.Flags()
	fl.StringVar(&tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&policy, "policy", "", "lru, lfu, fifo, ttl or prefix-lru (required)")
	fl.Var(sizeFlag{&quota}, "quota", "per-node quota, e.g. 16GiB; 0 for none (required)")
	fl.DurationVar(&ttl, "ttl", 0, "blocks expire this long after they are stored; 0 means never")
	fl.Float64Var(&high, "high", 0, "high watermark, a fraction of the quota (default 0.95)")
	fl.Float64Var(&low, "low", 0, "low watermark, a fraction of the quota (default 0.85)")
	return c
}

func policyGetCmd(e *env) *cobra.Command {
	var f adminFlags
	var tenant string
	c := &cobra.Command{
		Use:   "get",
		Short: "Show a tenant's stored policy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := api.ValidateName("--tenant", tenant); err != nil {
				return usageError{error: err}
			}
			return f.call(cmd, func(ctx context.Context, a kvpoolv1.AdminServiceClient) error {
				r, err := a.GetPolicy(ctx, &kvpoolv1.GetPolicyRequest{Tenant: tenant})
				if err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(e.stdout, policyJSON(r.GetPolicy()))
				}
				printPolicies(e.stdout, []*kvpoolv1.TenantPolicy{r.GetPolicy()})
				return nil
			})
		},
	}
	f.register(c)
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (required)")
	return c
}

func policyListCmd(e *env) *cobra.Command {
	var f adminFlags
	c := &cobra.Command{
		Use:   "list",
		Short: "List every stored tenant policy",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.call(cmd, func(ctx context.Context, a kvpoolv1.AdminServiceClient) error {
				r, err := a.ListPolicies(ctx, &kvpoolv1.ListPoliciesRequest{})
				if err != nil {
					return err
				}
				if f.asJSON {
					out := []map[string]any{}
					for _, p := range r.GetPolicies() {
						out = append(out, policyJSON(p))
					}
					return printJSON(e.stdout, out)
				}
				printPolicies(e.stdout, r.GetPolicies())
				return nil
			})
		},
	}
	f.register(c)
	return c
}

func policyDeleteCmd(e *env) *cobra.Command {
	var f adminFlags
	var tenant string
	c := &cobra.Command{
		Use:   "delete",
		Short: "Delete a tenant's policy: its blocks fall back to the node's defaults",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := api.ValidateName("--tenant", tenant); err != nil {
				return usageError{error: err}
			}
			return f.call(cmd, func(ctx context.Context, a kvpoolv1.AdminServiceClient) error {
				_, err := a.DeletePolicy(ctx, &kvpoolv1.DeletePolicyRequest{Tenant: tenant})
				return err
			})
		},
	}
	f.register(c)
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (required)")
	return c
}

func policyJSON(p *kvpoolv1.TenantPolicy) map[string]any {
	return map[string]any{"tenant": p.GetTenant(), "policy": p.GetPolicy(), "quota_bytes": p.GetQuotaBytes(),
		"high_watermark": p.GetHighWatermark(), "low_watermark": p.GetLowWatermark(), "default_ttl_seconds": p.GetDefaultTtlSeconds()}
}

func printPolicies(w io.Writer, ps []*kvpoolv1.TenantPolicy) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tPOLICY\tQUOTA\tHIGH\tLOW\tTTL")
	for _, p := range ps {
		quota, ttl := "none", "never"
		if q := p.GetQuotaBytes(); q > 0 {
			quota = humanBytes(uint64(q))
		}
		if s := p.GetDefaultTtlSeconds(); s > 0 {
			ttl = time.Duration(s * float64(time.Second)).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.2f\t%s\n", p.GetTenant(), p.GetPolicy(), quota, p.GetHighWatermark(), p.GetLowWatermark(), ttl)
	}
	tw.Flush()
}

// printTenants shows a node's per-tenant usage and what eviction did.
func printTenants(w io.Writer, node string, ts []*kvpoolv1.TenantStats) {
	if len(ts) == 0 {
		return
	}
	fmt.Fprintf(w, "tenants on %s:\n", node)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tPOLICY\tQUOTA\tSTORED\tBLOCKS\tHITS\tMISSES\tEVICTED (quota/pressure/ttl)\tREJECTED")
	for _, t := range ts {
		quota := "none"
		if q := t.GetQuotaBytes(); q > 0 {
			quota = humanBytes(uint64(q))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d/%d/%d\t%d\n", t.GetTenant(), t.GetPolicy(), quota, humanBytes(t.GetStoredBytes()),
			t.GetBlocks(), t.GetHits(), t.GetMisses(), t.GetQuotaEvictions(), t.GetPressureEvictions(), t.GetExpirations(), t.GetRejected())
	}
	tw.Flush()
}

func tenantsJSON(ts []*kvpoolv1.TenantStats) []map[string]any {
	out := []map[string]any{}
	for _, t := range ts {
		out = append(out, map[string]any{"tenant": t.GetTenant(), "policy": t.GetPolicy(), "quota_bytes": t.GetQuotaBytes(),
			"stored_bytes": t.GetStoredBytes(), "blocks": t.GetBlocks(), "hits": t.GetHits(), "misses": t.GetMisses(),
			"quota_evictions": t.GetQuotaEvictions(), "pressure_evictions": t.GetPressureEvictions(), "expirations": t.GetExpirations(),
			"rejected": t.GetRejected(), "policy_applied_unix_ms": t.GetPolicyAppliedUnixMs()})
	}
	return out
}
