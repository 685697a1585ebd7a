package store

import (
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/kvpool/kvpool/eviction"
)

// Config configures a Store and the arena under it.
type Config struct {
	// CapacityBytes is the size of the shared-memory arena in bytes.
	// Required; a multiple of PageBytes.
	CapacityBytes int64
	// PageBytes is the allocation granule in bytes: a power of two from
	// 512 B to 1 MiB. Every value occupies whole pages. Default 4 KiB.
	PageBytes int64
	// MaxBlockBytes is the largest value accepted, in bytes. Default
	// 64 MiB or CapacityBytes, whichever is smaller; at most 4 GiB - 1.
	MaxBlockBytes int64
	// LockMemory pre-faults the arena and locks it in RAM (mlock), so block
	// bytes are never swapped and engines can register them as pinned
	// memory. Needs CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK.
	LockMemory bool
	// Prefault allocates every page of the arena when the node starts
	// (fallocate) and maps them (MAP_POPULATE), so no put pays the first
	// write to a page: a fault and the kernel zeroing it, which on this
	// machine halves a same-host put's speed until the arena has been
	// written once. It costs that zeroing up front (about 0.2 s per GiB
	// here) and the arena's whole memory from the start. LockMemory
	// implies it.
	Prefault bool
	// PopulateBytesPerSecond is how fast a node whose arena is neither
	// prefaulted nor locked allocates the arena's pages in the background
	// once it serves, without touching what they hold, so that puts and
	// fetches soon stop paying each page's first write. On this VM a copy
	// into untouched shared memory runs at 0.7 GB/s against 60 GB/s into
	// touched pages, and a drain's 1 GiB fetched into untouched arenas
	// took 1.0 s against 0.2 s. The node never spends more than a
	// quarter of a core on it, so where allocating pages is slow it goes
	// slower than this (here about 450 MiB/s). Default 1 GiB/s; negative:
	// never (pages are allocated on their first write).
	PopulateBytesPerSecond int64
	// SegmentPath, when set, backs the arena with a new file at this path
	// (under /dev/shm) instead of an anonymous memfd, so other processes
	// can map it by name. The file is removed on Close.
	SegmentPath string
	// HugePages backs the arena's memfd with huge pages (MFD_HUGETLB, of
	// the system's default size) instead of small ones, with no hugetlbfs
	// mount needed. A copy into small shared pages runs slower: here a
	// 16 MiB put to a node in another process ran at 0.65–0.71 of memcpy
	// on them and at 0.95–1.00 on huge pages. The pages must be reserved
	// (/proc/sys/vm/nr_hugepages) and CapacityBytes must be a whole number
	// of them. Not with SegmentPath (or DataDir, which sets it): put that
	// file on a hugetlbfs mount instead.
	HugePages bool
	// ReservationTimeout is how long a reservation may stay uncommitted
	// before it is reclaimed. Default 30 s.
	ReservationTimeout time.Duration
	// MaxNamespaces bounds the (tenant, namespace) pairs that hold blocks
	// or reservations at once; a pair left with neither is freed. Default
	// 4096.
	MaxNamespaces int
	// DefaultTenant is how the blocks of tenants without a stored policy
	// are kept (policies live in etcd, set with `kvpool policy set`).
	// Default: LRU, no quota.
	DefaultTenant eviction.TenantConfig
	// HighWatermark and LowWatermark are fractions of the arena: once a
	// reservation would take it past High, the node evicts down to Low,
	// from tenants over their quota and tenants without one (the largest
	// first), never a tenant below its quota, a leased block or space
	// reserved for a put. Defaults 0.95 and 0.90.
	HighWatermark, LowWatermark float64
	// DisableEviction turns automatic eviction off: a put that finds its
	// tenant at quota or the arena full fails with ResourceExhausted and
	// the caller decides what to remove (TTLs still expire blocks).
	DisableEviction bool
	// LeaseDefault is a read lease's length when a caller asks for one
	// without saying (the CLI and client default); LeaseMax caps what a
	// caller may ask. Defaults 10 s and 60 s.
	LeaseDefault, LeaseMax time.Duration
}

// maxValueBytes is the largest value a reservation may hold.
const maxValueBytes = 1<<32 - 1

// WithDefaults returns c with defaults for its zero fields.
func (c Config) WithDefaults() Config {
	if c.PageBytes == 0 {
		c.PageBytes = 4 << 10
	}
	if c.MaxBlockBytes == 0 {
		c.MaxBlockBytes = min(64<<20, c.CapacityBytes)
	}
	if c.ReservationTimeout == 0 {
		c.ReservationTimeout = 30 * time.Second
	}
	if c.MaxNamespaces == 0 {
		c.MaxNamespaces = 4096
	}
	if c.PopulateBytesPerSecond == 0 {
		c.PopulateBytesPerSecond = 1 << 30
	}
	c.DefaultTenant = c.DefaultTenant.WithDefaults()
	if c.HighWatermark == 0 && c.LowWatermark == 0 {
		c.HighWatermark, c.LowWatermark = 0.95, 0.90
	}
	if c.LeaseDefault == 0 {
		c.LeaseDefault = 10 * time.Second
	}
	if c.LeaseMax == 0 {
		c.LeaseMax = 60 * time.Second
	}
	return c
}

// Validate reports every problem with c (after WithDefaults), joined.
func (c Config) Validate() error {
	var p []error
	add := func(format string, args ...any) { p = append(p, fmt.Errorf(format, args...)) }
	if c.PageBytes < 512 || c.PageBytes > 1<<20 || bits.OnesCount64(uint64(c.PageBytes)) != 1 {
		add("page size %d bytes: want a power of two from 512 B to 1 MiB", c.PageBytes)
	}
	switch {
	case c.CapacityBytes <= 0:
		add("capacity %d bytes: want a positive size such as 1GiB", c.CapacityBytes)
	case c.PageBytes > 0 && c.CapacityBytes%c.PageBytes != 0:
		add("capacity %d bytes is not a multiple of the %d-byte page", c.CapacityBytes, c.PageBytes)
	case c.PageBytes > 0 && c.CapacityBytes/c.PageBytes > maxPages:
		add("capacity %d bytes is more than %d pages of %d bytes; raise the page size", c.CapacityBytes, int64(maxPages), c.PageBytes)
	}
	switch {
	case c.MaxBlockBytes <= 0:
		add("max block size %d bytes: want a positive size", c.MaxBlockBytes)
	case c.MaxBlockBytes > maxValueBytes:
		add("max block size %d bytes exceeds the limit of %d", c.MaxBlockBytes, int64(maxValueBytes))
	case c.CapacityBytes > 0 && c.MaxBlockBytes > c.CapacityBytes:
		add("max block size %d bytes exceeds the capacity of %d bytes", c.MaxBlockBytes, c.CapacityBytes)
	}
	if c.HugePages && c.SegmentPath != "" {
		add("huge pages back a memfd arena; the arena at %s (--segment-path, or the data dir's default) gets them from a hugetlbfs mount instead", c.SegmentPath)
	}
	if c.ReservationTimeout < 0 {
		add("reservation timeout %v must not be negative", c.ReservationTimeout)
	}
	if c.MaxNamespaces < 1 {
		add("max namespaces %d: want at least 1", c.MaxNamespaces)
	}
	if err := c.DefaultTenant.Validate(); err != nil {
		p = append(p, err)
	}
	if !(c.LowWatermark > 0 && c.LowWatermark <= c.HighWatermark && c.HighWatermark <= 1) {
		add("watermarks: want 0 < low (%v) ≤ high (%v) ≤ 1", c.LowWatermark, c.HighWatermark)
	}
	if c.LeaseDefault < 0 || c.LeaseMax < c.LeaseDefault {
		add("leases: want 0 ≤ default (%v) ≤ max (%v)", c.LeaseDefault, c.LeaseMax)
	}
	return errors.Join(p...)
}
