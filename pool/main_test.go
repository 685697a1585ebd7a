package pool

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestMain checks that no goroutine outlives the package's tests: every
// node stops what it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDeps pins pool's place in the import graph: it wires api, eviction,
// metadata and transfer together, and links neither etcd's server (the
// embedded one lives in metadata/embedded, for cmd and tests) nor anything
// above it.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{Forbidden: []string{
		"go.etcd.io/etcd/server/v3/...",
		"github.com/kvpool/kvpool/metadata/embedded",
		"github.com/kvpool/kvpool/pool/bench",
		"github.com/kvpool/kvpool/cmd/...",
		"github.com/kvpool/kvpool/test/...",
		"github.com/kvpool/kvpool/internal/...",
	}})
}
