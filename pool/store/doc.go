// Package store is a node's block store: the arena of one shared-memory
// segment, the TLSF page allocator over it, the index from (tenant,
// namespace, key) to block, two-phase puts (reserve, write in place,
// commit), pins that keep a block's bytes while it is read, read leases,
// TTLs, and every tenant's books and eviction policy (package eviction).
//
// A Store is a state machine behind one mutex, never held while block
// bytes are copied or checksummed; it starts no goroutines and does no
// I/O. The node (package pool) maps the segment, serves the doors and
// tells the store the time: Sweep and ReclaimExpired take it as an
// argument, so tests drive expiry with exact instants. The datadriven
// tests in testdata pin placement, merging, commits, pins and expiry.
package store
