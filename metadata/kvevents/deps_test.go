package kvevents

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// The decoder and the index are pure: no goroutines, locks, clock or
// I/O, and of kvpool only the chain keys.
func TestDeps(t *testing.T) {
	deptest.CheckPure(t, ".", "github.com/kvpool/kvpool/api/chain")
}
