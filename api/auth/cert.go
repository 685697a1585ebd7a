package auth

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"

	"github.com/kvpool/kvpool/api"
)

// DefaultTrustDomain is the SPIFFE trust domain of identities in
// certificates when none is configured.
const DefaultTrustDomain = "kvpool"

// URI returns the SPIFFE-style URI that names id in a certificate's URI
// SAN: spiffe://DOMAIN/tenant/TENANT, spiffe://DOMAIN/node/ID or
// spiffe://DOMAIN/admin/NAME.
func URI(id Identity, trustDomain string) *url.URL {
	path := "/admin/" + id.Name
	switch id.Role {
	case RoleTenant:
		path = "/tenant/" + id.Tenant
	case RoleNode:
		path = "/node/" + id.Name
	}
	return &url.URL{Scheme: "spiffe", Host: trustDomain, Path: path}
}

// FromCertificate reads the identity of a verified client certificate:
// from its first spiffe:// URI SAN in trustDomain (see URI), or, without
// one, from its subject common name written tenant:TENANT, node:ID or
// admin:NAME. A certificate that names none is an error wrapping
// api.ErrUnauthenticated. The caller verifies the chain first (TLS does).
func FromCertificate(cert *x509.Certificate, trustDomain string) (Identity, error) {
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		if u.Host != trustDomain {
			return Identity{}, fmt.Errorf("%w: certificate identity %s is not in trust domain %q", api.ErrUnauthenticated, u, trustDomain)
		}
		kind, name, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		if !ok {
			return Identity{}, fmt.Errorf("%w: certificate identity %s: want /tenant/NAME, /node/ID or /admin/NAME", api.ErrUnauthenticated, u)
		}
		return identityOf(kind, name, u.String())
	}
	kind, name, ok := strings.Cut(cert.Subject.CommonName, ":")
	if !ok {
		return Identity{}, fmt.Errorf("%w: certificate %q names no kvpool identity (a spiffe://%s/... URI SAN, or a CN of tenant:NAME, node:ID or admin:NAME)",
			api.ErrUnauthenticated, cert.Subject.CommonName, trustDomain)
	}
	return identityOf(kind, name, "CN "+cert.Subject.CommonName)
}

func identityOf(kind, name, what string) (Identity, error) {
	var id Identity
	switch kind {
	case "tenant":
		id = Identity{Role: RoleTenant, Tenant: name, Name: "cert:" + name}
	case "node":
		id = Identity{Role: RoleNode, Name: name}
	case "admin":
		id = Identity{Role: RoleAdmin, Name: name}
	default:
		return Identity{}, fmt.Errorf("%w: certificate identity %s: unknown kind %q (want tenant, node or admin)", api.ErrUnauthenticated, what, kind)
	}
	if err := api.ValidateName(kind, name); err != nil {
		return Identity{}, fmt.Errorf("%w: certificate identity %s: %v", api.ErrUnauthenticated, what, err)
	}
	return id, nil
}
