// Package seqlock is the reader's half of a seqlock over memory that
// another process writes: a client copying a cached block out of a node's
// shared segment, checking the block's version word before and after.
//
// The copy is made of plain loads and the version checks are atomic
// loads. Neither the Go memory model nor a weakly ordered CPU keeps a plain
// load from completing after a later atomic load: on arm64 the bytes of the
// copy could be read after the second check, from a block the node has
// since replaced, and the torn copy would pass. Read therefore issues a
// load fence between the copy and the second check (DMB ISHLD on arm64;
// on amd64 loads are not reordered with loads, and the fence is a call the
// compiler cannot move loads across). Where this package has no fence,
// Fenced is false and callers must verify what they copied (its checksum)
// before trusting it.
package seqlock

import "sync/atomic"

// Read runs read, which copies from the guarded memory, if *word holds
// want before it, and reports whether *word still held want after it:
// only then is what read copied one consistent version. read MUST NOT
// retain the memory it reads.
func Read(word *uint64, want uint64, read func()) bool {
	if atomic.LoadUint64(word) != want {
		return false
	}
	read()
	loadFence()
	return atomic.LoadUint64(word) == want
}
