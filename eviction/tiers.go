package eviction

import (
	"errors"
	"fmt"
	"time"
)

// TiersConfig is the node ReplayTiers simulates: host memory with a disk
// tier behind it (pool/disk), both counted in equal-sized blocks.
type TiersConfig struct {
	// Memory orders the memory tier's blocks. Default LRU.
	Memory Kind
	// MemoryBlocks is the memory tier's capacity in blocks, > 0.
	MemoryBlocks int
	// DiskBlocks is the disk tier's capacity in blocks; 0 means no disk
	// tier (memory only, as Replay).
	DiskBlocks int
	// DiskKind orders the disk tier's blocks. Default LRU.
	DiskKind Kind
	// AdmitReads is how many times a block must be read (hit) in memory
	// before it is copied to disk, as TenantConfig.DiskAdmitReads. Default
	// DefaultDiskAdmitReads (2); 1 to MaxDiskAdmitReads.
	AdmitReads int
}

// WithDefaults fills unset fields.
func (c TiersConfig) WithDefaults() TiersConfig {
	if c.Memory == 0 {
		c.Memory = LRU
	}
	if c.DiskKind == 0 {
		c.DiskKind = LRU
	}
	if c.AdmitReads == 0 {
		c.AdmitReads = DefaultDiskAdmitReads
	}
	return c
}

// Validate reports every problem with c (after defaults).
func (c TiersConfig) Validate() error {
	var errs []error
	if c.Memory == 0 || int(c.Memory) >= len(kindNames) {
		errs = append(errs, fmt.Errorf("unknown memory policy %v", c.Memory))
	}
	if c.DiskKind == 0 || int(c.DiskKind) >= len(kindNames) {
		errs = append(errs, fmt.Errorf("unknown disk policy %v", c.DiskKind))
	}
	if c.MemoryBlocks <= 0 {
		errs = append(errs, fmt.Errorf("memory of %d blocks: want at least 1", c.MemoryBlocks))
	}
	if c.DiskBlocks < 0 {
		errs = append(errs, fmt.Errorf("disk of %d blocks must not be negative", c.DiskBlocks))
	}
	if c.AdmitReads < 1 || c.AdmitReads > MaxDiskAdmitReads {
		errs = append(errs, fmt.Errorf("disk admission after %d reads: want 1 to %d", c.AdmitReads, MaxDiskAdmitReads))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("eviction: invalid tiers config: %w", err)
	}
	return nil
}

// TiersResult counts what ReplayTiers saw. Every lookup is a memory hit, a
// disk hit or a miss.
type TiersResult struct {
	// Requests is the number of requests replayed.
	Requests int
	// Blocks is the number of block lookups: the sum of len(Blocks).
	Blocks int64
	// MemoryPrefixHits and DiskPrefixHits split the prefix hits, the
	// leading blocks of a request present in memory or on disk before its
	// first miss, by the tier that served them.
	MemoryPrefixHits, DiskPrefixHits int64
	// MemoryBlockHits and DiskBlockHits count every block served by
	// memory and by disk, prefix or not.
	MemoryBlockHits, DiskBlockHits int64
	// MemoryEvictions counts blocks evicted from memory to make room for
	// a missed or promoted block.
	MemoryEvictions int64
	// Rejected counts missed or promoted blocks not stored in memory:
	// refused by Admit (LFU), or no unpinned victim.
	Rejected int64
	// DiskWrites counts blocks copied to disk.
	DiskWrites int64
	// DiskEvictions counts blocks evicted from disk to make room for a
	// copy.
	DiskEvictions int64
}

// PrefixHits returns the prefix hits of both tiers.
func (r TiersResult) PrefixHits() int64 { return r.MemoryPrefixHits + r.DiskPrefixHits }

// BlockHits returns the block hits of both tiers.
func (r TiersResult) BlockHits() int64 { return r.MemoryBlockHits + r.DiskBlockHits }

// PrefixHitRatio returns PrefixHits()/Blocks, or 0 with no blocks.
func (r TiersResult) PrefixHitRatio() float64 { return ratio(r.PrefixHits(), r.Blocks) }

// BlockHitRatio returns BlockHits()/Blocks, or 0 with no blocks.
func (r TiersResult) BlockHitRatio() float64 { return ratio(r.BlockHits(), r.Blocks) }

// MemoryPrefixHitRatio returns MemoryPrefixHits/Blocks, or 0 with no
// blocks.
func (r TiersResult) MemoryPrefixHitRatio() float64 { return ratio(r.MemoryPrefixHits, r.Blocks) }

// MemoryBlockHitRatio returns MemoryBlockHits/Blocks, or 0 with no blocks.
func (r TiersResult) MemoryBlockHitRatio() float64 { return ratio(r.MemoryBlockHits, r.Blocks) }

// DiskPrefixHitRatio returns DiskPrefixHits/Blocks, or 0 with no blocks.
func (r TiersResult) DiskPrefixHitRatio() float64 { return ratio(r.DiskPrefixHits, r.Blocks) }

// DiskBlockHitRatio returns DiskBlockHits/Blocks, or 0 with no blocks.
func (r TiersResult) DiskBlockHitRatio() float64 { return ratio(r.DiskBlockHits, r.Blocks) }

// ReplayTiers replays reqs, in order, on a node with cfg.MemoryBlocks of
// memory and cfg.DiskBlocks of disk behind it. It panics if cfg, after
// WithDefaults, does not Validate.
//
// The memory tier is Replay's cache (nothing expires): each block of a
// request is looked up in order, the request's own blocks pinned. A block
// in memory is a memory hit (Touch). Otherwise, a block on disk is a disk
// hit: it is touched there and promoted, stored in memory as a missed
// block is (evicting memory's Victim, unless Admit refuses it), and stays
// on disk. Otherwise it is a miss and stored in memory. The leading blocks
// of a request found in either tier before its first miss are its prefix
// hits.
//
// As in the store, a block's memory hits are counted while it stays in
// memory: at the AdmitReads-th it is copied to disk, at most once per
// stay, evicting the disk policy's Victim if the disk is full. If the disk
// already holds it, nothing is copied and the count starts again, so it is
// offered again after AdmitReads more hits. A block evicted from memory is
// only dropped: it is on disk only if it was copied before. The copy is
// made at once, where the node writes it behind.
//
// As in pool/disk, the disk policy sees blocks without parents (so
// PrefixLRU orders them as LRU), is told of disk hits (Touch) but not of
// misses, and never refuses a copy (no Admit).
//
// With DiskBlocks 0 it counts exactly what Replay(reqs, cfg.Memory,
// cfg.MemoryBlocks, 0) does, memory hits as its hits.
func ReplayTiers(reqs []Request, cfg TiersConfig) TiersResult {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	var r TiersResult
	mem := newReplayCache(cfg.Memory, cfg.MemoryBlocks)
	var disk *replayDisk
	if cfg.DiskBlocks > 0 {
		disk = newReplayDisk(cfg.DiskKind, cfg.DiskBlocks)
	}
	// reads holds the memory hits of the blocks in memory since they were
	// stored there, or readsCopied once copied to disk. A block leaving
	// memory leaves it too.
	reads := make(map[ID]int)
	for _, req := range reqs {
		now := replayEpoch.Add(req.At)
		mem.pin(req.Blocks)
		r.Requests++
		prefix := true
		for i, id := range req.Blocks {
			r.Blocks++
			if mem.lookup(id, now) {
				r.MemoryBlockHits++
				if prefix {
					r.MemoryPrefixHits++
				}
				if disk == nil || reads[id] == readsCopied {
					continue
				}
				n := reads[id] + 1
				switch {
				case n < cfg.AdmitReads:
					reads[id] = n
				case disk.has(id):
					delete(reads, id) // declined: count again
				default:
					reads[id] = readsCopied
					r.DiskWrites++
					if disk.write(id, now) {
						r.DiskEvictions++
					}
				}
				continue
			}
			if disk != nil && disk.read(id, now) {
				r.DiskBlockHits++
				if prefix {
					r.DiskPrefixHits++
				}
			} else {
				prefix = false
			}
			victim, stored := mem.store(chainBlock(req.Blocks, i), now)
			if victim != 0 {
				r.MemoryEvictions++
				delete(reads, victim)
			}
			if !stored {
				r.Rejected++
			}
		}
	}
	return r
}

// readsCopied marks a block in ReplayTiers' reads as copied to disk.
const readsCopied = -1

// replayDisk is ReplayTiers' disk tier: capacity equal-sized blocks
// ordered by a policy, with nothing pinned.
type replayDisk struct {
	p        Policy
	capacity int // in blocks, > 0
	present  map[ID]struct{}
}

func newReplayDisk(k Kind, capacity int) *replayDisk {
	return &replayDisk{p: New(k, Config{Counters: capacity}), capacity: capacity, present: make(map[ID]struct{}, capacity)}
}

func (d *replayDisk) has(id ID) bool {
	_, ok := d.present[id]
	return ok
}

// read reports whether id is on disk, and touches it if so.
func (d *replayDisk) read(id ID, now time.Time) bool {
	if !d.has(id) {
		return false
	}
	d.p.Touch(id, now)
	return true
}

// write copies id, not on disk, to disk at now, evicting the policy's
// Victim first if the disk is full; it reports whether it evicted one.
func (d *replayDisk) write(id ID, now time.Time) (evicted bool) {
	if len(d.present) >= d.capacity {
		v, ok := d.p.Victim(now, nil)
		if !ok {
			panic("eviction: full replay disk has no victim")
		}
		d.p.Remove(v)
		delete(d.present, v)
		evicted = true
	}
	d.p.Add(Block{ID: id, Bytes: 1}, now)
	d.present[id] = struct{}{}
	return evicted
}
