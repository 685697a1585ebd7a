package api

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps keeps the client small for engines to embed: the generated
// stubs, gRPC and the standard library, none of the node's packages or
// their dependencies (etcd, memberlist, Prometheus, eviction).
func TestDeps(t *testing.T) {
	for _, pkg := range []string{".", "./wire", "./kvpool/v1"} {
		deptest.Check(t, deptest.Rules{Package: pkg, Forbidden: []string{
			"github.com/kvpool/kvpool/pool/...",
			"github.com/kvpool/kvpool/metadata/...",
			"github.com/kvpool/kvpool/transfer/...",
			"github.com/kvpool/kvpool/eviction/...",
			"github.com/kvpool/kvpool/cmd/...",
			"github.com/kvpool/kvpool/test/...",
			"go.etcd.io/...",
			"github.com/hashicorp/...",
			"github.com/prometheus/...",
			"github.com/dgraph-io/...",
		}})
	}
}
