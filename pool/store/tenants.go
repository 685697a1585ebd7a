package store

import (
	"bytes"
	"container/heap"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/eviction"
)

// tenantState is one tenant's books and eviction policy on this node.
// Guarded by Store.mu.
type tenantState struct {
	name    string
	cfg     eviction.TenantConfig
	applied time.Time // when SetTenant last ran for it
	policy  eviction.Policy

	storedBytes, reservedBytes int64
	blocks                     int64
	hits, misses               uint64
	quotaEvictions             uint64
	pressureEvictions          uint64
	expirations                uint64
	rejected                   uint64
}

// TenantStats is one tenant's use of the node and what its policy did.
type TenantStats struct {
	Tenant                                         string
	Config                                         eviction.TenantConfig
	StoredBytes, ReservedBytes, Blocks             int64
	Hits, Misses                                   uint64
	QuotaEvictions, PressureEvictions, Expirations uint64
	Rejected                                       uint64
	// PolicyApplied is when the node last applied a policy change for
	// the tenant (zero: never).
	PolicyApplied time.Time
}

// evicted is a block an eviction removed, to tell the location sink
// after the lock is released. The key is a copy: the index reuses its
// bytes once the lock is gone.
type evicted struct{ tenant, namespace, key []byte }

// tenantLocked returns the state of tenant, creating it with the node's
// default config. REQUIRES: s.mu.
func (s *Store) tenantLocked(name string) *tenantState {
	if t, ok := s.mu.tenants[name]; ok {
		return t
	}
	cfg := s.defaultTenant
	t := &tenantState{name: name, cfg: cfg, policy: eviction.New(cfg.Policy, eviction.Config{})}
	s.mu.tenants[name] = t
	return t
}

// evictionID is the policy's name for entry idx: idx+1, small and dense,
// so policies keep their per-block state in slices (a few bytes a block,
// no pointers for the collector to scan).
func evictionID(idx uint32) eviction.ID { return eviction.ID(idx) + 1 }

// entryOfLocked finds the live entry a policy names. REQUIRES: s.mu.
func (s *Store) entryOfLocked(id eviction.ID) (uint32, *entry, bool) {
	if id == 0 || uint64(id) > uint64(s.mu.idx.entries.n) {
		return 0, nil, false
	}
	idx := uint32(id - 1)
	e := s.mu.idx.entries.at(idx)
	return idx, e, e.state == stateLive
}

// heldLocked reports whether a block may not be evicted now: a reader
// holds its bytes or a read lease covers it. REQUIRES: s.mu.
func (s *Store) heldLocked(now time.Time) func(eviction.ID) bool {
	return func(id eviction.ID) bool {
		idx, e, ok := s.entryOfLocked(id)
		if !ok {
			return false
		}
		if e.pins > 0 {
			return true
		}
		until, ok := s.mu.leases[Pin{idx: idx, gen: e.gen}.Handle()]
		return ok && until > now.UnixNano()
	}
}

// evictLocked removes the victim t's policy names, if there is one.
// REQUIRES: s.mu.
func (s *Store) evictLocked(t *tenantState, now time.Time, out *[]evicted) bool {
	id, ok := t.policy.Victim(now, s.heldLocked(now))
	if !ok {
		return false
	}
	idx, e, found := s.entryOfLocked(id)
	if !found {
		// The policy and the index disagree: drop the stale name.
		t.policy.Remove(id)
		return true
	}
	ni := s.mu.ns.list[e.ns]
	*out = append(*out, evicted{[]byte(ni.tenant), []byte(ni.namespace), bytes.Clone(s.mu.idx.key(idx))})
	s.unlinkLocked(idx)
	return true
}

// makeRoomLocked frees space before a reservation of pages for t:
// first t's own quota (past its high watermark, down to its low), then
// node-wide pressure (past the arena's high watermark, down to its low,
// over-quota tenants and tenants without a quota first, never a tenant
// below its quota). It returns what it evicted and an error when the
// reservation cannot fit. REQUIRES: s.mu.
// fitsWithoutEvictingLocked reports whether a block of size bytes (pages
// pages) fits for tenant t with no eviction: below its quota's high
// watermark and the arena's. REQUIRES: s.mu.
func (s *Store) fitsWithoutEvictingLocked(t *tenantState, size int64, pages uint32) bool {
	if q := t.cfg.QuotaBytes; q > 0 && float64(t.storedBytes+t.reservedBytes+size) > t.cfg.High*float64(q) {
		return false
	}
	a := s.mu.alloc
	return uint64(a.pages)-a.freePages+uint64(pages) <= uint64(s.highWatermark*float64(a.pages)) && a.largestFree() >= pages
}

func (s *Store) makeRoomLocked(t *tenantState, hash uint64, size int64, pages uint32, now time.Time, out *[]evicted) error {
	if q := t.cfg.QuotaBytes; q > 0 {
		if size > q {
			t.rejected++
			return api.Errorf(api.ErrResourceExhausted, "store: a %d-byte block exceeds tenant %s's quota of %d bytes", size, t.name, q)
		}
		need := func() int64 { return t.storedBytes + t.reservedBytes + size }
		if float64(need()) > t.cfg.High*float64(q) && !s.noEviction {
			if victim, ok := t.policy.Victim(now, s.heldLocked(now)); ok && need() > q && !t.policy.Admit(eviction.Block{Hash: hash, Bytes: size}, victim) {
				t.rejected++
				return api.Errorf(api.ErrResourceExhausted, "store: tenant %s is at its quota and its %s policy did not admit the block: it is used less than what it would evict", t.name, t.cfg.Policy)
			}
			low := int64(t.cfg.Low * float64(q))
			for need() > low && s.evictLocked(t, now, out) {
				t.quotaEvictions++
			}
		}
		if need() > q {
			t.rejected++
			return api.Errorf(api.ErrResourceExhausted, "store: tenant %s would exceed its quota of %d bytes (%d stored, %d reserved); the rest is leased or being read",
				t.name, q, t.storedBytes, t.reservedBytes)
		}
	}
	a := s.mu.alloc
	high := uint64(s.highWatermark * float64(a.pages))
	low := uint64(s.lowWatermark * float64(a.pages))
	used := func() uint64 { return uint64(a.pages) - a.freePages }
	if s.noEviction || (used()+uint64(pages) <= high && a.largestFree() >= pages) {
		return nil // Reserve reports a failed allocation
	}
	// Pressure: evict down to the low watermark, and until the block fits.
	for used()+uint64(pages) > low || a.largestFree() < pages {
		v, ok := s.pressureVictimLocked(now)
		if !ok || !s.evictLocked(v, now, out) {
			break
		}
		v.pressureEvictions++
	}
	if a.largestFree() < pages {
		t.rejected++
		return api.Errorf(api.ErrResourceExhausted, "store: no room for %d bytes: %d of %d bytes free, largest free run %d bytes; what remains is within tenants' quotas, leased or being read",
			size, a.freePages<<s.pageShift, uint64(a.pages)<<s.pageShift, uint64(a.largestFree())<<s.pageShift)
	}
	return nil
}

// pressureVictimLocked picks the tenant node-wide pressure evicts from.
// REQUIRES: s.mu.
func (s *Store) pressureVictimLocked(now time.Time) (*tenantState, bool) {
	s.mu.scratchTenants = s.mu.scratchTenants[:0]
	s.mu.scratchUsage = s.mu.scratchUsage[:0]
	held := s.heldLocked(now)
	for _, t := range s.mu.tenants {
		_, evictable := t.policy.Victim(now, held)
		s.mu.scratchTenants = append(s.mu.scratchTenants, t)
		s.mu.scratchUsage = append(s.mu.scratchUsage, eviction.TenantUsage{UsedBytes: t.storedBytes, QuotaBytes: t.cfg.QuotaBytes, Evictable: evictable})
	}
	i, ok := eviction.PickTenant(s.mu.scratchUsage)
	if !ok {
		return nil, false
	}
	return s.mu.scratchTenants[i], true
}

// SetTenant applies a tenant's config live: a new policy takes over the
// tenant's blocks in their current order of the index, a lower quota
// evicts at once. A nil cfg returns the tenant to the node's default.
func (s *Store) SetTenant(name string, cfg *eviction.TenantConfig) {
	now := s.now()
	var out []evicted
	s.mu.Lock()
	t := s.tenantLocked(name)
	next := s.defaultTenant
	if cfg != nil {
		next = cfg.WithDefaults()
	}
	t.applied = now
	if next.Policy != t.cfg.Policy {
		t.policy = eviction.New(next.Policy, eviction.Config{})
		for i := uint32(0); i < s.mu.idx.entries.n; i++ {
			e := s.mu.idx.entries.at(i)
			if e.state == stateLive && s.mu.ns.list[e.ns].t == t {
				t.policy.Add(s.blockLocked(i, e), now)
			}
		}
	}
	t.cfg = next
	if q := t.cfg.QuotaBytes; q > 0 && t.storedBytes+t.reservedBytes > int64(t.cfg.High*float64(q)) {
		low := int64(t.cfg.Low * float64(q))
		for t.storedBytes+t.reservedBytes > low && s.evictLocked(t, now, &out) {
			t.quotaEvictions++
		}
	}
	s.mu.Unlock()
	s.notifyEvicted(out)
}

// blockLocked describes entry idx to a policy. REQUIRES: s.mu.
func (s *Store) blockLocked(idx uint32, e *entry) eviction.Block {
	b := eviction.Block{ID: evictionID(idx), Hash: e.hash, Bytes: int64(e.size), Parent: eviction.ID(e.parent)}
	if at, ok := s.mu.expires[idx]; ok {
		b.Expires = time.Unix(0, at)
	}
	return b
}

func (s *Store) notifyEvicted(out []evicted) {
	if s.sink == nil {
		return
	}
	for _, ev := range out {
		s.sink.Removed(ev.tenant, ev.namespace, ev.key)
	}
}

// TenantStats lists every tenant the node has seen, by name.
func (s *Store) TenantStats() []TenantStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TenantStats, 0, len(s.mu.tenants))
	for _, t := range s.mu.tenants {
		out = append(out, TenantStats{
			Tenant: t.name, Config: t.cfg, StoredBytes: t.storedBytes, ReservedBytes: t.reservedBytes, Blocks: t.blocks,
			Hits: t.hits, Misses: t.misses, QuotaEvictions: t.quotaEvictions, PressureEvictions: t.pressureEvictions,
			Expirations: t.expirations, Rejected: t.rejected, PolicyApplied: t.applied,
		})
	}
	slices.SortFunc(out, func(a, b TenantStats) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out
}

// Lease takes a read lease of d on every key of the chain the node holds
// (a leading prefix when prefixOnly). While it lasts the blocks are not
// evicted and Remove fails unless forced. It returns how many leading
// keys are present and when the lease ends.
func (s *Store) Lease(tenant, ns []byte, keys [][]byte, d time.Duration) (int, time.Time, error) {
	for _, k := range keys {
		if err := api.ValidateKeyBytes(tenant, ns, k); err != nil {
			return 0, time.Time{}, err
		}
	}
	if s.draining.Load() {
		return 0, time.Time{}, errDraining("leases")
	}
	until := s.now().Add(d)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range keys {
		idx, ok := s.lookupLocked(tenant, ns, k)
		if !ok {
			return i, until, nil
		}
		s.leaseLocked(idx, until)
	}
	return len(keys), until, nil
}

// leaseLocked extends entry idx's lease to until. REQUIRES: s.mu.
func (s *Store) leaseLocked(idx uint32, until time.Time) {
	h := Pin{idx: idx, gen: s.mu.idx.entries.at(idx).gen}.Handle()
	if until.UnixNano() > s.mu.leases[h] {
		s.mu.leases[h] = until.UnixNano()
	}
}

// expiry orders blocks with a TTL by when they expire.
type expiryItem struct {
	at     int64 // Unix ns
	handle uint64
}

type expiryHeap []expiryItem

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiryItem)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Sweep drops ended leases and evicts blocks whose TTL has passed (a
// block leased or being read waits for that to end). It returns how many
// blocks expired.
func (s *Store) Sweep(now time.Time) int {
	var out []evicted
	s.mu.Lock()
	ns := now.UnixNano()
	for h, until := range s.mu.leases {
		if until <= ns {
			delete(s.mu.leases, h)
		}
	}
	n := 0
	held := s.heldLocked(now)
	var later []expiryItem
	for s.mu.expiry.Len() > 0 && s.mu.expiry[0].at <= ns {
		it := heap.Pop(&s.mu.expiry).(expiryItem)
		idx, gen := pinFromHandle(it.handle)
		if idx >= s.mu.idx.entries.n {
			continue
		}
		e := s.mu.idx.entries.at(idx)
		if e.gen != gen || e.state != stateLive || s.mu.expires[idx] != it.at {
			continue // gone, or its expiry moved
		}
		if held(evictionID(idx)) {
			later = append(later, expiryItem{at: ns + int64(time.Second), handle: it.handle})
			continue
		}
		t := s.mu.ns.list[e.ns].t
		ni := s.mu.ns.list[e.ns]
		out = append(out, evicted{[]byte(ni.tenant), []byte(ni.namespace), bytes.Clone(s.mu.idx.key(idx))})
		s.unlinkLocked(idx)
		t.expirations++
		n++
	}
	for _, it := range later {
		idx, _ := pinFromHandle(it.handle)
		s.mu.expires[idx] = it.at
		heap.Push(&s.mu.expiry, it)
	}
	s.mu.Unlock()
	s.notifyEvicted(out)
	return n
}

// linkLocked records parent (an eviction id, 0 for none) as entry idx's
// chain parent, telling a prefix-aware policy. REQUIRES: s.mu.
func (s *Store) linkLocked(idx, parent uint32) {
	e := s.mu.idx.entries.at(idx)
	if parent == 0 || e.parent == parent {
		return
	}
	e.parent = parent
	if t := s.mu.ns.list[e.ns].t; t.cfg.Policy == eviction.PrefixLRU {
		t.policy.Add(s.blockLocked(idx, e), s.now())
	}
}

// LeasedBlocks counts blocks under a read lease now.
func (s *Store) LeasedBlocks(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, until := range s.mu.leases {
		if until > now.UnixNano() {
			n++
		}
	}
	return n
}

// HeldBlock is a live block as a drain sees it.
type HeldBlock struct {
	Tenant, Namespace string
	Key               []byte // a copy
	Size              int64
	// LeasedUntil is when the block's read lease ends; zero when it has
	// none.
	LeasedUntil time.Time
}

// Hottest lists the live blocks in the order a drain should hand them
// to peers: those under a read lease at now first, then the rest, each
// tenant's blocks hottest first by its own policy (Rank read from the
// back), the tenants taking turns. It holds the store's lock while it
// ranks: O(n log n).
func (s *Store) Hottest(now time.Time) []HeldBlock {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := slices.Sorted(maps.Keys(s.mu.tenants))
	ranks := make([][]eviction.ID, len(names))
	turns := 0
	for i, name := range names {
		ranks[i] = s.mu.tenants[name].policy.Rank(nil)
		slices.Reverse(ranks[i])
		turns = max(turns, len(ranks[i]))
	}
	var leased, rest []HeldBlock
	for turn := range turns {
		for _, r := range ranks {
			if turn >= len(r) {
				continue
			}
			idx, e, ok := s.entryOfLocked(r[turn])
			if !ok {
				continue // the policy and the index disagree: Check reports it
			}
			ni := &s.mu.ns.list[e.ns]
			b := HeldBlock{Tenant: ni.tenant, Namespace: ni.namespace, Key: bytes.Clone(s.mu.idx.key(idx)), Size: int64(e.size)}
			if until := s.mu.leases[Pin{idx: idx, gen: e.gen}.Handle()]; until > now.UnixNano() {
				b.LeasedUntil = time.Unix(0, until)
				leased = append(leased, b)
			} else {
				rest = append(rest, b)
			}
		}
	}
	return append(leased, rest...)
}

// LeasedUntil reports when the read lease on a block ends, or the zero
// time when the store holds no such block or no lease on it.
func (s *Store) LeasedUntil(tenant, ns, key []byte, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx, ok := s.lookupLocked(tenant, ns, key)
	if !ok {
		return time.Time{}
	}
	if until := s.mu.leases[Pin{idx: idx, gen: s.mu.idx.entries.at(idx).gen}.Handle()]; until > now.UnixNano() {
		return time.Unix(0, until)
	}
	return time.Time{}
}
