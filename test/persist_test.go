package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/eventually"
	"github.com/kvpool/kvpool/pool/journal"
)

// persistentServe runs `kvpool node serve` over a data directory and a
// segment file the test removes at the end (it outlives the daemon on
// purpose).
func persistentServe(t *testing.T) (start func() *server, dataDir string) {
	dataDir = filepath.Join(t.TempDir(), "data")
	segment := fmt.Sprintf("/dev/shm/kvpool-test-%d", rand.Uint64())
	t.Cleanup(func() { os.Remove(segment) })
	args := []string{"--standalone", "--capacity", "64MiB", "--data-dir", dataDir, "--segment-path", segment, "--journal-flush-interval", "10ms"}
	return func() *server { return startServe(t, args...) }, dataDir
}

// sigterm stops s as an operator does and waits for it (the exit stays
// for the cleanup).
func sigterm(t *testing.T, s *server) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	err := <-s.done
	s.done <- err
	if err != nil {
		t.Fatalf("serve after SIGTERM: %v", err)
	}
}

// A daemon stopped with SIGTERM and started again with the same command
// line serves every block it held; one killed with SIGKILL in the middle
// of puts serves every block its journal had flushed, and never a block
// whose bytes differ from what was put.
func TestRestartKeepsBlocksAcrossProcesses(t *testing.T) {
	start, dataDir := persistentServe(t)
	s := start()
	c := dialPath(t, s.addr, api.PathData)
	ctx := context.Background()
	const size = 200 << 10
	key := func(i int) api.BlockKey {
		return api.BlockKey{Tenant: "acme", Namespace: "persist", Key: fmt.Appendf(nil, "b%04d", i)}
	}
	for i := range 40 {
		if err := c.Put(ctx, key(i), killValue(17, i, size)); err != nil {
			t.Fatal(err)
		}
	}
	sigterm(t, s)

	s = start()
	c = dialPath(t, s.addr, api.PathData)
	keys := make([]api.BlockKey, 0, 200)
	values := make([][]byte, 0, 200)
	for i := range 40 {
		keys, values = append(keys, key(i)), append(values, killValue(17, i, size))
	}
	if whole := wholeOrAbsent(t, c, keys, values); whole != 40 {
		t.Fatalf("after SIGTERM and a restart: %d of 40 blocks", whole)
	}

	// Puts from another goroutine; the daemon dies under them once the
	// journal on disk holds the first 40 and some more.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		pc := dialPath(t, s.addr, api.PathShm)
		for i := 40; i < 200; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if pc.Put(ctx, key(i), killValue(17, i, size)) != nil {
				return // the daemon died
			}
		}
	})
	journaled := func() int {
		_, r, err := journal.Read(filepath.Join(dataDir, "index.journal"))
		if err != nil {
			return 0
		}
		return len(r.Blocks)
	}
	eventually.True(t, "the journal on disk to hold 60 blocks", 30*time.Second, func() bool { return journaled() >= 60 })
	kill9(s)
	close(stop)
	wg.Wait()
	onDisk := journaled()
	for i := 40; i < 200; i++ {
		keys, values = append(keys, key(i)), append(values, killValue(17, i, size))
	}

	s = start()
	c = dialPath(t, s.addr, api.PathData)
	whole := wholeOrAbsent(t, c, keys, values) // fails the test on any wrong byte
	if whole < onDisk {
		t.Fatalf("after kill -9: %d whole blocks, but the journal on disk held %d", whole, onDisk)
	}
	t.Logf("after kill -9 in the middle of puts: %d blocks whole (the journal on disk held %d), the rest absent", whole, onDisk)
}
