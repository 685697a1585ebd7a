package sim

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// The simulator is pure: no goroutines, no locks, no clock, no I/O but the
// reader a trace comes from, and of kvpool only the cost model and the
// eviction policies.
func TestDeps(t *testing.T) {
	deptest.CheckPure(t, ".", "github.com/kvpool/kvpool/transfer/cost", "github.com/kvpool/kvpool/eviction")
}
