package pool

import (
	"bytes"
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/internal/eventually"
)

// residentPages counts the pages of b that are in memory (mincore).
func residentPages(t *testing.T, b []byte) int {
	t.Helper()
	vec := make([]byte, (len(b)+unix.Getpagesize()-1)/unix.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// A node populates its arena in the background at the configured rate,
// leaving what blocks already hold as it was; with the rate off, pages
// are allocated only where blocks are written.
func TestArenaPopulatesInTheBackground(t *testing.T) {
	const capacity = 64 << 20 // startNode's
	pages := capacity / unix.Getpagesize()
	ctx := context.Background()
	k := api.BlockKey{Tenant: "acme", Namespace: "m", Key: []byte("before")}
	v := value(3, 1<<20)

	t.Run("populated", func(t *testing.T) {
		// 64 MiB at 128 MiB/s: the put below lands before the
		// population has passed it, most of the time.
		n := startNode(t, func(c *Config) { c.PopulateBytesPerSecond = 128 << 20 })
		c := dial(t, n, api.PathData)
		if err := c.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		eventually.True(t, "the arena to be populated", 10*time.Second, func() bool {
			return testutil.ToFloat64(n.metrics.arenaPopulated) == capacity
		})
		if got := residentPages(t, n.seg.mem); got != pages {
			t.Fatalf("%d of %d arena pages resident after the population", got, pages)
		}
		got, err := c.GetValue(ctx, k)
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("the block put before the population: %v, equal %v", err, bytes.Equal(got, v))
		}
	})
	t.Run("off", func(t *testing.T) {
		n := startNode(t, func(c *Config) { c.PopulateBytesPerSecond = -1 })
		c := dial(t, n, api.PathData)
		if err := c.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
		// The block's pages and few more (its spare, the first touch of
		// whatever the store keeps in the arena).
		if got := residentPages(t, n.seg.mem); got > pages/4 {
			t.Fatalf("%d of %d arena pages resident with the population off", got, pages)
		}
		if p := testutil.ToFloat64(n.metrics.arenaPopulated); p != 0 {
			t.Fatalf("kvpool_pool_arena_populated_bytes %v with the population off", p)
		}
	})
	t.Run("prefaulted", func(t *testing.T) {
		n := startNode(t, func(c *Config) { c.Prefault = true })
		if p := testutil.ToFloat64(n.metrics.arenaPopulated); p != capacity {
			t.Fatalf("kvpool_pool_arena_populated_bytes %v for a prefaulted %d-byte arena", p, capacity)
		}
	})
}
