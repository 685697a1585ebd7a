package transfer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// sharedMem returns a memfd of n bytes holding init's bytes, and this
// process's mapping of it.
func sharedMem(t *testing.T, init []byte) (*os.File, []byte) {
	t.Helper()
	fd, err := unix.MemfdCreate("kvpool-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "kvpool-test")
	n := max(len(init), 1)
	if err := f.Truncate(int64(n)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem, init)
	t.Cleanup(func() { unix.Munmap(mem); f.Close() })
	return f, mem[:len(init)]
}

// serveSHM runs server on a unix socket in a temporary directory until the
// returned cancel is called (or the test ends).
func serveSHM(t *testing.T, server *SHM) (addr string, stop func()) {
	t.Helper()
	addr = filepath.Join(t.TempDir(), "shm.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { server.Serve(ctx, ln); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return addr, stop
}

func shmFactory(cfg SHMConfig) factory {
	return func(t *testing.T, mem []byte) pair {
		f, shared := sharedMem(t, mem)
		server := NewSHM(SHMConfig{})
		if err := server.RegisterFile(7, f, 0, uint64(len(shared))); err != nil {
			t.Fatal(err)
		}
		addr, _ := serveSHM(t, server)
		client := NewSHM(cfg)
		t.Cleanup(func() { client.Close(); server.Close() })
		return pair{client: client, peer: addr, mem: shared}
	}
}

func TestSHMConformance(t *testing.T) {
	runConformance(t, shmFactory(SHMConfig{}))
}

func TestSHMConformanceOneWorker(t *testing.T) {
	runConformance(t, shmFactory(SHMConfig{Workers: 1}))
}

func TestSHMRegionLifecycle(t *testing.T) {
	ctx := context.Background()
	server := NewSHM(SHMConfig{})
	defer server.Close()
	if err := server.Register(1, make([]byte, 4096)); !errors.Is(err, ErrNotShareable) {
		t.Fatalf("registering anonymous memory: %v, want ErrNotShareable", err)
	}
	f, mem := sharedMem(t, pattern(1<<20, 9))
	if err := server.RegisterFile(1, f, 100, 4096); err == nil {
		t.Fatal("an unaligned offset was accepted")
	}
	if err := server.RegisterFile(1, f, 4096, 1<<20-4096); err != nil {
		t.Fatal(err)
	}
	if err := server.RegisterFile(1, f, 0, 4096); err == nil {
		t.Fatal("a region id was registered twice")
	}
	addr, stop := serveSHM(t, server)
	client := NewSHM(SHMConfig{})
	defer client.Close()

	// The region starts at the file's offset 4096.
	local := make([]byte, 5000)
	if err := client.Submit(ctx, []Op{{Kind: Read, Peer: addr, Region: 1, Offset: 10, Local: local}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(local, mem[4096+10:4096+10+5000]) {
		t.Fatal("read the wrong bytes of an offset region")
	}
	// Deregistered: the client's existing mapping refuses.
	server.Deregister(1)
	err := client.Submit(ctx, []Op{{Kind: Read, Peer: addr, Region: 1, Local: local}}).Wait(ctx)
	if !errors.Is(err, ErrNoRegion) {
		t.Fatalf("read after Deregister: %v, want ErrNoRegion", err)
	}
	// Re-registered under the same id: the client maps it afresh.
	if err := server.RegisterFile(1, f, 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	client2 := client
	if err := client2.Submit(ctx, []Op{{Kind: Read, Peer: addr, Region: 1, Local: local}}).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(local, mem[:5000]) {
		t.Fatal("read the wrong bytes after re-registering")
	}
	// The server goes away: a copy fails with ErrPeer rather than pass
	// off possibly stale bytes, and the peer's mappings are dropped.
	stop()
	err = client2.Submit(ctx, []Op{{Kind: Read, Peer: addr, Region: 1, Local: local}}).Wait(ctx)
	if !errors.Is(err, ErrPeer) {
		t.Fatalf("read after the peer stopped: %v, want ErrPeer", err)
	}
	err = client2.Submit(ctx, []Op{{Kind: Read, Peer: addr, Region: 1, Local: local}}).Wait(ctx)
	if !errors.Is(err, ErrPeer) {
		t.Fatalf("second read after the peer stopped: %v, want ErrPeer (nobody listens)", err)
	}
}
