package bench

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps: the bench harness runs nodes (pool) on an etcd it is given;
// only the CLI and tests start etcd servers, and it imports neither.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{Forbidden: []string{"go.etcd.io/etcd/server/v3/...", "github.com/kvpool/kvpool/metadata/embedded",
		"github.com/kvpool/kvpool/cmd/...", "github.com/kvpool/kvpool/test/..."}})
}
