package pool

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the package's tests: every
// node stops what it started.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
