package disk

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the package's tests: every
// test waits for the Run it started, and Open's scanners end with it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
