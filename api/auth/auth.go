// Package auth says who a caller of a node is and what it may do: the
// identities (a tenant, a peer node, an admin, or nobody), how they are
// read from a client certificate or a bearer token, and the one table of
// which identity may do which operation on whose blocks.
//
// The identities and the access table are pure: no goroutines, no clock
// (callers pass the time), no I/O beyond the reader a token file is parsed
// from. The node enforces them at every door (package pool); clients only
// present credentials. CA (ca.go) makes the certificates of a test or
// small cluster, and writes them to files: for kvpool auth certs, the
// benchmarks and the tests.
package auth

import (
	"errors"
	"fmt"

	"github.com/kvpool/kvpool/api"
)

// Role is what kind of caller an identity is.
type Role uint8

const (
	// RoleAnonymous is a caller that presented no credentials: it may
	// pass only a node that runs open (no credentials configured).
	RoleAnonymous Role = iota
	// RoleTenant may touch only its own tenant's blocks, leases, stats
	// and plans.
	RoleTenant
	// RoleNode is a peer daemon: transfers and replication between nodes,
	// and what a node asks of another on a tenant's behalf (Fetch, Route).
	RoleNode
	// RoleAdmin may do everything but move raw arena bytes: policies,
	// admin RPCs, every tenant's blocks and stats.
	RoleAdmin
)

var roleNames = [...]string{"anonymous", "tenant", "node", "admin"}

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return fmt.Sprintf("role(%d)", r)
}

// Identity is an authenticated caller.
type Identity struct {
	Role Role
	// Tenant is the tenant a RoleTenant identity acts for; empty for the
	// other roles.
	Tenant string
	// Name says which credential it is, for logs and audit: a node id, an
	// admin's name, a token's name. Never secret.
	Name string
}

func (id Identity) String() string {
	switch id.Role {
	case RoleTenant:
		return fmt.Sprintf("tenant %s (%s)", id.Tenant, id.Name)
	case RoleAnonymous:
		return "anonymous"
	}
	return fmt.Sprintf("%s %s", id.Role, id.Name)
}

// Op is a kind of operation, as the access table groups them.
type Op uint8

const (
	// OpInfo: Info, health checks. Any authenticated caller.
	OpInfo Op = iota
	// OpRead reads a tenant's blocks or where they are: Get, BatchGet,
	// Exists, Locate (and its read lease), views.
	OpRead
	// OpWrite writes or removes a tenant's blocks: Put, BatchPut, Remove,
	// reservations and their commits.
	OpWrite
	// OpPlan asks where a tenant's request should run, or makes its blocks
	// local: Plan, Estimate, Route, Fetch.
	OpPlan
	// OpStats reads node statistics; a tenant sees only its own.
	OpStats
	// OpReportLoad reports an engine's queue and load: the engine on the
	// node, which acts for its tenant or as admin.
	OpReportLoad
	// OpTransfer moves arena bytes between nodes (the KVPT endpoint,
	// replication pushes): nodes only.
	OpTransfer
	// OpAdminRead reads the cluster: nodes, blocks, links, policies.
	OpAdminRead
	// OpAdminWrite changes policies.
	OpAdminWrite
)

var opNames = [...]string{"info", "read", "write", "plan", "stats", "report-load", "transfer", "admin-read", "admin-write"}

func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", o)
}

// Ops lists every operation, in order, for tables and tests.
func Ops() []Op {
	out := make([]Op, len(opNames))
	for i := range out {
		out[i] = Op(i)
	}
	return out
}

// Errors of Authorize. They wrap api.ErrUnauthenticated and
// api.ErrPermissionDenied, which map to the gRPC codes of those names.
var (
	errNoCredentials = fmt.Errorf("%w: no credentials", api.ErrUnauthenticated)
)

// Authorize decides whether id may do op on tenant's blocks (tenant is
// empty for operations on no tenant's blocks: info, transfers, admin). It
// returns nil, or an error wrapping api.ErrUnauthenticated (an anonymous
// caller where credentials are required) or api.ErrPermissionDenied.
//
// open is true when the node runs without credentials configured: then
// every caller, anonymous included, may do everything, as before
// authentication existed.
func Authorize(id Identity, op Op, tenant string, open bool) error {
	if open {
		return nil
	}
	switch id.Role {
	case RoleAdmin:
		// Everything but raw arena bytes: those move between nodes only.
		if op != OpTransfer {
			return nil
		}
	case RoleAnonymous:
		return errNoCredentials
	case RoleNode:
		switch op {
		case OpInfo, OpRead, OpWrite, OpPlan, OpTransfer:
			// A peer fetches, routes and replicates for a tenant whose
			// own node was asked: the tenant was checked there.
			return nil
		}
	case RoleTenant:
		switch op {
		case OpInfo, OpStats, OpReportLoad:
			return nil
		case OpRead, OpWrite, OpPlan:
			if tenant == id.Tenant {
				return nil
			}
			return fmt.Errorf("%w: %s may not %s tenant %q's blocks", api.ErrPermissionDenied, id, op, tenant)
		}
	}
	return fmt.Errorf("%w: %s may not %s", api.ErrPermissionDenied, id, op)
}

// IsDenied reports whether err is an authorization failure of either kind.
func IsDenied(err error) bool {
	return errors.Is(err, api.ErrUnauthenticated) || errors.Is(err, api.ErrPermissionDenied)
}
