package disk

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
)

// BenchmarkRead compares the tier's Read of 2 MiB blocks (open, header
// and body in one preadv, CRC, checks) with one plain pread of the body
// of the same files, in the same I/O mode: what the tier's code costs on
// top of the disk, with the files' placement the same for both. Run the
// two a few times: a disk's rate drifts.
//
//	go test ./pool/disk -run x -bench Read -benchtime 2s
func BenchmarkRead(b *testing.B) {
	const size, blocks = 2 << 20, 128
	dir := b.TempDir()
	tier, err := Open(Config{Dir: dir, CapacityBytes: 2 * blocks * fileBytes(size)})
	if err != nil {
		b.Fatal(err)
	}
	defer tier.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tier.Run(ctx) }()
	data := alignedBuffer(size)
	for i := range blocks {
		fill(data, fmt.Sprint(i))
		for !tier.Offer("t", "ns", []byte(fmt.Sprint(i)), data, api.Checksum(data), 0, func() {}) {
			time.Sleep(time.Millisecond)
		}
		for tier.Stats().PendingBytes > 0 {
			time.Sleep(100 * time.Microsecond) // data is reused: one write at a time
		}
	}
	cancel()
	<-done
	arena, free, err := mmapBuffer(128 * size)
	if err != nil {
		b.Fatal(err)
	}
	defer free()
	// Each read lands a block further into shared memory, as promotes
	// land in the arena.
	at := func(i int) []byte { return arena[(i%128)*size : (i%128+1)*size] }
	b.Run("tier", func(b *testing.B) {
		b.SetBytes(size)
		i := 0
		for b.Loop() {
			if _, err := tier.Read([]byte("t"), []byte("ns"), []byte(fmt.Sprint(i%blocks)), at(i)); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("plain", func(b *testing.B) {
		b.SetBytes(size)
		i := 0
		for b.Loop() {
			p := filepath.Join(dir, "blocks", fileName(blockID("t", "ns", []byte(fmt.Sprint(i%blocks)))))
			fd, err := unix.Open(p, openFlags(unix.O_RDONLY, tier.Direct()), 0)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := unix.Pread(fd, at(i), headerBytes); err != nil {
				b.Fatal(err)
			}
			unix.Close(fd)
			i++
		}
	})
}

// mmapBuffer is size bytes of shared memory, as the arena is.
func mmapBuffer(size int) ([]byte, func(), error) {
	fd, err := unix.MemfdCreate("bench", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, nil, err
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, nil, err
	}
	return b, func() { unix.Munmap(b) }, nil
}
