// Package eviction holds pure per-tenant eviction policies: they order a
// tenant's blocks for eviction, and the pool does the evicting.
//
// A Policy only orders blocks. It holds no bytes and knows no capacity. The
// caller keeps its own store, reports stores (Add), reads (Touch on a hit,
// Miss on a miss) and deletions (Remove), and when it needs room asks for a
// Victim, skipping the blocks it has pinned. It then checks Admit, evicts the victim, and calls
// Remove. The package is pure: no goroutines, locks, I/O or clocks. Time is
// passed in, and the order comes from a logical clock (one tick per Add and
// Touch), so the same calls always give the same victims. A Policy is not
// safe for concurrent use: the pool serializes calls per tenant, like
// raft's RawNode.
//
// # Policies
//
// Each is chosen by Kind (ParseKind parses "lru", "lfu", "fifo", "ttl",
// "prefix-lru") and built by New:
//
//   - LRU: the least recently added or touched block goes first.
//   - FIFO: the first added block goes first; touches don't matter.
//   - LFU: the block with the lowest estimated access frequency goes first,
//     ties by LRU. TinyLFU admission: Admit refuses a candidate whose
//     estimate does not exceed the victim's. Frequencies belong to keys, by
//     Block.Hash (derived from the ID when 0), not to IDs, which the pool
//     reuses. Every access is recorded, by Touch on a hit and Miss on a miss
//     (Add records none, as in ristretto), first in a doorkeeper Bloom filter
//     and then in a count-min sketch of 4-bit counters (four rows of about
//     Config.Counters each). After 10×Counters recorded accesses the sketch
//     halves every counter and the doorkeeper is cleared, so old popularity
//     fades.
//   - TTL: blocks by Block.Expires, earliest first, so expired blocks go
//     first; blocks that never expire (zero Expires) go last, in LRU order.
//     Ties go by LRU. Sweeping expired blocks is the pool's job.
//   - PrefixLRU: prefix-aware LRU for chains of KV blocks, where a block
//     is useful only while its whole prefix is cached. Orphans go first:
//     blocks whose Parent is set but not present, which can never be part of
//     a prefix hit again. Then come leaves, blocks no present block names as
//     Parent, so a chain shrinks from its deepest block. Each class goes in
//     LRU order. If every orphan and leaf is pinned, interior blocks go in
//     LRU order, rather than no victim at all.
//
// Victim is O(1), or O(pinned) amortised for list-ordered policies (LRU,
// FIFO, LFU's buckets). Heap-ordered policies (TTL, PrefixLRU) pay
// O(p log p) to skip p pinned blocks. Add, Touch and Remove are O(1) or
// O(log n). Pinned blocks are skipped but stay in the policy.
//
// # Memory
//
// Policies hold one entry per block of the pool, so they are built for
// memory. IDs are table indexes (1 ≤ ID ≤ MaxID, dense: the pool uses its
// block index plus one): every policy keeps its per-block state in tables
// indexed by ID, in pages of 4096 pointer-free nodes, and links blocks by
// 32-bit IDs, with no maps and no pointers for the garbage collector to
// scan. Memory is proportional to the largest ID seen and never shrinks.
// Sizes are kept in 32 bits (Block.Bytes ≤ MaxBytes), and the logical clock
// too: when it fills up, a policy renumbers its blocks' times in order, which
// changes no decision. Per ID, in bytes:
//
//	LRU, FIFO   12  links, size
//	LFU         24  links, size, time, key hash; plus the sketch and
//	                doorkeeper, up to about 4 bytes per Config.Counters
//	TTL         24  links or heap position and time, size, expiry; heap slot
//	PrefixLRU   32  parent, sibling links, first child, heap position,
//	                class and time, size; heap slot
//
// BenchmarkPolicyMemory measures them with 1M blocks:
//
//	go test -run x -bench PolicyMemory -benchtime 1x ./eviction
//
// # Ristretto
//
// LFU takes its doorkeeper from github.com/dgraph-io/ristretto/v2/z: the
// Bloom filter z.Bloom (NewBloomFilter, Has, AddIfNotHas, Clear). That is
// all of ristretto used here:
//
//   - ristretto.Cache does not fit. It runs goroutines, evicts by sampling
//     (so not deterministically), and has no notion of pinned blocks.
//   - Its count-min sketch is unexported, so this package has its own
//     (sketch.go), the same design.
//   - z.MemHash is not used: its seed changes with every process, which
//     would make LFU's victims, the datadriven tests and the replay table
//     vary from run to run. Keys are hashed by the caller (Block.Hash); for
//     a block without one, a fixed 64-bit mixer (splitmix64's finalizer)
//     hashes its ID deterministically instead.
//
// # Replay
//
// Replay simulates a cache of N equal-sized blocks under a policy over a
// trace of requests, each a prefix chain of block IDs. Belady runs the
// offline optimum (evict the block used farthest in the future, or bypass)
// over the same trace. Both report prefix hits (the leading blocks of a
// request found before its first miss: what an engine can reuse) and block
// hits. Belady is optimal for block hits, and a strong reference, not a
// proven optimum, for prefix hits. docs/eviction.md has the table for the
// Mooncake conversation trace in testdata, produced by
//
//	go test ./eviction -run TestReplayTable -v
//
// # Tenants
//
// TenantConfig is how one tenant's blocks are kept on a node: its policy,
// its quota (a cap on what it stores, and also what node-wide pressure
// never takes it below), high and low watermarks as fractions of the
// quota, and a default TTL. It encodes to and from the JSON stored in etcd,
// and validation reports every problem at once. PickTenant is the rule for
// node-wide pressure: a tenant over its quota first (the furthest over),
// then the largest tenant without a quota, never one within its quota.
package eviction
