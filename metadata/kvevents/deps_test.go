package kvevents

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// The decoder is pure: no goroutines, locks, clock or I/O, and nothing of
// kvpool's.
func TestDeps(t *testing.T) {
	deptest.CheckPure(t, ".")
}
