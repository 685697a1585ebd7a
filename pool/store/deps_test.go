package store

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps pins the store below the node: it keeps blocks in an arena it
// is handed, and knows nothing of the cluster, the transports or the
// doors that call it.
func TestDeps(t *testing.T) {
	deptest.Check(t, deptest.Rules{Forbidden: []string{
		"github.com/kvpool/kvpool/pool",
		"github.com/kvpool/kvpool/pool/bench",
		"github.com/kvpool/kvpool/metadata/...",
		"github.com/kvpool/kvpool/transfer/...",
		"github.com/kvpool/kvpool/cmd/...",
		"github.com/kvpool/kvpool/test/...",
		"go.etcd.io/...",
		"github.com/hashicorp/...",
		"github.com/prometheus/...",
	}})
}
