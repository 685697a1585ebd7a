package embedded

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps keeps the embedded server a leaf that cmd and tests start: it
// knows nothing of the node, the transports or the programs around it.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{Forbidden: []string{
		"github.com/kvpool/kvpool/pool/...",
		"github.com/kvpool/kvpool/transfer/...",
		"github.com/kvpool/kvpool/cmd/...",
		"github.com/kvpool/kvpool/test/...",
	}})
}
