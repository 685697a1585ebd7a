package pool

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// segment is the node's arena: shared memory mapped outside the Go heap.
// It is a memfd (anonymous, sealed against shrinking) unless a path under
// /dev/shm is configured, in which case it is a file there that other
// processes can open by name. Same-host clients receive the memfd over the
// node's unix socket and map it, so both sides see the same pages.
type segment struct {
	file   *os.File
	mem    []byte
	path   string // "" for a memfd
	locked bool
}

func openSegment(name, path string, size int64, lock bool) (*segment, error) {
	var f *os.File
	if path == "" {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			return nil, fmt.Errorf("pool: memfd_create: %w", err)
		}
		f = os.NewFile(uintptr(fd), "memfd:"+name)
	} else {
		var err error
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("pool: create segment file: %w", err)
		}
	}
	s := &segment{file: f, path: path}
	if err := s.setup(size, lock); err != nil {
		return nil, errors.Join(err, s.close())
	}
	return s, nil
}

func (s *segment) setup(size int64, lock bool) error {
	if err := s.file.Truncate(size); err != nil {
		return fmt.Errorf("pool: size segment to %d bytes: %w", size, err)
	}
	if s.path == "" {
		// Clients get this fd; forbid them from shrinking it under us.
		if _, err := unix.FcntlInt(s.file.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			return fmt.Errorf("pool: seal segment: %w", err)
		}
	}
	flags := unix.MAP_SHARED
	if lock {
		flags |= unix.MAP_POPULATE
	}
	mem, err := unix.Mmap(int(s.file.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return fmt.Errorf("pool: map %d-byte segment: %w", size, err)
	}
	s.mem = mem
	if lock {
		if err := unix.Mlock(mem); err != nil {
			return fmt.Errorf("pool: lock %d bytes of memory (needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK): %w", size, err)
		}
		s.locked = true
	}
	return nil
}

// words views the segment as 64-bit words; mappings are page aligned.
func (s *segment) words() []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(&s.mem[0])), len(s.mem)/8)
}

// close unmaps the segment and closes its file; a path-backed segment is
// also unlinked. Clients that mapped it keep their mapping.
func (s *segment) close() error {
	var errs []error
	if s.mem != nil {
		if err := unix.Munmap(s.mem); err != nil {
			errs = append(errs, fmt.Errorf("pool: unmap segment: %w", err))
		}
		s.mem = nil
	}
	if s.file != nil {
		errs = append(errs, s.file.Close())
		s.file = nil
	}
	if s.path != "" {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
