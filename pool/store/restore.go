package store

import (
	"bytes"
	"errors"
	"fmt"
	"sort"

	"github.com/kvpool/kvpool/api"
)

// RestoredBlock is a committed block found in an arena that outlived its
// node: where its bytes are and what they must checksum to.
type RestoredBlock struct {
	Tenant, Namespace string
	Key               []byte
	// Offset is where the block starts, in bytes into the arena: a whole
	// number of pages. Size is its length in bytes.
	Offset, Size int64
	CRC          uint32
	// ExpiresUnixNano is when its TTL ends; 0 for none.
	ExpiresUnixNano int64
}

// Restore adopts blocks whose bytes are already in the arena: a node
// restarted over its segment, after checking each block's bytes against
// its CRC, makes them committed blocks again, with their tenants' books,
// policies and TTLs as if just committed. It is for a new store, before
// any other use, and takes the blocks all at once: the arena's free
// space is what they leave.
//
// Every block is checked first and Restore adopts none if any is wrong
// (not page-aligned, out of the arena, larger than the node accepts,
// overlapping another, a name given twice or invalid), returning every
// problem. Blocks whose TTL ended by now are skipped and counted.
// Neither the location sink nor the journal hears of them: the node
// republishes its set and rewrites its journal from what it adopted.
func (s *Store) Restore(blocks []RestoredBlock) (expired int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.idx.count > 0 || len(s.mu.res) > 0 || s.mu.alloc.freePages != uint64(s.mu.alloc.pages) {
		return 0, api.Errorf(api.ErrFailedPrecondition, "store: restore into a store already in use")
	}
	order := make([]int, len(blocks))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return blocks[order[a]].Offset < blocks[order[b]].Offset })
	var problems []error
	names := make(map[string]int, len(blocks))
	namespaces := map[string]bool{}
	var end int64 // of the previous block's pages
	for k, i := range order {
		b := blocks[i]
		name := fmt.Sprintf("block %d (%s/%s/%x)", i, b.Tenant, b.Namespace, b.Key)
		if err := api.ValidateKeyBytes([]byte(b.Tenant), []byte(b.Namespace), b.Key); err != nil {
			problems = append(problems, fmt.Errorf("%s: %w", name, err))
		}
		if err := s.ValidateSize(b.Size); err != nil {
			problems = append(problems, fmt.Errorf("%s: %w", name, err))
			continue
		}
		if b.Offset < 0 || b.Offset%s.pageBytes != 0 || b.Offset > int64(len(s.mem))-b.Size {
			problems = append(problems, fmt.Errorf("%s: %d bytes at offset %d do not fit page-aligned in the %d-byte arena", name, b.Size, b.Offset, len(s.mem)))
			continue
		}
		if k > 0 && b.Offset < end {
			problems = append(problems, fmt.Errorf("%s: at offset %d overlaps the block before it, which ends at %d", name, b.Offset, end))
		}
		end = b.Offset + int64(s.pagesFor(b.Size))<<s.pageShift
		full := b.Tenant + "\x00" + b.Namespace + "\x00" + string(b.Key)
		if j, ok := names[full]; ok {
			problems = append(problems, fmt.Errorf("%s: the same name as block %d", name, j))
		}
		names[full] = i
		namespaces[b.Tenant+"\x00"+b.Namespace] = true
	}
	if len(namespaces) > s.maxNS {
		problems = append(problems, fmt.Errorf("the blocks are in %d namespaces; this node holds at most %d (max namespaces)", len(namespaces), s.maxNS))
	}
	if len(problems) > 0 {
		return 0, api.Errorf(api.ErrInvalidArgument, "store: restore: %v", errors.Join(problems...))
	}

	now := s.now()
	// The arena is one free run: carve each block out of the run that
	// follows the previous one, in offset order.
	run := uint32(0)
	for _, i := range order {
		b := blocks[i]
		if b.ExpiresUnixNano != 0 && b.ExpiresUnixNano <= now.UnixNano() {
			expired++
			continue
		}
		page, pages := uint32(b.Offset>>s.pageShift), s.pagesFor(b.Size)
		run = s.mu.alloc.carve(run, page, pages)
		ns, err := s.namespaceIDLocked([]byte(b.Tenant), []byte(b.Namespace), true)
		if err != nil {
			panic(fmt.Sprintf("store: restore: namespaces counted but refused: %v", err)) // checked above
		}
		s.addLiveLocked(ns, b.Key, page, b.Size, b.CRC, b.ExpiresUnixNano, now)
	}
	return expired, nil
}

// carve takes pages [start, start+n) out of the free run that begins at
// run and returns where the free space after them begins (a run's head,
// or the arena's end). REQUIRES: the run at run holds the range.
func (a *allocator) carve(run, start, n uint32) uint32 {
	length := a.freeHead[run]
	if length == 0 || start < run || start+n > run+length {
		panic(fmt.Sprintf("store: carve pages [%d, +%d) from free run [%d, +%d)", start, n, run, length))
	}
	a.remove(run, length)
	if start > run {
		a.insert(run, start-run)
	}
	after := start + n
	if after < run+length {
		a.insert(after, run+length-after)
	}
	return after
}

// Committed returns every live block as Restore takes them, and what
// mark returns, both under the store's lock: mark sees the journal at the
// very point the blocks describe (no commit or unlink between them), which
// is what compacting a journal needs. It holds the lock for the whole
// walk (about 50 ns a block).
func (s *Store) Committed(mark func() int64) ([]RestoredBlock, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]RestoredBlock, 0, s.mu.idx.count)
	for i := range s.mu.idx.entries.n {
		e := s.mu.idx.entries.at(i)
		if e.state != stateLive {
			continue
		}
		ni := &s.mu.ns.list[e.ns]
		out = append(out, RestoredBlock{Tenant: ni.tenant, Namespace: ni.namespace, Key: bytes.Clone(s.mu.idx.key(i)),
			Offset: int64(e.page) << s.pageShift, Size: int64(e.size), CRC: e.crc, ExpiresUnixNano: s.mu.expires[i]})
	}
	return out, mark()
}
