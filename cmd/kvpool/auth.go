package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/auth"
)

func authCmd(e *env) *cobra.Command {
	return noun("auth", "Make the certificates and tokens that identify tenants, nodes and admins", authCertsCmd(e), authTokenCmd(e))
}

func authCertsCmd(e *env) *cobra.Command {
	var dir, domain string
	var nodes, tenants, admins, hosts []string
	var valid time.Duration
	c := &cobra.Command{
		Use:   "certs",
		Short: "Make a CA and certificates for nodes, tenants and admins of a test cluster",
		Long: `certs makes, in --dir, a CA (ca.pem, ca-key.pem; an existing one there is
reused) and a certificate and key for each identity asked for, signed by it:

  node-ID.pem, node-ID-key.pem        a node: serves TLS for --host names and
                                      addresses, and identifies the node to
                                      its peers (spiffe://DOMAIN/node/ID)
  tenant-NAME.pem, tenant-NAME-key.pem  a tenant's engines (spiffe://DOMAIN/tenant/NAME)
  admin-NAME.pem, admin-NAME-key.pem    an operator (spiffe://DOMAIN/admin/NAME)

Keys are ECDSA P-256, written mode 0600. Start a node with --tls-cert
node-ID.pem --tls-key node-ID-key.pem --client-ca ca.pem; clients pass
--tls-ca ca.pem --tls-cert tenant-NAME.pem --tls-key tenant-NAME-key.pem.
For production use your own PKI: any CA works, as long as the certificates
carry these URI SANs (or a CN of tenant:NAME, node:ID or admin:NAME).`,
		Example: `  kvpool auth certs --dir certs --node gpu-1,gpu-2 --host 127.0.0.1,gpu-1.example.com --tenant acme --admin ops`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(nodes)+len(tenants)+len(admins) == 0 {
				return usagef("name at least one --node, --tenant or --admin")
			}
			var errs []error
			for _, n := range nodes {
				errs = append(errs, api.ValidateName("--node", n))
			}
			for _, n := range tenants {
				errs = append(errs, api.ValidateName("--tenant", n))
			}
			for _, n := range admins {
				errs = append(errs, api.ValidateName("--admin", n))
			}
			errs = append(errs, api.ValidateName("--trust-domain", domain))
			if valid <= 0 {
				errs = append(errs, errors.New("--valid must be positive"))
			}
			if err := errors.Join(errs...); err != nil {
				return usage(err)
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			ca, err := auth.LoadOrMakeCA(dir, valid)
			if err != nil {
				return err
			}
			issue := func(file string, id auth.Identity, server bool) error {
				if err := ca.Issue(dir, file, id, domain, hosts, server, valid); err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "%s\t%s\n", filepath.Join(dir, file+".pem"), auth.URI(id, domain))
				return nil
			}
			for _, n := range nodes {
				if err := issue("node-"+n, auth.Identity{Role: auth.RoleNode, Name: n}, true); err != nil {
					return err
				}
			}
			for _, n := range tenants {
				if err := issue("tenant-"+n, auth.Identity{Role: auth.RoleTenant, Tenant: n}, false); err != nil {
					return err
				}
			}
			for _, n := range admins {
				if err := issue("admin-"+n, auth.Identity{Role: auth.RoleAdmin, Name: n}, false); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&dir, "dir", "kvpool-certs", "directory to write into (and to find an existing CA in)")
	f.StringSliceVar(&nodes, "node", nil, "node ids to make node certificates for")
	f.StringSliceVar(&tenants, "tenant", nil, "tenants to make client certificates for")
	f.StringSliceVar(&admins, "admin", nil, "admin names to make client certificates for")
	f.StringSliceVar(&hosts, "host", []string{"127.0.0.1", "localhost"}, "DNS names and IP addresses node certificates are valid for")
	f.StringVar(&domain, "trust-domain", auth.DefaultTrustDomain, "SPIFFE trust domain of the identities")
	f.DurationVar(&valid, "valid", 365*24*time.Hour, "how long the certificates are valid")
	return c
}

func authTokenCmd(e *env) *cobra.Command {
	var name, tenant, node, file string
	var admin bool
	var valid time.Duration
	c := &cobra.Command{
		Use:   "token",
		Short: "Make a bearer token for a tenant, node or admin, and the token-file line that grants it",
		Long: `token prints a new bearer token (256 random bits) on stdout, and appends the
line that grants it to --file (the node's --token-file; created mode 0600), or
prints that line on stderr without --file. The file holds only the token's
SHA-256: the token itself is shown once, here. A node re-reads its token file
within a second of a change: delete a line to revoke its token.`,
		Example: `  kvpool auth token --name engine-1 --tenant acme --file /etc/kvpool/tokens > engine-1.token
  kvpool auth token --name ops --admin --valid 720h`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var id auth.Identity
			switch {
			case tenant != "" && node == "" && !admin:
				id = auth.Identity{Role: auth.RoleTenant, Tenant: tenant}
			case node != "" && tenant == "" && !admin:
				id = auth.Identity{Role: auth.RoleNode, Name: node}
			case admin && tenant == "" && node == "":
				id = auth.Identity{Role: auth.RoleAdmin}
			default:
				return usagef("give exactly one of --tenant, --node or --admin")
			}
			var expires time.Time
			if valid > 0 {
				expires = time.Now().Add(valid).Truncate(time.Second)
			}
			tok, line, err := auth.NewToken(name, id, expires)
			if err != nil {
				return usage(err)
			}
			if file == "" {
				fmt.Fprintln(e.stderr, line)
			} else {
				f, err := os.OpenFile(file, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintln(f, line); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
			}
			fmt.Fprintln(e.stdout, tok)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&name, "name", "", "the token's name in the file and in logs, [A-Za-z0-9._-] (required)")
	f.StringVar(&tenant, "tenant", "", "the tenant the token acts for")
	f.StringVar(&node, "node", "", "the node id the token identifies")
	f.BoolVar(&admin, "admin", false, "the token is an admin's")
	f.StringVar(&file, "file", "", "token file to append the grant to")
	f.DurationVar(&valid, "valid", 0, "how long the token works (default: until revoked)")
	return c
}
