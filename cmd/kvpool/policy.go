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
	"github.com/kvpool/kvpool/api/admin"
	"github.com/kvpool/kvpool/eviction"
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

func policySetCmd(e *env) *cobra.Command {
	var f clientFlags
	var p admin.Policy
	var ttl time.Duration
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
			if ttl < 0 {
				errs = append(errs, fmt.Errorf("--ttl %v must not be negative", ttl))
			}
			if p.DiskAdmitReads < 0 || p.DiskAdmitReads > eviction.MaxDiskAdmitReads {
				errs = append(errs, fmt.Errorf("--disk-admit-reads %d: want 1 to %d", p.DiskAdmitReads, eviction.MaxDiskAdmitReads))
			}
			if p.DiskQuotaBytes < 0 {
				errs = append(errs, fmt.Errorf("--disk-quota %d must not be negative", p.DiskQuotaBytes))
			}
			p.DefaultTTLSeconds = ttl.Seconds()
			if err := errors.Join(errs...); err != nil {
				return usage(err)
			}
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				stored, err := a.SetPolicy(ctx, p)
				if err != nil || f.asJSON {
					return printOr(e, err, stored)
				}
				printPolicies(e.stdout, []admin.Policy{stored})
				fmt.Fprintln(e.stdout, "stored; every daemon applies it on its next etcd watch event (milliseconds)")
				return nil
			})
		},
	}
	adminFlags(c, &f)
	fl := c.Flags()
	fl.StringVar(&p.Tenant, "tenant", "", "tenant (required)")
	fl.StringVar(&p.Kind, "policy", "", "lru, lfu, fifo, ttl or prefix-lru (required)")
	fl.Var(sizeV(&p.QuotaBytes), "quota", "per-node quota, e.g. 16GiB; 0 for none (required)")
	fl.DurationVar(&ttl, "ttl", 0, "blocks expire this long after they are stored; 0 means never")
	fl.Float64Var(&p.High, "high", 0, "high watermark, a fraction of the quota (default 0.95)")
	fl.Float64Var(&p.Low, "low", 0, "low watermark, a fraction of the quota (default 0.85)")
	fl.BoolVar(&p.NoDisk, "no-disk", false, "keep the tenant's blocks off the nodes' disk tiers (--disk-dir)")
	fl.IntVar(&p.DiskAdmitReads, "disk-admit-reads", 0, "copy a block to the node's disk tier once it has been read this many times in memory, 1 to 127 (default 2)")
	fl.Var(sizeV(&p.DiskQuotaBytes), "disk-quota", "most the tenant keeps on one node's disk tier, e.g. 1TiB; 0 for no cap")
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
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				p, err := a.Policy(ctx, tenant)
				if err != nil || f.asJSON {
					return printOr(e, err, p)
				}
				printPolicies(e.stdout, []admin.Policy{p})
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
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error {
				ps, err := a.Policies(ctx)
				if err != nil || f.asJSON {
					return printOr(e, err, ps)
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
			return f.withAdmin(cmd, func(ctx context.Context, a *admin.Client) error { return a.DeletePolicy(ctx, tenant) })
		},
	}
	adminFlags(c, &f)
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (required)")
	return c
}

func printPolicies(w io.Writer, ps []admin.Policy) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tPOLICY\tQUOTA\tHIGH\tLOW\tTTL\tDISK")
	for _, p := range ps {
		ttl := "never"
		if p.DefaultTTLSeconds > 0 {
			ttl = time.Duration(p.DefaultTTLSeconds * float64(time.Second)).String()
		}
		disk := "off"
		if !p.NoDisk {
			disk = fmt.Sprintf("after %d reads, quota %s", max(p.DiskAdmitReads, 1), quota(p.DiskQuotaBytes))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%.2f\t%s\t%s\n", p.Tenant, p.Kind, quota(p.QuotaBytes), p.High, p.Low, ttl, disk)
	}
	tw.Flush()
}
