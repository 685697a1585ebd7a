package transfer

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine is still running
// after them: every transport, server and wrapper a test opens must be
// closed, and Close must wait for what it started.
//
// No goroutine is ignored: grpc-go starts none of its own that outlive a
// closed ClientConn and a stopped Server (goleak retries while their
// goroutines finish), and the standard library's are filtered by goleak
// itself. Add an IgnoreTopFunction here, saying whose it is, only for a
// library goroutine that cannot be stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
