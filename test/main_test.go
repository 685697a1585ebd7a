package test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain removes the binary the end-to-end tests built, and checks that
// no goroutine outlives the clusters and daemons the tests started.
//
// With KVPOOL_TEST_HELPER set, the binary is instead a helper process that
// a test starts and kills (runHelper).
func TestMain(m *testing.M) {
	if role := os.Getenv("KVPOOL_TEST_HELPER"); role != "" {
		os.Exit(runHelper(role))
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if code == 0 {
		// zmq4's PUB writer can miss its Close's signal when it is
		// sending then, and waits forever; only the benchmarks' Go
		// publisher has one (the daemon subscribes, never publishes).
		//
		// etcd's member Close stops the server, closing its backend,
		// before it shuts its peer listener. A peer's version poll that
		// lands between the two panics inside the backend's read with a
		// lock held; net/http recovers the panic, and the next poll
		// waits on that lock forever. Only a multi-member cluster
		// (TestThreeMemberEtcdLosesAMember) polls peers.
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
			goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.newPeerHandler.versionHandler.func1"),
		); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
