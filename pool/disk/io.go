package disk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// IOMode is how the tier reads and writes its files.
type IOMode uint8

const (
	// IOAuto uses direct I/O where the file system supports it, else
	// buffered I/O.
	IOAuto IOMode = iota
	// IODirect bypasses the page cache (O_DIRECT): blocks move between
	// the device and the arena without a copy, and the disk tier does
	// not take host memory from the arena as page cache. Open fails
	// where the file system refuses it.
	IODirect
	// IOBuffered goes through the page cache.
	IOBuffered
)

func (m IOMode) String() string {
	switch m {
	case IOAuto:
		return "auto"
	case IODirect:
		return "direct"
	case IOBuffered:
		return "buffered"
	}
	return fmt.Sprintf("IOMode(%d)", uint8(m))
}

// ParseIOMode reads "auto", "direct" or "buffered".
func ParseIOMode(s string) (IOMode, error) {
	for _, m := range []IOMode{IOAuto, IODirect, IOBuffered} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("disk: unknown I/O mode %q: want auto, direct or buffered", s)
}

// Set and Type make IOMode a command-line flag value.
func (m *IOMode) Set(s string) error {
	v, err := ParseIOMode(s)
	if err == nil {
		*m = v
	}
	return err
}

// Type names the flag's value kind.
func (m *IOMode) Type() string { return "mode" }

// aligned reports whether b starts on an alignment boundary.
func aligned(b []byte) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%align == 0
}

// alignedBuffer returns n bytes (a multiple of align) whose start is
// aligned, for direct I/O from Go memory.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+align)
	off := int(align-uintptr(unsafe.Pointer(unsafe.SliceData(b)))%align) % align
	return b[off : off+n : off+n]
}

// pageBuffers are one-unit aligned buffers: headers and the tail of a
// block whose length is not a multiple of the unit.
var pageBuffers = sync.Pool{New: func() any { b := alignedBuffer(align); return &b }}

// chunkBytes is the bounce buffer a block that is not aligned in memory
// moves through (an arena with pages under 4 KiB).
const chunkBytes = 1 << 20

var chunkBuffers = sync.Pool{New: func() any { b := alignedBuffer(chunkBytes); return &b }}

// openFlags adds O_DIRECT when direct.
func openFlags(flags int, direct bool) int {
	if direct {
		flags |= unix.O_DIRECT
	}
	return flags | unix.O_CLOEXEC
}

// probeDirect reports whether dir's file system takes direct I/O: it
// writes and reads back one aligned unit.
func probeDirect(dir string) (bool, error) {
	p := filepath.Join(dir, "probe"+tmpExt)
	defer os.Remove(p)
	fd, err := unix.Open(p, openFlags(unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, true), 0o600)
	if errors.Is(err, unix.EINVAL) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("disk: probe %s: %w", dir, err)
	}
	defer unix.Close(fd)
	buf := pageBuffers.Get().(*[]byte)
	defer pageBuffers.Put(buf)
	if _, err := unix.Pwrite(fd, *buf, 0); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return false, nil
		}
		return false, fmt.Errorf("disk: probe %s: %w", dir, err)
	}
	if _, err := unix.Pread(fd, *buf, 0); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return false, nil
		}
		return false, fmt.Errorf("disk: probe %s: %w", dir, err)
	}
	return true, nil
}

// writeFull writes the iovecs at off, resuming after short writes.
func writeFull(fd int, iovs [][]byte, off int64) error {
	for len(iovs) > 0 {
		n, err := unix.Pwritev(fd, iovs, off)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		if n == 0 {
			return errors.New("disk: write made no progress")
		}
		off += int64(n)
		iovs = advance(iovs, n)
	}
	return nil
}

// readFull reads the iovecs at off. A file that ends first is
// io.ErrUnexpectedEOF's cousin: errShort.
func readFull(fd int, iovs [][]byte, off int64) error {
	for len(iovs) > 0 {
		n, err := unix.Preadv(fd, iovs, off)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		if n == 0 {
			return errShort
		}
		off += int64(n)
		iovs = advance(iovs, n)
	}
	return nil
}

// errShort is a file shorter than its header says.
var errShort = errors.New("disk: block file is truncated")

// advance drops the first n bytes of iovs.
func advance(iovs [][]byte, n int) [][]byte {
	for n > 0 && len(iovs) > 0 {
		if n < len(iovs[0]) {
			iovs[0] = iovs[0][n:]
			return iovs
		}
		n -= len(iovs[0])
		iovs = iovs[1:]
	}
	for len(iovs) > 0 && len(iovs[0]) == 0 {
		iovs = iovs[1:]
	}
	return iovs
}
