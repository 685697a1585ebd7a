package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// segment is the node's arena: shared memory mapped outside the Go heap.
// It is a memfd (anonymous, sealed against shrinking) unless a path under
// /dev/shm is configured, in which case it is a file there that other
// processes can open by name. Same-host clients receive the memfd over the
// node's unix socket and map it, so both sides see the same pages.
type segment struct {
	file *os.File
	mem  []byte // the arena
	// trailer is the page after the arena of a persistent segment, which
	// says what the arena is (persist.go); nil otherwise.
	trailer []byte
	mapping []byte   // mem and trailer
	path    string   // "" for a memfd
	owner   *os.File // path+".lock", flocked while this node owns path
	locked  bool
	// keep leaves the file at path when the segment closes: a node with
	// a data directory comes back to it.
	keep bool
}

// openSegment creates a segment of size bytes: a memfd (of huge pages
// with huge) when path is "", else a file at path that Close removes.
func openSegment(name, path string, size int64, lock, prefault, huge bool) (*segment, error) {
	return createSegment(name, path, size, 0, lock, prefault, false, huge)
}

// createSegment creates the segment: size bytes of arena and, for a
// persistent segment (keep: left at path when it closes), a trailer page
// of trailer bytes after it. huge makes a memfd (path "") one of huge
// pages; a file gets its pages from the file system it is on.
func createSegment(name, path string, size, trailer int64, lock, prefault, keep, huge bool) (*segment, error) {
	var f *os.File
	if path == "" {
		flags, what := unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING, ""
		if huge {
			flags, what = flags|unix.MFD_HUGETLB, " of huge pages (needs hugetlb support in the kernel)"
		}
		fd, err := unix.MemfdCreate(name, flags)
		if err != nil {
			return nil, fmt.Errorf("pool: memfd_create%s: %w", what, err)
		}
		f = os.NewFile(uintptr(fd), "memfd:"+name)
	} else {
		owner, err := ownSegmentPath(path)
		if err != nil {
			return nil, err
		}
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			// We hold the owner's lock, so the file's node is dead (a
			// kill -9 leaves it behind): replace it.
			if err = os.Remove(path); err == nil {
				f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			}
		}
		if err != nil {
			releaseSegmentPath(path, owner)
			return nil, fmt.Errorf("pool: create segment file: %w", err)
		}
		s := &segment{file: f, path: path, owner: owner, keep: keep}
		if err := s.setup(size, trailer, lock, prefault); err != nil {
			s.keep = false // it never held a block: do not leave it behind
			return nil, errors.Join(err, s.close())
		}
		return s, nil
	}
	s := &segment{file: f, path: path}
	if err := s.setup(size, trailer, lock, prefault); err != nil {
		return nil, errors.Join(err, s.close())
	}
	return s, nil
}

func (s *segment) setup(size, trailer int64, lock, prefault bool) error {
	huge, err := s.hugePageBytes()
	if err != nil {
		return err
	}
	if huge > 0 && (size%huge != 0 || trailer%huge != 0) {
		return fmt.Errorf("pool: the arena %s has %d-byte huge pages: --capacity (%d bytes) must be a multiple of that", s.where(), huge, size)
	}
	if err := s.file.Truncate(size + trailer); err != nil {
		return fmt.Errorf("pool: size segment to %d bytes: %w", size+trailer, err)
	}
	if s.path == "" {
		// Clients get this fd; forbid them from shrinking it under us.
		if _, err := unix.FcntlInt(s.file.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			return fmt.Errorf("pool: seal segment: %w", err)
		}
	}
	return s.mapAll(size, trailer, lock, prefault)
}

// mapAll maps the file's arena of size bytes and the trailer after it.
func (s *segment) mapAll(size, trailer int64, lock, prefault bool) error {
	flags := unix.MAP_SHARED
	if prefault && !lock {
		// Allocate the pages now: MAP_POPULATE alone would map a shared
		// file's pages for reading, leaving each first write to fault.
		if err := unix.Fallocate(int(s.file.Fd()), 0, 0, size); err != nil {
			if err := s.tooFewHugePages("allocate", size, size+trailer, err, unix.ENOSPC); err != nil {
				return err
			}
			return fmt.Errorf("pool: allocate the %d-byte arena (--prefault): %w", size, err)
		}
	}
	if lock || prefault {
		flags |= unix.MAP_POPULATE
	}
	mem, err := unix.Mmap(int(s.file.Fd()), 0, int(size+trailer), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		if err := s.tooFewHugePages("map", size+trailer, size+trailer, err, unix.ENOMEM); err != nil {
			return err
		}
		return fmt.Errorf("pool: map %d-byte segment: %w", size+trailer, err)
	}
	s.mapping, s.mem = mem, mem[:size:size]
	if trailer > 0 {
		s.trailer = mem[size:]
	}
	if lock {
		if err := unix.Mlock(mem[:size]); err != nil {
			return fmt.Errorf("pool: lock %d bytes of memory (needs CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK): %w", size, err)
		}
		s.locked = true
	}
	return nil
}

// tooFewHugePages is err, which the kernel returned to the action on
// bytes of the segment, said as a shortage of huge pages when the segment
// is on hugetlbfs and err is the errno that means one; nil otherwise.
func (s *segment) tooFewHugePages(action string, bytes, total int64, err error, errno unix.Errno) error {
	huge, _ := s.hugePageBytes()
	if huge == 0 || !errors.Is(err, errno) {
		return nil
	}
	return fmt.Errorf("pool: %s the %d-byte segment in huge pages %s: %w: reserve at least %d pages of %d bytes (HugePages_Free in /proc/meminfo; /proc/sys/vm/nr_hugepages)",
		action, bytes, s.where(), err, total/huge, huge)
}

// where names the segment in messages.
func (s *segment) where() string {
	if s.path == "" {
		return "(a memfd)"
	}
	return "at " + s.path
}

// hugePageBytes is the page size of the hugetlbfs the segment's file is
// on (a file on a hugetlbfs mount, or a memfd of huge pages), or 0.
func (s *segment) hugePageBytes() (int64, error) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(s.file.Fd()), &fs); err != nil {
		return 0, fmt.Errorf("pool: the segment's file system: %w", err)
	}
	return hugePageSize(&fs), nil
}

// hugePageSize is fs's page size when it is a hugetlbfs, else 0.
func hugePageSize(fs *unix.Statfs_t) int64 {
	if fs.Type != unix.HUGETLBFS_MAGIC {
		return 0
	}
	return fs.Bsize
}

// hugePageBytes is the page size of the hugetlbfs mount that holds the
// file at path, or 0 when path is "" (a memfd) or elsewhere. A file there
// is sized and mapped in whole huge pages.
func hugePageBytes(path string) (int64, error) {
	if path == "" {
		return 0, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &fs); err != nil {
		return 0, fmt.Errorf("pool: the segment's directory: %w", err)
	}
	return hugePageSize(&fs), nil
}

// ownSegmentPath takes the lock that says a live node owns the segment
// file at path: an exclusive flock on path+".lock", a file no client ever
// receives (a client's mapping of the segment itself would keep a lock on
// it alive after its node died). The kernel drops the lock when the node
// dies however it dies.
func ownSegmentPath(path string) (*os.File, error) {
	lf, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pool: open segment lock: %w", err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lf.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("pool: segment file %s belongs to a running node (it holds %s.lock)", path, path)
		}
		return nil, fmt.Errorf("pool: lock segment file %s: %w", path, err)
	}
	return lf, nil
}

// releaseSegmentPath gives up the ownership taken by ownSegmentPath,
// removing the lock file while it still holds the lock.
func releaseSegmentPath(path string, owner *os.File) error {
	err := os.Remove(path + ".lock")
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	return errors.Join(err, owner.Close())
}

// populate allocates the arena's pages in [off, off+n) and maps them for
// writing (MADV_POPULATE_WRITE), as a first write to each would, without
// writing: bytes already there stay. n is a multiple of the page size.
func (s *segment) populate(off, n int64) error {
	return unix.Madvise(s.mem[off:off+n], unix.MADV_POPULATE_WRITE)
}

// words views the segment as 64-bit words; mappings are page aligned.
func (s *segment) words() []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(&s.mem[0])), len(s.mem)/8)
}

// close unmaps the segment and closes its file; a path-backed segment is
// also unlinked, unless it is kept for the next start. Clients that mapped it keep their mapping.
func (s *segment) close() error {
	var errs []error
	if s.mapping != nil {
		if err := unix.Munmap(s.mapping); err != nil {
			errs = append(errs, fmt.Errorf("pool: unmap segment: %w", err))
		}
		s.mapping, s.mem, s.trailer = nil, nil, nil
	}
	if s.file != nil {
		errs = append(errs, s.file.Close())
		s.file = nil
	}
	if s.path != "" && !s.keep {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if s.owner != nil {
		errs = append(errs, releaseSegmentPath(s.path, s.owner))
		s.owner = nil
	}
	return errors.Join(errs...)
}
