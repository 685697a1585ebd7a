package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
)

func policyCmd(e *env) *cobra.Command {
	c := noun("policy", "Set, show and list per-tenant eviction policies, quotas, watermarks and TTLs",
		policySetCmd(e), policyGetCmd(e), policyListCmd(e), policyDeleteCmd(e))
	c.Long = `policy manages how each tenant's blocks are kept. A policy is stored in etcd and
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
  --ttl      blocks expire this long after they are stored (0: never)`
	return c
}

// policyJSON is the --json shape of a policy.
type policyJSON struct {
	Tenant            string  `json:"tenant"`
	Policy            string  `json:"policy"`
	QuotaBytes        int64   `json:"quota_bytes"`
	HighWatermark     float64 `json:"high_watermark"`
	LowWatermark      float64 `json:"low_watermark"`
	DefaultTTLSeconds float64 `json:"default_ttl_seconds"`
	StoredUnixMs      int64   `json:"stored_unix_ms,omitempty"`
}

func newPolicyJSON(p api.Policy) policyJSON {
	return policyJSON{Tenant: p.Tenant, Policy: p.Kind, QuotaBytes: p.QuotaBytes, HighWatermark: p.High, LowWatermark: p.Low,
		DefaultTTLSeconds: p.DefaultTTL.Seconds()}
}

func policySetCmd(e *env) *cobra.Command {
	var f clientFlags
	var p api.Policy
	c := &cobra.Command{
		Use:     "set",
		Short:   "Set a tenant's policy; every daemon applies it within a second",
		Example: `  kvpool policy set --tenant acme --policy prefix-lru --quota 16GiB --high 0.9 --low 0.7 --ttl 1h`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			errs := []error{api.ValidateName("--tenant", p.Tenant)}
			if p.Kind == "" {
				errs = append(errs, errors.New("--policy is required: lru, lfu, fifo, ttl or prefix-lru"))
			}
			if !cmd.Flags().Changed("quota") {
				errs = append(errs, errors.New("--quota is required: a size such as 16GiB, or 0 for none"))
			}
			if p.DefaultTTL < 0 {
				errs = append(errs, fmt.Errorf("--ttl %v must not be negative", p.DefaultTTL))
			}
			if err := errors.Join(errs...); err != nil {
				return usage(err)
			}
			return f.withAdmin(cmd, func(ctx context.Context, a *api.Admin) error {
				stored, at, err := a.SetPolicy(ctx, p)
				if err != nil {
					return err
				}
				if f.asJSON {
					out := newPolicyJSON(stored)
					out.StoredUnixMs = at.UnixMilli()
					return printJSON(e.stdout, out)
				}
				printPolicies(e.stdout, []api.Policy{stored})
				fmt.Fprintln(e.stdout, "stored; every daemon applies it on its next etcd watch event (milliseconds)")
				return nil
			})
		},
	}
	adminFlags(c, &f)
	fl := c.Flags()
	fl.StringVar(&p.Tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&p.Kind, "policy", "", "lru, lfu, fifo, ttl or prefix-lru (required)")
	fl.Var(sizeFlag{&p.QuotaBytes}, "quota", "per-node quota, e.g. 16GiB; 0 for none (required)")
	fl.DurationVar(&p.DefaultTTL, "ttl", 0, "blocks expire this long after they are stored; 0 means never")
	fl.Float64Var(&p.High, "high", 0, "high watermark, a fraction of the quota (default 0.95)")
	fl.Float64Var(&p.Low, "low", 0, "low watermark, a fraction of the quota (default 0.85)")
	return c
}

func policyGetCmd(e *env) *cobra.Command {
	var f clientFlags
	var tenant string
	c := &cobra.Command{
		Use:   "get",
		Short: "Show a tenant's stored policy",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := api.ValidateName("--tenant", tenant); err != nil {
				return usage(err)
			}
			return f.withAdmin(cmd, func(ctx context.Context, a *api.Admin) error {
				p, err := a.Policy(ctx, tenant)
				if err != nil {
					return err
				}
				if f.asJSON {
					return printJSON(e.stdout, newPolicyJSON(p))
				}
				printPolicies(e.stdout, []api.Policy{p})
				return nil
			})
		},
	}
	adminFlags(c, &f)
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (required)")
	return c
}

func policyListCmd(e *env) *cobra.Command {
	var f clientFlags
	c := &cobra.Command{
		Use:   "list",
		Short: "List every stored tenant policy",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.withAdmin(cmd, func(ctx context.Context, a *api.Admin) error {
				ps, err := a.Policies(ctx)
				if err != nil {
					return err
				}
				if f.asJSON {
					out := []policyJSON{}
					for _, p := range ps {
						out = append(out, newPolicyJSON(p))
					}
					return printJSON(e.stdout, out)
				}
				printPolicies(e.stdout, ps)
				return nil
			})
		},
	}
	adminFlags(c, &f)
	return c
}

func policyDeleteCmd(e *env) *cobra.Command {
	var f clientFlags
	var tenant string
	c := &cobra.Command{
		Use:   "delete",
		Short: "Delete a tenant's policy: its blocks fall back to the node's defaults",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := api.ValidateName("--tenant", tenant); err != nil {
				return usage(err)
			}
			return f.withAdmin(cmd, func(ctx context.Context, a *api.Admin) error { return a.DeletePolicy(ctx, tenant) })
		},
	}
	adminFlags(c, &f)
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (required)")
	return c
}

func printPolicies(w io.Writer, ps []api.Policy) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tPOLICY\tQUOTA\tHIGH\tLOW\tTTL")
	for _, p := range ps {
		ttl := "never"
		if p.DefaultTTL > 0 {
			ttl = p.DefaultTTL.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.2f\t%s\n", p.Tenant, p.Kind, quota(p.QuotaBytes), p.High, p.Low, ttl)
	}
	tw.Flush()
}
