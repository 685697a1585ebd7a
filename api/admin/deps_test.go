package admin

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps: the operator's client is api's, over gRPC, and none of the
// node's packages.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{Forbidden: []string{"github.com/kvpool/kvpool/pool/...", "github.com/kvpool/kvpool/metadata/...",
		"github.com/kvpool/kvpool/transfer/...", "github.com/kvpool/kvpool/cmd/...", "github.com/kvpool/kvpool/test/...", "go.etcd.io/..."}})
}
