package chain

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps: chain hashing is part of what engines embed; it needs api's
// sentinel errors and none of the node's packages.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{Forbidden: []string{"github.com/kvpool/kvpool/pool/...", "github.com/kvpool/kvpool/metadata/...",
		"github.com/kvpool/kvpool/transfer/...", "github.com/kvpool/kvpool/cmd/...", "github.com/kvpool/kvpool/test/..."}})
}
