// Package disk is a node's disk tier: KV blocks copied from the arena to
// files on a local disk, so that they outlive their eviction from host
// memory and the daemon's restarts, and are promoted back into the arena
// when they are read again.
//
// Every block is one file, <dir>/blocks/<xx>/<name>.kvb, named by a hash
// of its tenant, namespace and key. A file is a 4 KiB header that says
// what the file holds (magic, version, the block's name, size, CRC-32C
// and TTL, and the header's own CRC), then the block's bytes padded to
// 4 KiB, so that it is written and read with direct I/O in one aligned
// call. The directory is self-describing: Open rebuilds the index from
// the headers, and nothing else is kept.
//
// What is on disk is only a cache. A file whose header does not decode,
// whose length is short or whose bytes fail their CRC is deleted and
// counted, and the read that found it is a miss: a disk that fails never
// fails the memory tier in front of it.
//
// Admission (which blocks are copied) is the store's: it offers a block
// once its tenant's DiskAdmitReads is met (eviction.TenantConfig), and the
// tier writes it behind, from its own goroutines. The copy is made while
// the block is still in memory, so that eviction, which runs in a put's
// path under the store's lock, never waits for a disk.
package disk
