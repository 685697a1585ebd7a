// Package eviction holds the pure eviction policies (LRU, LFU with TinyLFU
// admission, FIFO, TTL, prefix-aware LRU) and per-tenant quotas and
// watermarks: no goroutines, no locks, no I/O. It imports api and
// ristretto's policy pieces only.
//
// It is a later milestone; until then the package holds no code.
package eviction
