package transfer

import (
	"go/build"
	"slices"
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps pins transfer's place in the import graph: below pool, beside
// metadata, above api. It moves bytes and measures links; it needs
// neither the cost model nor anything of the control plane.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{Forbidden: []string{
		"github.com/kvpool/kvpool/pool/...",
		"github.com/kvpool/kvpool/metadata/...",
		"github.com/kvpool/kvpool/eviction/...",
		"github.com/kvpool/kvpool/cmd/...",
		"github.com/kvpool/kvpool/test/...",
		"github.com/kvpool/kvpool/transfer/cost",
		"go.etcd.io/...",
		"github.com/hashicorp/memberlist",
	}})
}

// gRPC codes belong to api's one table (api.ToStatus, api.FromStatus,
// api.Code): no non-test file here imports them. grpc itself imports
// both, so this checks direct imports, which deptest does not.
func TestNoGRPCStatusImports(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"google.golang.org/grpc/codes", "google.golang.org/grpc/status"} {
		if slices.Contains(pkg.Imports, p) {
			t.Errorf("a non-test file imports %s; convert errors with api.ToStatus and api.FromStatus", p)
		}
	}
}
