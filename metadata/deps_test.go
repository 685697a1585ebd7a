package metadata

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps pins metadata below the node: it talks to etcd as a client only
// (the server lives in metadata/embedded, for cmd and tests), and it knows
// nothing of pool, the transports, the eviction policies or the programs
// and tests built on them.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{Forbidden: []string{
		"go.etcd.io/etcd/server/v3/...",
		"github.com/kvpool/kvpool/metadata/embedded",
		"github.com/kvpool/kvpool/pool/...",
		"github.com/kvpool/kvpool/transfer/...",
		"github.com/kvpool/kvpool/eviction/...",
		"github.com/kvpool/kvpool/cmd/...",
		"github.com/kvpool/kvpool/test/...",
	}})
}
