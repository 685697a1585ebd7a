package eviction

import (
	"testing"

	"github.com/kvpool/kvpool/internal/deptest"
)

// TestDeps keeps the package pure: it imports only the standard library
// and ristretto's z, and its non-test code starts no goroutine, takes no
// lock, does no I/O and reads no clock.
func TestDeps(t *testing.T) {
	deptest.CheckPure(t, ".", "github.com/dgraph-io/ristretto/v2/z")
}
