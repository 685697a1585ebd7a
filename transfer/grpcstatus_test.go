package transfer

import (
	"go/build"
	"slices"
	"testing"
)

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
