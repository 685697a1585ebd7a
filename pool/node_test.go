package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/api/wire"
	"github.com/kvpool/kvpool/internal/eventually"
)

// startNode runs a node for the test's duration and returns it.
func startNode(t testing.TB, mutate ...func(*Config)) *Node {
	t.Helper()
	cfg := TestConfig(fmt.Sprintf("n%d", rand.Uint32()), 64<<20)
	cfg.ShmSocket = filepath.Join(t.TempDir(), "shm.sock")
	if tt, ok := t.(*testing.T); ok {
		cfg.Logger = slog.New(slog.NewTextHandler(tt.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	for _, m := range mutate {
		m(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	<-n.Ready()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node run: %v", err)
		}
		if err := n.Store().Check(); err != nil {
			t.Errorf("store inconsistent at the end: %v", err)
		}
		n.Close()
	})
	return n
}

func dial(t testing.TB, n *Node, path api.Path) *api.Client {
	t.Helper()
	c, err := api.Dial(context.Background(), api.ClientConfig{Server: n.Addr().String(), Path: path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func value(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestPutGetEveryPath(t *testing.T) {
	n := startNode(t)
	for _, path := range []api.Path{api.PathShm, api.PathData, api.PathGRPC} {
		t.Run(path.String(), func(t *testing.T) {
			c := dial(t, n, path)
			if c.Path() != path {
				t.Fatalf("client chose %v, want %v", c.Path(), path)
			}
			ctx := context.Background()
			for i, size := range []int{1, 4095, 4096, 4097, 1 << 20, 2<<20 + 3} {
				k := api.BlockKey{Tenant: "t", Namespace: "ns-" + path.String(), Key: []byte{byte(i)}}
				v := value(uint64(i), size)
				if err := c.Put(ctx, k, v); err != nil {
					t.Fatalf("put %d bytes: %v", size, err)
				}
				got := make([]byte, size+10)
				m, err := c.Get(ctx, k, got)
				if err != nil || !bytes.Equal(got[:m], v) {
					t.Fatalf("get %d bytes: n=%d err=%v equal=%v", size, m, err, bytes.Equal(got[:m], v))
				}
				res, err := c.PutResult(ctx, k, v)
				if err != nil || !res.Existed {
					t.Fatalf("re-put of equal bytes: %+v %v", res, err)
				}
				v2 := bytes.Clone(v)
				v2[len(v2)-1]++
				if err := c.Put(ctx, k, v2); !errors.Is(err, api.ErrAlreadyExists) {
					t.Fatalf("re-put of different bytes: %v, want AlreadyExists", err)
				}
				if err := c.Remove(ctx, k); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Get(ctx, k, got); !errors.Is(err, api.ErrNotFound) {
					t.Fatalf("get after remove: %v, want NotFound", err)
				}
			}
		})
	}
}

func TestLockMemory(t *testing.T) {
	n := startNode(t, func(c *Config) { c.CapacityBytes = 4 << 20; c.MaxBlockBytes = 1 << 20; c.LockMemory = true })
	c := dial(t, n, api.PathData)
	st, err := c.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !st.MemoryLocked {
		t.Fatal("--lock-memory did not lock the arena")
	}
}

func TestConfigValidationReportsEveryProblem(t *testing.T) {
	cfg := Config{NodeID: "bad id"}
	cfg.CapacityBytes, cfg.PageBytes, cfg.MaxBlockBytes, cfg.GetChunkBytes = 1000, 3000, 1<<40, 1
	cfg.TCPCongestion = "nosuchcc"
	_, err := New(cfg)
	if err == nil {
		t.Fatal("New accepted a bad config")
	}
	for _, want := range []string{"node id", "page size", "capacity", "max block size", "get chunk", "congestion control \"nosuchcc\""} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := New(TestConfig("ok", 1<<20)); err != nil {
		t.Fatalf("TestConfig rejected: %v", err)
	}
}

func TestSecondNodeOnTheSameShmSocketFails(t *testing.T) {
	n := startNode(t)
	cfg := TestConfig("other", 1<<20)
	cfg.ShmSocket = n.ShmSocket()
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second node on a live socket: %v", err)
	}
}

func TestRemoveMany(t *testing.T) {
	n := startNode(t)
	ctx := context.Background()
	for _, path := range []api.Path{api.PathData, api.PathGRPC, api.PathShm} {
		t.Run(path.String(), func(t *testing.T) {
			c := dial(t, n, path)
			var keys [][]byte
			for i := range 300 {
				k := []byte(fmt.Sprintf("rm-%d", i))
				keys = append(keys, k)
				if i%3 == 0 {
					continue // left missing: skipped, not an error
				}
				if err := c.Put(ctx, api.BlockKey{Tenant: "t", Namespace: path.String(), Key: k}, []byte("v")); err != nil {
					t.Fatal(err)
				}
			}
			removed, err := c.RemoveMany(ctx, "t", path.String(), keys)
			if err != nil || removed != 200 {
				t.Fatalf("RemoveMany = %d, %v; want 200, nil", removed, err)
			}
			ex, err := c.Exists(ctx, "t", path.String(), keys)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range ex {
				if e {
					t.Fatalf("key %d still exists", i)
				}
			}
			if _, err := c.RemoveMany(ctx, "t", "bad ns", keys[:1]); !errors.Is(err, api.ErrInvalidArgument) {
				t.Fatalf("bad namespace: %v", err)
			}
		})
	}
}

// TestServicesReportEveryFailure: however many of a node's services fail
// at once, Wait returns all their errors; none blocks reporting (with a
// fixed-size error channel the ninth would wait forever, which synctest
// reports as a deadlock at once).
func TestServicesReportEveryFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		g := services{cancel: cancel}
		const n = 20
		for i := range n {
			g.Go(fmt.Sprintf("service %d", i), func() error {
				<-ctx.Done() // all but the first fail as the node stops
				return fmt.Errorf("failure %d", i)
			})
		}
		g.Go("the first", func() error { return errors.New("it broke") })
		err := g.Wait()
		for i := range n {
			if !strings.Contains(err.Error(), fmt.Sprintf("pool: service %d: failure %d", i, i)) {
				t.Errorf("Wait's error lacks service %d: %v", i, err)
			}
		}
		if !strings.Contains(err.Error(), "pool: the first: it broke") {
			t.Errorf("Wait's error lacks the first failure: %v", err)
		}
	})
}

// TestShutdownWhileConnecting stops nodes while clients keep opening
// connections: every connection accepted before shutdown is closed and its
// goroutine waited for (the race detector flags a goroutine added to the
// wait group after the wait began), and Run returns cleanly.
func TestShutdownWhileConnecting(t *testing.T) {
	for range 10 {
		cfg := TestConfig(fmt.Sprintf("n%d", rand.Uint32()), 4<<20)
		cfg.DisableShm = true
		n, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- n.Run(ctx) }()
		<-n.Ready()
		var wg sync.WaitGroup
		var dialed atomic.Int64
		stop := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					c, err := net.Dial("tcp", n.Addr().String())
					if err != nil {
						continue
					}
					dialed.Add(1)
					c.Write(wire.Preamble[:])
					c.Close()
				}
			})
		}
		// Shut down while the connections flow.
		eventually.True(t, "connections to flow", 10*time.Second, func() bool { return dialed.Load() > 20 })
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("run: %v", err)
		}
		close(stop)
		wg.Wait()
		n.Close()
	}
}

// TestTasksRefuseAfterClose: a goroutine is either started before
// closeAndWait begins waiting, and waited for, or refused; none starts
// after the wait.
func TestTasksRefuseAfterClose(t *testing.T) {
	for range 50 {
		var ts tasks
		var running, late atomic.Int64
		var closed atomic.Bool
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for ts.Go(func() {
					if closed.Load() {
						late.Add(1)
					}
					running.Add(1)
					running.Add(-1)
				}) {
				}
			})
		}
		ts.closeAndWait()
		closed.Store(true)
		if n := running.Load(); n != 0 {
			t.Fatalf("%d tasks still running after closeAndWait", n)
		}
		wg.Wait()
		if n := late.Load(); n != 0 {
			t.Fatalf("%d tasks started after closeAndWait returned", n)
		}
	}
}
