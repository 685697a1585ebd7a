package metadata

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them. No
// goroutine is ignored: every test closes what it started (members,
// mirrors and gossip stop with their Run, clients and the embedded etcd
// server are closed in t.Cleanup), and the libraries underneath (etcd's
// client and server, gRPC, memberlist) then stop all of theirs, so
// anything left over is a leak to fix, not noise.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
