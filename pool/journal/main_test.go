package journal

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: the
// journal starts none, and the tests' own must all end.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
