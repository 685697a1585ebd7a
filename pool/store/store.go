package store

import (
	"bytes"
	"container/heap"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/eviction"
)

// Store is the block store of one node: the arena, its allocator, the
// index, namespaces and open reservations. Every method is safe for
// concurrent use; one mutex guards the metadata and is never held while
// block bytes are copied or checksummed.
//
// Puts are two-phase. Reserve allocates pages and returns a Reservation
// whose Bytes the writer fills (a server handler from a socket, or a
// same-host client through its mapping); Commit checksums the bytes and
// publishes the block, Abort gives the pages back. A reservation that is
// neither committed nor aborted within Config.ReservationTimeout is
// reclaimed by ReclaimExpired, unless a server handler owns it (handlers
// enforce their own deadline and always end their reservations).
//
// Readers Acquire a Pin and Release it when done; a pinned block keeps its
// bytes even when removed, and its pages are freed on the last release.
type Store struct {
	mem []byte // the arena
	// versions has one word per arena page, shared read-only with
	// same-host clients: the pin handle of the live block that starts at
	// that page, or 0. Written only under mu: set at commit, cleared at
	// removal before the pages can be reused. Clients use it as a seqlock
	// to read cached blocks without asking the node (api shm.go). nil when
	// the node offers no shared memory.
	versions  []uint64
	pageShift uint
	pageBytes int64
	maxBlock  int64
	maxNS     int
	resTTL    time.Duration
	now       func() time.Time
	// sink hears of every block committed and removed, after the fact and
	// outside mu; nil for a standalone node. Set by SetSink before use.
	sink LocationSink
	// journal hears of the same under mu, in order; nil when the node
	// keeps no journal. Set by SetJournal before use.
	journal Journal
	// spiller is offered the blocks a tenant's disk policy admits; nil
	// without a disk tier. Set by SetSpiller before use.
	spiller Spiller
	// defaultTenant is the config of tenants without a stored policy;
	// highWatermark and lowWatermark are fractions of the arena (see
	// Config).
	defaultTenant               eviction.TenantConfig
	highWatermark, lowWatermark float64
	noEviction                  bool
	// draining refuses new blocks and leases (SetDraining).
	draining atomic.Bool

	mu struct {
		sync.Mutex
		alloc      *allocator
		idx        *index
		ns         namespaceTable
		res        map[uint64]*Reservation
		nextHandle uint64

		storedBytes   uint64 // sum of live values' sizes
		livePages     uint64 // pages held by live and dead-but-pinned blocks
		reservedPages uint64
		pins          uint64 // reader pins held, on every block
		scratch       []byte

		// Eviction: every tenant's books and policy, read leases (pin
		// handle → until, Unix ns), and the blocks with a TTL (entry
		// index → expiry, and a heap of them by expiry).
		tenants        map[string]*tenantState
		leases         map[uint64]int64
		expires        map[uint32]int64
		expiry         expiryHeap
		scratchTenants []*tenantState
		scratchUsage   []eviction.TenantUsage
	}
}

// LocationSink hears where blocks are: the cluster membership publishes
// them. Calls come after the change, never under the store's lock, and
// MUST NOT block.
type LocationSink interface {
	Added(tenant, namespace, key []byte)
	Removed(tenant, namespace, key []byte)
}

// Journal records where committed blocks are, so a node restarted over
// the same arena can adopt them (pool/journal). Its methods are called
// under the store's lock, in the order the changes happen: they MUST NOT
// block or call the store. The key is only valid during the call.
type Journal interface {
	// Committed: a block now lives at offset (bytes into the arena);
	// expiresUnixNano is when its TTL ends, 0 for none.
	Committed(tenant, namespace string, key []byte, offset, size int64, crc uint32, expiresUnixNano int64)
	// Unlinked: the block left the index (removed, evicted or expired).
	// Its pages may be reused after this call.
	Unlinked(tenant, namespace string, key []byte)
}

// Spiller copies admitted blocks to a disk tier behind the arena
// (pool/disk), so they outlive their eviction from memory. Offer is
// called under the store's lock when a block's reads reach its tenant's
// DiskAdmitReads (again after as many more reads when it declined): it
// MUST NOT block or call the store.
// It owns pin from then on and MUST Release it (outside the lock) once it
// has copied the bytes, or at once when it declines; it returns false to
// decline without taking the pin. The strings and key are only valid
// during the call.
type Spiller interface {
	Offer(tenant, namespace string, key []byte, pin Pin, expiresUnixNano int64) bool
}

// SetSpiller makes sp hear of the blocks admitted to the disk from now
// on. Call it before the store is used concurrently.
func (s *Store) SetSpiller(sp Spiller) { s.spiller = sp }

// SetJournal makes j hear of every block committed and unlinked from now
// on. Call it before the store is used concurrently.
func (s *Store) SetJournal(j Journal) { s.journal = j }

// SetSink makes sink hear of every block committed and removed from now
// on. Call it before the store is used concurrently.
func (s *Store) SetSink(sink LocationSink) { s.sink = sink }

// VersionWords is how many version words the store keeps: one per page
// of the arena, or 0 without shared memory.
func (s *Store) VersionWords() int { return len(s.versions) }

// namespaceTable interns (tenant, namespace) pairs into small ids and keeps
// their usage. A pair is forgotten when nothing refers to it any more (its
// last block is freed, its last reservation ends) and its id serves the
// next new pair: MaxNamespaces bounds the pairs in use, not the pairs ever
// seen.
type namespaceTable struct {
	ids  map[string]uint32 // tenant + "\x00" + namespace
	list []namespaceInfo
	free []uint32 // ids of forgotten pairs, for reuse
}

type namespaceInfo struct {
	tenant, namespace string
	t                 *tenantState // nil in a free slot
	blocks            uint64
	storedBytes       uint64
	// refs counts what names this pair by id: index entries (live, or
	// dead and still pinned) and open reservations.
	refs uint64
}

// Reservation is space held for a value that is being written. Its Bytes
// are the value's final location in the arena.
type Reservation struct {
	handle uint64
	ns     uint32
	// tenant and namespace name ns (the namespace table's strings).
	tenant, namespace string
	key               []byte
	page              uint32
	offset            int64 // of page, in bytes
	size              int64
	deadline          time.Time
	// serverOwned reservations are written by a handler in this process,
	// which always ends them; the sweeper leaves them alone.
	serverOwned bool
	// committing is set once Commit starts; the sweeper then skips r.
	committing bool
	// promotion reservations bring a block of this node's own disk into
	// memory: a drain does not refuse them.
	promotion bool
	mem       []byte
}

// Handle identifies the reservation to same-host clients.
func (r *Reservation) Handle() uint64 { return r.handle }

// Offset is the value's byte offset in the segment.
func (r *Reservation) Offset() int64 { return r.offset }

// Bytes is where the value must be written. It is valid until Commit or
// Abort returns.
func (r *Reservation) Bytes() []byte { return r.mem }

// Size is the value's length in bytes.
func (r *Reservation) Size() int64 { return r.size }

// Name is the block's tenant, namespace and key. The key MUST NOT be
// modified.
func (r *Reservation) Name() (tenant, namespace string, key []byte) {
	return r.tenant, r.namespace, r.key
}

// Pin holds a committed block's bytes for a reader. The zero Pin is
// invalid. Callers MUST Release every Pin they Acquire.
type Pin struct {
	idx, gen uint32
	Mem      []byte // the value; read-only, valid until Release
	CRC      uint32
	Offset   int64
}

// Handle packs the pin into a number a same-host client can hand back. It
// is never 0, which the versions words use for "no block".
func (p Pin) Handle() uint64 { return uint64(p.gen)<<32 | uint64(p.idx+1) }

func pinFromHandle(h uint64) (idx, gen uint32) { return uint32(h) - 1, uint32(h >> 32) }

// New returns a store over the arena mem (cfg.CapacityBytes long) and,
// when the node shares them with same-host clients, one version word per
// page (else nil). cfg must be valid (Config.Validate). The store keeps
// both until the caller unmaps them, after its last use.
func New(cfg Config, now func() time.Time, mem []byte, versions []uint64) *Store {
	cfg = cfg.WithDefaults()
	s := &Store{
		mem:       mem,
		versions:  versions,
		pageShift: uint(bits.TrailingZeros64(uint64(cfg.PageBytes))),
		pageBytes: cfg.PageBytes,
		maxBlock:  cfg.MaxBlockBytes,
		maxNS:     cfg.MaxNamespaces,
		resTTL:    cfg.ReservationTimeout,
		now:       now,

		defaultTenant: cfg.DefaultTenant.WithDefaults(),
		highWatermark: cfg.HighWatermark,
		lowWatermark:  cfg.LowWatermark,
		noEviction:    cfg.DisableEviction,
	}
	s.mu.tenants = map[string]*tenantState{}
	s.mu.leases = map[uint64]int64{}
	s.mu.expires = map[uint32]int64{}
	s.mu.alloc = newAllocator(uint32(cfg.CapacityBytes / cfg.PageBytes))
	s.mu.idx = newIndex()
	s.mu.ns = namespaceTable{ids: map[string]uint32{}}
	s.mu.res = map[uint64]*Reservation{}
	return s
}

func (s *Store) pagesFor(size int64) uint32 {
	return uint32((size + s.pageBytes - 1) >> s.pageShift)
}

func (s *Store) memAt(page uint32, size int64) []byte {
	off := int64(page) << s.pageShift
	return s.mem[off : off+size : off+size]
}

// namespaceIDLocked returns the id of (tenant, ns), creating it when create
// is set. REQUIRES: s.mu.
func (s *Store) namespaceIDLocked(tenant, ns []byte, create bool) (uint32, error) {
	s.mu.scratch = append(append(append(s.mu.scratch[:0], tenant...), 0), ns...)
	if id, ok := s.mu.ns.ids[string(s.mu.scratch)]; ok {
		return id, nil
	}
	if !create {
		return 0, api.ErrNotFound
	}
	info := namespaceInfo{tenant: string(tenant), namespace: string(ns), t: s.tenantLocked(string(tenant))}
	var id uint32
	switch {
	case len(s.mu.ns.free) > 0:
		id = s.mu.ns.free[len(s.mu.ns.free)-1]
		s.mu.ns.free = s.mu.ns.free[:len(s.mu.ns.free)-1]
		s.mu.ns.list[id] = info
	case len(s.mu.ns.list) >= s.maxNS:
		return 0, api.Errorf(api.ErrResourceExhausted, "store: node already holds blocks in %d namespaces, its limit (max namespaces)", s.maxNS)
	default:
		id = uint32(len(s.mu.ns.list))
		s.mu.ns.list = append(s.mu.ns.list, info)
	}
	s.mu.ns.ids[string(s.mu.scratch)] = id
	return id, nil
}

// unrefNamespaceLocked drops one reference to namespace id and forgets the
// pair when none is left. REQUIRES: s.mu.
func (s *Store) unrefNamespaceLocked(id uint32) {
	ni := &s.mu.ns.list[id]
	ni.refs--
	if ni.refs > 0 {
		return
	}
	delete(s.mu.ns.ids, ni.tenant+"\x00"+ni.namespace)
	*ni = namespaceInfo{}
	s.mu.ns.free = append(s.mu.ns.free, id)
}

// ValidateSize checks a value length against the node's limits.
func (s *Store) ValidateSize(size int64) error {
	switch {
	case size <= 0:
		return api.Errorf(api.ErrInvalidArgument, "store: value size %d must be positive", size)
	case size > s.maxBlock:
		return api.Errorf(api.ErrInvalidArgument, "store: value of %d bytes exceeds the node's max block size of %d bytes", size, s.maxBlock)
	}
	return nil
}

// Reserve allocates space for a value of size bytes under (tenant, ns,
// key). serverOwned marks a reservation written by a handler in this
// process. Errors: ErrInvalidArgument for a bad key or size,
// ErrResourceExhausted when no free run is long enough.
func (s *Store) Reserve(tenant, ns, key []byte, size int64, serverOwned bool) (*Reservation, error) {
	return s.reserve(tenant, ns, key, size, serverOwned, false, false)
}

// ReservePromotion is Reserve for a block the node already holds on its
// disk tier, coming into memory to be read: it is not a new block, so a
// drain lets it through.
func (s *Store) ReservePromotion(tenant, ns, key []byte, size int64) (*Reservation, error) {
	return s.reserve(tenant, ns, key, size, true, false, true)
}

// SetDraining makes the store refuse new blocks and new read leases
// (on), or take them again (off): Reserve, ReserveSpare, PutBytes, Lease
// and the Commit of a reservation made before are ErrUnavailable, saying
// the node is draining, so clients put elsewhere. Reads, removals and
// promotions from the disk go on. Safe to call concurrently with
// anything.
func (s *Store) SetDraining(on bool) { s.draining.Store(on) }

// Draining reports whether SetDraining(true) is in force.
func (s *Store) Draining() bool { return s.draining.Load() }

func errDraining(what string) error {
	return api.Errorf(api.ErrUnavailable, "store: the node is draining and takes no new %s; use another node", what)
}

// ReserveSpare is Reserve for space held ahead of a put that may not come:
// a same-host session's next place (see pool's FlagReserveNext handling).
// It never evicts: when the block would not fit below the tenant's quota
// high watermark and the arena's, it fails with ErrResourceExhausted,
// which counts as no rejection. The reservation is server-owned (the
// session ends it).
func (s *Store) ReserveSpare(tenant, ns, key []byte, size int64) (*Reservation, error) {
	return s.reserve(tenant, ns, key, size, true, true, false)
}

func (s *Store) reserve(tenant, ns, key []byte, size int64, serverOwned, spare, promotion bool) (*Reservation, error) {
	if err := api.ValidateKeyBytes(tenant, ns, key); err != nil {
		return nil, err
	}
	if !promotion && s.draining.Load() {
		return nil, errDraining("blocks")
	}
	if err := s.ValidateSize(size); err != nil {
		return nil, err
	}
	pages := s.pagesFor(size)
	now := s.now()
	var out []evicted
	defer func() { s.notifyEvicted(out) }() // after the unlock below
	s.mu.Lock()
	defer s.mu.Unlock()
	nsID, err := s.namespaceIDLocked(tenant, ns, true)
	if err != nil {
		return nil, err
	}
	// The reservation's reference, taken now so evictions below cannot
	// forget the pair under us; dropped again on failure.
	s.mu.ns.list[nsID].refs++
	t := s.mu.ns.list[nsID].t
	if spare && !s.fitsWithoutEvictingLocked(t, size, pages) {
		s.unrefNamespaceLocked(nsID)
		return nil, api.Errorf(api.ErrResourceExhausted, "store: no room for a spare of %d bytes without evicting", size)
	}
	if err := s.makeRoomLocked(t, s.mu.idx.hash(nsID, key), size, pages, now, &out); err != nil {
		s.unrefNamespaceLocked(nsID)
		return nil, err
	}
	page, ok := s.mu.alloc.alloc(pages)
	if !ok {
		t.rejected++
		s.unrefNamespaceLocked(nsID)
		return nil, api.Errorf(api.ErrResourceExhausted, "store: no room for %d bytes: %d of %d bytes free, largest free run %d bytes",
			size, s.mu.alloc.freePages<<s.pageShift, uint64(s.mu.alloc.pages)<<s.pageShift, uint64(s.mu.alloc.largestFree())<<s.pageShift)
	}
	s.mu.nextHandle++
	ni := &s.mu.ns.list[nsID]
	r := &Reservation{
		handle:      s.mu.nextHandle,
		ns:          nsID,
		tenant:      ni.tenant,
		namespace:   ni.namespace,
		key:         bytes.Clone(key),
		page:        page,
		offset:      int64(page) << s.pageShift,
		size:        size,
		deadline:    s.now().Add(s.resTTL),
		serverOwned: serverOwned,
		promotion:   promotion,
		mem:         s.memAt(page, size),
	}
	s.mu.res[r.handle] = r
	s.mu.reservedPages += uint64(pages)
	t.reservedBytes += size
	return r, nil
}

// endReservationLocked removes r from the table and reports whether it was
// still open. REQUIRES: s.mu.
func (s *Store) endReservationLocked(r *Reservation) bool {
	if s.mu.res[r.handle] != r {
		return false
	}
	delete(s.mu.res, r.handle)
	s.mu.reservedPages -= uint64(s.pagesFor(r.size))
	s.mu.ns.list[r.ns].t.reservedBytes -= r.size
	s.unrefNamespaceLocked(r.ns)
	return true
}

// Abort gives r's pages back. Aborting an ended reservation does nothing.
func (s *Store) Abort(r *Reservation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.endReservationLocked(r) {
		s.mu.alloc.free(r.page, s.pagesFor(r.size))
	}
}

// PutBytes stores value in one step: reserve, copy, commit.
func (s *Store) PutBytes(tenant, ns, key, value []byte, want uint32, haveWant bool) (CommitResult, error) {
	res, err := s.Reserve(tenant, ns, key, int64(len(value)), true)
	if err != nil {
		return CommitResult{}, err
	}
	copy(res.Bytes(), value)
	return s.Commit(res, api.Checksum(value), true, want, haveWant)
}

// CommitResult says what a commit did.
type CommitResult struct {
	// Existed is true when an identical block was already committed; the
	// reservation's pages were given back.
	Existed bool
	// CRC is the checksum stored with the block.
	CRC uint32
}

// Commit publishes r's bytes as a block. crc is the CRC-32C of the bytes as
// the committer computed them while writing; when haveCRC is false the
// store computes it now. want, when haveWant is set, is the checksum the
// client claims: a mismatch is ErrDataLoss. A key that already holds equal
// bytes succeeds with Existed; different bytes give ErrAlreadyExists. On
// every error the reservation is aborted and no committed block changes.
func (s *Store) Commit(r *Reservation, crc uint32, haveCRC bool, want uint32, haveWant bool) (CommitResult, error) {
	s.mu.Lock()
	if s.mu.res[r.handle] != r || r.committing {
		s.mu.Unlock()
		return CommitResult{}, api.Errorf(api.ErrFailedPrecondition, "store: reservation %d expired or already ended", r.handle)
	}
	// From here on the sweeper leaves r alone and nobody else commits it.
	r.committing = true
	s.mu.Unlock()

	if !haveCRC {
		crc = api.Checksum(r.mem)
	}
	if haveWant && want != crc {
		s.Abort(r)
		return CommitResult{}, api.Errorf(api.ErrDataLoss, "store: value checksum %08x, client sent %08x", crc, want)
	}
	s.mu.Lock()
	if !r.promotion && s.draining.Load() {
		// Checked again where the block would go live: a drain's list of
		// blocks (Hottest, under mu) has every block committed before it.
		s.mu.Unlock()
		s.Abort(r)
		return CommitResult{}, errDraining("blocks")
	}
	if idx, ok := s.mu.idx.lookup(r.ns, r.key); ok {
		// Blocks are immutable: compare with what is there, outside the
		// lock, while both stay pinned.
		e := s.mu.idx.entries.at(idx)
		same := int64(e.size) == r.size && e.crc == crc
		var pin Pin
		if same {
			pin = s.pinLocked(idx)
		}
		ni := s.mu.ns.list[r.ns]
		s.mu.Unlock()
		if same {
			same = bytes.Equal(pin.Mem, r.mem)
			s.Release(pin)
		}
		s.Abort(r)
		if same {
			return CommitResult{Existed: true, CRC: crc}, nil
		}
		return CommitResult{}, api.Errorf(api.ErrAlreadyExists, "store: key %x in %s/%s holds a different value", r.key, ni.tenant, ni.namespace)
	}
	ni := &s.mu.ns.list[r.ns]
	now := s.now()
	var expires int64
	if ttl := ni.t.cfg.DefaultTTL; ttl > 0 {
		expires = now.Add(ttl).UnixNano()
	}
	s.addLiveLocked(r.ns, r.key, r.page, r.size, crc, expires, now)
	s.endReservationLocked(r) // after the entry took its namespace reference
	if s.journal != nil {
		s.journal.Committed(ni.tenant, ni.namespace, r.key, r.offset, r.size, crc, expires)
	}
	s.mu.Unlock()
	if s.sink != nil {
		s.sink.Added([]byte(ni.tenant), []byte(ni.namespace), r.key)
	}
	return CommitResult{CRC: crc}, nil
}

// addLiveLocked makes the block at page a live entry of namespace ns:
// the index, the version word, the books of the arena, the namespace and
// the tenant, its expiry (expires in Unix ns; 0 for none) and its
// tenant's policy. Commit and Restore share it. REQUIRES: s.mu.
func (s *Store) addLiveLocked(ns uint32, key []byte, page uint32, size int64, crc uint32, expires int64, now time.Time) {
	idx := s.mu.idx.insert(ns, key)
	ni := &s.mu.ns.list[ns]
	ni.refs++ // the entry's
	e := s.mu.idx.entries.at(idx)
	e.page, e.size, e.crc, e.state = page, uint32(size), crc, stateLive
	if s.versions != nil {
		atomic.StoreUint64(&s.versions[e.page], Pin{idx: idx, gen: e.gen}.Handle())
	}
	s.mu.livePages += uint64(s.pagesFor(size))
	s.mu.storedBytes += uint64(size)
	ni.blocks++
	ni.storedBytes += uint64(size)
	t := ni.t
	t.storedBytes += size
	t.blocks++
	if expires != 0 {
		s.mu.expires[idx] = expires
		heap.Push(&s.mu.expiry, expiryItem{at: expires, handle: Pin{idx: idx, gen: e.gen}.Handle()})
	}
	t.policy.Add(s.blockLocked(idx, e), now)
}

// pinLocked takes a reader's pin on entry idx. REQUIRES: s.mu.
func (s *Store) pinLocked(idx uint32) Pin {
	e := s.mu.idx.entries.at(idx)
	if e.pins == ^uint16(0) {
		panic("store: pin count overflow")
	}
	e.pins++
	s.mu.pins++
	return Pin{idx: idx, gen: e.gen, Mem: s.memAt(e.page, int64(e.size)), CRC: e.crc, Offset: int64(e.page) << s.pageShift}
}

// Acquire pins the block under (tenant, ns, key) for reading. Errors:
// ErrInvalidArgument, ErrNotFound.
func (s *Store) Acquire(tenant, ns, key []byte) (Pin, error) {
	if err := api.ValidateKeyBytes(tenant, ns, key); err != nil {
		return Pin{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	idx, ok := s.lookupLocked(tenant, ns, key)
	if !ok {
		if nsID, err := s.namespaceIDLocked(tenant, ns, false); err == nil {
			t := s.mu.ns.list[nsID].t
			t.misses++
			t.policy.Miss(s.mu.idx.hash(nsID, key))
		}
		return Pin{}, api.Errorf(api.ErrNotFound, "store: no block %s/%s/%x", tenant, ns, key)
	}
	e := s.mu.idx.entries.at(idx)
	t := s.mu.ns.list[e.ns].t
	t.hits++
	t.policy.Touch(evictionID(idx), s.now())
	s.countReadLocked(idx, e, t)
	return s.pinLocked(idx), nil
}

// countReadLocked counts a read of entry idx and offers the block to the
// disk tier once its tenant's admission is met. REQUIRES: s.mu.
func (s *Store) countReadLocked(idx uint32, e *entry, t *tenantState) {
	if s.spiller == nil || t.cfg.NoDisk || e.reads&readsOffered != 0 {
		return
	}
	if e.reads&readsMask < readsMask {
		e.reads++
	}
	if int(e.reads&readsMask) < t.cfg.DiskAdmitReads {
		return
	}
	e.reads |= readsOffered
	ni := &s.mu.ns.list[e.ns]
	pin := s.pinLocked(idx)
	if !s.spiller.Offer(ni.tenant, ni.namespace, s.mu.idx.key(idx), pin, s.mu.expires[idx]) {
		// Declined (the disk already holds it, or is busy): the block
		// is offered again after as many reads more.
		e.reads = 0
		if err := s.releaseLocked(pin.idx, pin.gen); err != nil {
			panic(err)
		}
	}
}

func (s *Store) lookupLocked(tenant, ns, key []byte) (uint32, bool) {
	nsID, err := s.namespaceIDLocked(tenant, ns, false)
	if err != nil {
		return 0, false
	}
	return s.mu.idx.lookup(nsID, key)
}

// Release drops a pin taken by Acquire. The pages of a block removed while
// pinned are freed on its last release.
func (s *Store) Release(p Pin) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.releaseLocked(p.idx, p.gen); err != nil {
		panic(err)
	}
}

// ReleaseHandle drops a pin that a same-host client names by handle. A
// handle that names no pin is an error, not a panic: clients are outside
// our control.
func (s *Store) ReleaseHandle(h uint64) error {
	idx, gen := pinFromHandle(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.releaseLocked(idx, gen)
}

func (s *Store) releaseLocked(idx, gen uint32) error {
	if idx >= s.mu.idx.entries.n {
		return api.Errorf(api.ErrInvalidArgument, "store: no pin %d", idx)
	}
	e := s.mu.idx.entries.at(idx)
	if e.gen != gen || e.pins == 0 || e.state == stateFree {
		return api.Errorf(api.ErrInvalidArgument, "store: pin %d.%d is not held", idx, gen)
	}
	e.pins--
	s.mu.pins--
	if e.pins == 0 && e.state == stateDead {
		s.freeEntryLocked(idx)
	}
	return nil
}

func (s *Store) freeEntryLocked(idx uint32) {
	e := s.mu.idx.entries.at(idx)
	pages, ns := s.pagesFor(int64(e.size)), e.ns
	s.mu.alloc.free(e.page, pages)
	s.mu.livePages -= uint64(pages)
	s.mu.idx.releaseEntry(idx)
	s.unrefNamespaceLocked(ns)
}

// Remove deletes the block under (tenant, ns, key). Readers holding it
// keep their bytes until they release them. Errors: ErrInvalidArgument,
// ErrNotFound.
func (s *Store) Remove(tenant, ns, key []byte) error { return s.RemoveForce(tenant, ns, key, false) }

// RemoveForce is Remove; a block under a read lease is removed only when
// force is set, and is otherwise ErrFailedPrecondition.
func (s *Store) RemoveForce(tenant, ns, key []byte, force bool) error {
	if err := api.ValidateKeyBytes(tenant, ns, key); err != nil {
		return err
	}
	if err := s.remove(tenant, ns, key, force); err != nil {
		return err
	}
	if s.sink != nil {
		s.sink.Removed(tenant, ns, key)
	}
	return nil
}

func (s *Store) remove(tenant, ns, key []byte, force bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx, ok := s.lookupLocked(tenant, ns, key)
	if !ok {
		return api.Errorf(api.ErrNotFound, "store: no block %s/%s/%x", tenant, ns, key)
	}
	if until, ok := s.mu.leases[Pin{idx: idx, gen: s.mu.idx.entries.at(idx).gen}.Handle()]; ok && !force && until > s.now().UnixNano() {
		return api.Errorf(api.ErrFailedPrecondition, "store: block %s/%s/%x is under a read lease until %s; remove with force to override",
			tenant, ns, key, time.Unix(0, until).UTC().Format(time.RFC3339Nano))
	}
	s.unlinkLocked(idx)
	return nil
}

// unlinkLocked takes live entry idx out of the index, its tenant's books
// and policy; its pages are freed now, or on the last reader's release.
// REQUIRES: s.mu.
func (s *Store) unlinkLocked(idx uint32) {
	e := s.mu.idx.entries.at(idx)
	t := s.mu.ns.list[e.ns].t
	t.policy.Remove(evictionID(idx))
	t.storedBytes -= int64(e.size)
	t.blocks--
	delete(s.mu.expires, idx)
	delete(s.mu.leases, Pin{idx: idx, gen: e.gen}.Handle())
	if s.journal != nil {
		// Before the pages can be freed, so the journal never holds a
		// later block's record ahead of this one's end.
		ni := &s.mu.ns.list[e.ns]
		s.journal.Unlinked(ni.tenant, ni.namespace, s.mu.idx.key(idx))
	}
	s.mu.idx.unlink(idx)
	e.state = stateDead
	if s.versions != nil {
		// Before the pages can be freed: a client reading this block
		// from its cache sees the change and goes to the node.
		atomic.StoreUint64(&s.versions[e.page], 0)
	}
	s.mu.storedBytes -= uint64(e.size)
	ni := &s.mu.ns.list[e.ns]
	ni.blocks--
	ni.storedBytes -= uint64(e.size)
	if e.pins == 0 {
		s.freeEntryLocked(idx)
	}
}

// ForEach calls yield for every committed block until it returns false.
// It holds the lock for a few thousand blocks at a time, so puts and gets
// proceed meanwhile; blocks added or removed during the walk may or may
// not be seen (the location log covers them).
func (s *Store) ForEach(yield func(tenant, namespace string, key []byte) bool) {
	const chunk = 4096
	type item struct {
		tenant, namespace string
		key               []byte
	}
	var batch []item
	for start := uint32(0); ; start += chunk {
		batch = batch[:0]
		s.mu.Lock()
		end := min(start+chunk, s.mu.idx.entries.n)
		for i := start; i < end; i++ {
			if e := s.mu.idx.entries.at(i); e.state == stateLive {
				ni := &s.mu.ns.list[e.ns]
				batch = append(batch, item{ni.tenant, ni.namespace, bytes.Clone(s.mu.idx.key(i))})
			}
		}
		done := end >= s.mu.idx.entries.n
		s.mu.Unlock()
		for _, it := range batch {
			if !yield(it.tenant, it.namespace, it.key) {
				return
			}
		}
		if done {
			return
		}
	}
}

// Exists reports for each key whether the node holds it.
func (s *Store) Exists(tenant, ns []byte, keys [][]byte) ([]bool, error) {
	for _, k := range keys {
		if err := api.ValidateKeyBytes(tenant, ns, k); err != nil {
			return nil, err
		}
	}
	out := make([]bool, len(keys))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range keys {
		_, out[i] = s.lookupLocked(tenant, ns, k)
	}
	return out, nil
}

// Locate returns how many leading keys of the chain the node holds.
func (s *Store) Locate(tenant, ns []byte, chain [][]byte) (int, error) {
	for _, k := range chain {
		if err := api.ValidateKeyBytes(tenant, ns, k); err != nil {
			return 0, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	nsID, err := s.namespaceIDLocked(tenant, ns, false)
	if err != nil {
		return 0, nil
	}
	var parent uint32
	for i, k := range chain {
		idx, ok := s.mu.idx.lookup(nsID, k)
		if !ok {
			return i, nil
		}
		s.linkLocked(idx, parent)
		parent = uint32(evictionID(idx))
	}
	return len(chain), nil
}

// Rekey makes the open reservation r commit under key instead of the key
// it was reserved with; its tenant and namespace stay. A same-host session
// reserves a spare ahead of its next put (see wire.FlagReserveNext) and
// names the block only when it commits it.
func (s *Store) Rekey(r *Reservation, key []byte) error {
	if err := api.ValidateKeyBytes([]byte(r.tenant), []byte(r.namespace), key); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.res[r.handle] != r || r.committing {
		return api.Errorf(api.ErrFailedPrecondition, "store: reservation %d expired or already ended", r.handle)
	}
	r.key = append(r.key[:0], key...)
	return nil
}

// ReservationOpen reports whether the reservation with handle is still
// open: not committed, aborted or reclaimed.
func (s *Store) ReservationOpen(handle uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.mu.res[handle]
	return ok && !r.committing
}

// ReclaimExpired aborts every client-owned reservation whose deadline is
// before now and returns how many it reclaimed.
func (s *Store) ReclaimExpired(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.mu.res {
		if !r.serverOwned && !r.committing && r.deadline.Before(now) {
			s.endReservationLocked(r)
			s.mu.alloc.free(r.page, s.pagesFor(r.size))
			n++
		}
	}
	return n
}

// Stats is a snapshot of the store's usage.
type Stats struct {
	CapacityBytes, UsedBytes, FreeBytes, StoredBytes uint64
	Blocks, Reservations, ReservedBytes              uint64
	Pins                                             uint64 // reader pins held (views, reads in flight)
	PageBytes, LargestFreeBytes                      uint64
	FreeRuns                                         uint64
	ExternalFragmentation, InternalFragmentation     float64
	Namespaces                                       []NamespaceStats
}

// NamespaceStats is the usage of one (tenant, namespace).
type NamespaceStats struct {
	Tenant, Namespace   string
	Blocks, StoredBytes uint64
}

// Stats returns a snapshot of usage and allocator state.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.mu.alloc
	st := Stats{
		CapacityBytes:         uint64(a.pages) << s.pageShift,
		FreeBytes:             a.freePages << s.pageShift,
		StoredBytes:           s.mu.storedBytes,
		Blocks:                uint64(s.mu.idx.count),
		Reservations:          uint64(len(s.mu.res)),
		Pins:                  s.mu.pins,
		ReservedBytes:         s.mu.reservedPages << s.pageShift,
		PageBytes:             uint64(s.pageBytes),
		LargestFreeBytes:      uint64(a.largestFree()) << s.pageShift,
		FreeRuns:              a.freeRuns,
		ExternalFragmentation: a.externalFragmentation(),
	}
	st.UsedBytes = st.CapacityBytes - st.FreeBytes
	if live := s.mu.livePages << s.pageShift; live > 0 {
		st.InternalFragmentation = 1 - float64(s.mu.storedBytes)/float64(live)
	}
	for _, ni := range s.mu.ns.list {
		if ni.t == nil {
			continue // a free slot
		}
		st.Namespaces = append(st.Namespaces, NamespaceStats{Tenant: ni.tenant, Namespace: ni.namespace, Blocks: ni.blocks, StoredBytes: ni.storedBytes})
	}
	return st
}

// Check verifies that the counters match a walk of the index and the
// allocator, and every tenant's books their policy: tests call it after
// fault injection, and a node may at any time. It holds the lock for the
// walk.
func (s *Store) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.mu.alloc.checkInvariants(); err != nil {
		return err
	}
	var live, stored, pages uint64
	refs := make([]uint64, len(s.mu.ns.list))
	for _, r := range s.mu.res {
		refs[r.ns]++
	}
	for i := uint32(0); i < s.mu.idx.entries.n; i++ {
		e := s.mu.idx.entries.at(i)
		if e.state == stateLive || e.state == stateDead {
			refs[e.ns]++
		}
		switch e.state {
		case stateLive:
			live++
			stored += uint64(e.size)
			pages += uint64(s.pagesFor(int64(e.size)))
		case stateDead:
			pages += uint64(s.pagesFor(int64(e.size)))
		}
	}
	if live != uint64(s.mu.idx.count) || stored != s.mu.storedBytes || pages != s.mu.livePages {
		return fmt.Errorf("walk: %d live blocks, %d bytes, %d pages; counters: %d, %d, %d", live, stored, pages, s.mu.idx.count, s.mu.storedBytes, s.mu.livePages)
	}
	var tStored, tReserved, tBlocks int64
	for _, t := range s.mu.tenants {
		tStored, tReserved, tBlocks = tStored+t.storedBytes, tReserved+t.reservedBytes, tBlocks+t.blocks
		if int64(t.policy.Len()) != t.blocks {
			return fmt.Errorf("tenant %s: policy holds %d blocks, books say %d", t.name, t.policy.Len(), t.blocks)
		}
	}
	var resBytes int64
	for _, r := range s.mu.res {
		resBytes += r.size
	}
	if tStored != int64(stored) || tReserved != resBytes || tBlocks != int64(live) {
		return fmt.Errorf("tenants: %d bytes stored, %d reserved, %d blocks; store: %d, %d, %d", tStored, tReserved, tBlocks, stored, resBytes, live)
	}
	for id, ni := range s.mu.ns.list {
		if ni.refs != refs[id] || (ni.t == nil) != (refs[id] == 0) {
			return fmt.Errorf("namespace %d (%s/%s): %d references counted, %d found", id, ni.tenant, ni.namespace, ni.refs, refs[id])
		}
	}
	if used := uint64(s.mu.alloc.pages) - s.mu.alloc.freePages; used != pages+s.mu.reservedPages {
		return fmt.Errorf("allocator uses %d pages; blocks hold %d and reservations %d", used, pages, s.mu.reservedPages)
	}
	return nil
}
