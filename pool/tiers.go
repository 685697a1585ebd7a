package pool

import (
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/eviction"
	"github.com/kvpool/kvpool/pool/disk"
	"github.com/kvpool/kvpool/pool/store"
)

// tiers is the node's block store when it has a disk tier: host memory
// (the store) in front of the disk (pool/disk). It implements every
// interface the handlers ask of the store; what differs from the store
// alone is:
//
//   - a block that is on disk and not in memory is promoted when it is
//     read (Acquire), leased (Lease, so Locate with a lease) or fetched
//     (Promote): reserved in the arena, read straight into it, checked
//     against its CRC and committed, so every reader sees a memory block;
//   - Exists and Locate count a block on either tier as held;
//   - RemoveForce and SetTenant reach both tiers.
//
// A disk that fails turns into misses: a block it cannot read is
// dropped from it (disk.Tier.Read), and the read fails with
// api.ErrDataLoss once; the memory tier never sees the disk's errors
// otherwise.
type tiers struct {
	*store.Store
	disk *disk.Tier
	// promoted counts blocks read from disk into memory; promoteFailed
	// those whose read failed (the disk's metrics say why).
	promoted, promoteFailed atomic.Uint64
}

// Acquire pins a block, promoting it from disk when memory lacks it.
func (t *tiers) Acquire(tenant, ns, key []byte) (store.Pin, error) {
	pin, err := t.Store.Acquire(tenant, ns, key)
	if !errors.Is(err, api.ErrNotFound) {
		return pin, err
	}
	if err := t.promote(tenant, ns, key); err != nil {
		return store.Pin{}, err
	}
	return t.Store.Acquire(tenant, ns, key)
}

// promote copies a disk block into memory. It is ErrNotFound when the
// disk lacks the block, ErrDataLoss when its file fails its checks (the
// disk then forgets it), and the store's error when the arena has no
// room. A block committed meanwhile by another reader is success.
func (t *tiers) promote(tenant, ns, key []byte) error {
	size, ok := t.disk.Size(tenant, ns, key)
	if !ok {
		return api.Errorf(api.ErrNotFound, "pool: no block %s/%s/%x in memory or on disk", tenant, ns, key)
	}
	res, err := t.Store.ReservePromotion(tenant, ns, key, size)
	if err != nil {
		return err
	}
	crc, err := t.disk.Read(tenant, ns, key, res.Bytes())
	if err != nil {
		t.Store.Abort(res)
		t.promoteFailed.Add(1)
		return err
	}
	// The disk checked the bytes against the CRC they were stored with.
	if _, err := t.Store.Commit(res, crc, true, 0, false); err != nil && !errors.Is(err, api.ErrAlreadyExists) {
		return err
	}
	t.promoted.Add(1)
	return nil
}

// Promote brings the keys that are on disk and not in memory into memory
// (Fetch, before it looks for peers). The result holds, per key, nil
// when the block is in memory afterwards, else why not (ErrNotFound when
// neither tier has it).
func (t *tiers) Promote(tenant, ns []byte, keys [][]byte) []error {
	in, err := t.Store.Exists(tenant, ns, keys)
	errs := make([]error, len(keys))
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	for i, k := range keys {
		if !in[i] {
			errs[i] = t.promote(tenant, ns, k)
		}
	}
	return errs
}

// Exists reports, per key, whether either tier holds it.
func (t *tiers) Exists(tenant, ns []byte, keys [][]byte) ([]bool, error) {
	in, err := t.Store.Exists(tenant, ns, keys)
	if err != nil {
		return nil, err
	}
	var rest [][]byte
	var at []int
	for i, ok := range in {
		if !ok {
			rest, at = append(rest, keys[i]), append(at, i)
		}
	}
	if len(rest) > 0 {
		onDisk, err := t.disk.Exists(tenant, ns, rest)
		if err != nil {
			return nil, err
		}
		for j, ok := range onDisk {
			in[at[j]] = ok
		}
	}
	return in, nil
}

// Locate is the chain's prefix held on either tier; the memory part
// teaches prefix-aware policies the chain's order, as the store's does.
func (t *tiers) Locate(tenant, ns []byte, chain [][]byte) (int, error) {
	_, total, err := t.Prefix(tenant, ns, chain)
	return total, err
}

// Prefix returns how many leading keys of the chain are in memory, and
// how many are in memory or on disk.
func (t *tiers) Prefix(tenant, ns []byte, chain [][]byte) (memory, total int, err error) {
	memory, err = t.Store.Locate(tenant, ns, chain)
	if err != nil || memory == len(chain) {
		return memory, memory, err
	}
	in, err := t.Exists(tenant, ns, chain[memory:])
	if err != nil {
		return 0, 0, err
	}
	total = memory + len(in)
	if i := slices.Index(in, false); i >= 0 {
		total = memory + i
	}
	return memory, total, nil
}

// Lease leases the leading keys held on either tier, promoting the disk
// ones first: a lease promises the block is readable from memory.
func (t *tiers) Lease(tenant, ns []byte, keys [][]byte, d time.Duration) (int, time.Time, error) {
	for i, err := range t.Promote(tenant, ns, keys) {
		if err != nil {
			keys = keys[:i]
			break
		}
	}
	return t.Store.Lease(tenant, ns, keys, d)
}

// RemoveForce removes the block from both tiers. A block leased in
// memory stays on both unless forced; one on disk only is removed.
func (t *tiers) RemoveForce(tenant, ns, key []byte, force bool) error {
	err := t.Store.RemoveForce(tenant, ns, key, force)
	if errors.Is(err, api.ErrFailedPrecondition) {
		return err
	}
	if t.disk.Remove(tenant, ns, key) && errors.Is(err, api.ErrNotFound) {
		return nil
	}
	return err
}

// SetTenant applies a tenant's config to both tiers.
func (t *tiers) SetTenant(name string, cfg *eviction.TenantConfig) {
	t.Store.SetTenant(name, cfg)
	t.disk.SetTenant(name, cfg)
}

// ForEach walks the blocks of both tiers: memory's, then the disk's
// that memory lacks (the cluster map's snapshot of this node).
func (t *tiers) ForEach(yield func(tenant, namespace string, key []byte) bool) {
	stopped := false
	t.Store.ForEach(func(tenant, namespace string, key []byte) bool {
		stopped = !yield(tenant, namespace, key)
		return !stopped
	})
	if stopped {
		return
	}
	t.disk.ForEach(func(tenant, namespace string, key []byte) bool {
		if in, err := t.Store.Exists([]byte(tenant), []byte(namespace), [][]byte{key}); err == nil && in[0] {
			return true
		}
		return yield(tenant, namespace, key)
	})
}

// ReadBytesPerSecond is the disk's measured read rate.
func (t *tiers) ReadBytesPerSecond() float64 { return t.disk.ReadBytesPerSecond() }

// spill is the store's Spiller: it hands admitted blocks to the disk,
// their bytes pinned in the arena until written.
type spill struct {
	store *store.Store
	disk  *disk.Tier
}

func (s spill) Offer(tenant, namespace string, key []byte, pin store.Pin, expiresUnixNano int64) bool {
	return s.disk.Offer(tenant, namespace, key, pin.Mem, pin.CRC, expiresUnixNano, func() { s.store.Release(pin) })
}

// tieredSink publishes the node as a block's holder while either tier
// has it: memory's and the disk's changes go to the cluster map, except
// a removal from one tier while the other still holds the block. Each
// tier calls after its own change, so of two removals the later one
// sees both tiers without the block and publishes.
type tieredSink struct {
	next   store.LocationSink
	memory *store.Store
	disk   *disk.Tier
}

func (s tieredSink) Added(tenant, namespace, key []byte) { s.next.Added(tenant, namespace, key) }

func (s tieredSink) Removed(tenant, namespace, key []byte) {
	if _, ok := s.disk.Size(tenant, namespace, key); !ok {
		s.next.Removed(tenant, namespace, key)
	}
}

func (s tieredSink) AddedDisk(tenant, namespace, key []byte) { s.next.Added(tenant, namespace, key) }

func (s tieredSink) RemovedDisk(tenant, namespace, key []byte) {
	if in, err := s.memory.Exists(tenant, namespace, [][]byte{key}); err != nil || !in[0] {
		s.next.Removed(tenant, namespace, key)
	}
}

// DiskConfig gives a node a disk tier behind its arena (pool/disk).
type DiskConfig struct {
	// DiskDir holds the tier's block files; they outlive the daemon, and
	// a node started again with the same DiskDir serves them. Default "":
	// no disk tier.
	DiskDir string
	// DiskCapacityBytes bounds the tier's files. Required with DiskDir.
	DiskCapacityBytes int64
	// DiskIO is how the tier reads and writes: auto (direct I/O where the
	// file system takes it), direct or buffered. Default auto.
	DiskIO disk.IOMode
	// DiskMaxPendingBytes bounds the blocks waiting to be written, which
	// stay pinned in the arena meanwhile. Default 256 MiB, or a quarter
	// of the arena when that is less.
	DiskMaxPendingBytes int64
}

func (c *DiskConfig) validate() []error {
	var p problems
	switch {
	case c.DiskDir == "" && c.DiskCapacityBytes != 0:
		p.add("disk capacity %d bytes without a disk directory (--disk-dir)", c.DiskCapacityBytes)
	case c.DiskDir != "" && c.DiskCapacityBytes <= 0:
		p.add("a disk directory needs its capacity (--disk-capacity)")
	}
	if c.DiskMaxPendingBytes < 0 {
		p.add("disk max pending %d bytes: must not be negative", c.DiskMaxPendingBytes)
	}
	return p
}

// blockStore is everything the node's handlers ask of its blocks:
// *store.Store without a disk tier, *tiers with one.
type blockStore interface {
	kvStore
	dataStore
	tenantSetter
	ForEach(yield func(tenant, namespace string, key []byte) bool)
}

var (
	_ blockStore = (*store.Store)(nil)
	_ blockStore = (*tiers)(nil)
)

// openDisk opens the node's disk tier and puts it behind the store.
func (n *Node) openDisk(log *slog.Logger) error {
	c := &n.cfg
	pending := c.DiskMaxPendingBytes
	if pending == 0 {
		// Pending blocks stay pinned: never a quarter of a small arena.
		pending = max(min(disk.DefaultMaxPendingBytes, c.CapacityBytes/4), 1)
	}
	d, err := disk.Open(disk.Config{
		Dir: c.DiskDir, CapacityBytes: c.DiskCapacityBytes, IO: c.DiskIO, MaxPendingBytes: pending,
		MaxBlockBytes: c.MaxBlockBytes, DefaultTenant: c.DefaultTenant, Logger: log, Now: c.Now,
	})
	if err != nil {
		return err
	}
	n.disk = d
	n.store.SetSpiller(spill{store: n.store, disk: d})
	n.blocks = &tiers{Store: n.store, disk: d}
	r := d.Opened()
	log.Info("disk tier opened", "dir", c.DiskDir, "capacity_bytes", c.DiskCapacityBytes, "direct_io", r.Direct, "blocks", r.Blocks,
		"bytes", r.Bytes, "dropped", r.Dropped, "expired", r.Expired, "evicted", r.Evicted, "partial", r.Partial,
		"probe_read_bytes_per_second", r.ProbeReadBytesPerSecond, "took", r.Took)
	return nil
}
