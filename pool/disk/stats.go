package disk

import (
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Why an offered block was not written (skip*) or a write failed
// (write*), and why a read failed (fail*): the labels of the tier's
// metrics, a fixed set.
const (
	skipTooLarge  = "too_large"  // empty, or over MaxBlockBytes
	skipQueueFull = "queue_full" // MaxPendingBytes or the queue reached
	skipQuota     = "quota"      // the tenant's disk quota cannot make room
	skipFull      = "full"       // nothing left to evict for it
	skipExpired   = "expired"    // its TTL ended while it was written
	skipRemoved   = "removed"    // removed while it was written

	writeNoSpace = "no_space" // ENOSPC or EDQUOT: the file system is full
	writeIO      = "io"       // any other write error

	failMissing   = "missing"   // the file is gone
	failIO        = "io"        // open or read failed
	failTruncated = "truncated" // shorter than its header says
	failHeader    = "header"    // the header does not decode or names another block
	failChecksum  = "checksum"  // the bytes fail their CRC
)

// SkipReasons, WriteFailures and ReadFailures list the labels Stats
// reports, in a fixed order.
var (
	SkipReasons   = []string{skipTooLarge, skipQueueFull, skipQuota, skipFull, skipExpired, skipRemoved}
	WriteFailures = []string{writeNoSpace, writeIO}
	ReadFailures  = []string{failMissing, failIO, failTruncated, failHeader, failChecksum}
)

// writeFailure classifies a failed write.
func writeFailure(err error) string {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return writeNoSpace
	}
	return writeIO
}

// counters are the tier's running totals; every field is atomic.
type counters struct {
	spilled, spilledBytes atomic.Uint64
	read, readBytes       atomic.Uint64
	evicted, expired      atomic.Uint64
	writeNanos, readNanos atomic.Uint64
	skips                 [6]atomic.Uint64 // by SkipReasons
	writeFailures         [2]atomic.Uint64 // by WriteFailures
	readFailures          [5]atomic.Uint64 // by ReadFailures
}

func index(list []string, reason string) int {
	for i, r := range list {
		if r == reason {
			return i
		}
	}
	panic("disk: unknown reason " + reason)
}

func (c *counters) skipped(reason string)     { c.skips[index(SkipReasons, reason)].Add(1) }
func (c *counters) spillFailed(reason string) { c.writeFailures[index(WriteFailures, reason)].Add(1) }
func (c *counters) readFailed(reason string)  { c.readFailures[index(ReadFailures, reason)].Add(1) }

// Stats is a snapshot of the tier: what it holds and its totals since
// Open.
type Stats struct {
	Blocks        int64
	Bytes         int64 // file bytes held
	CapacityBytes int64
	PendingBytes  int64 // offered, not yet written

	Spilled, SpilledBytes uint64 // blocks written
	Read, ReadBytes       uint64 // blocks read (promoted)
	Evicted, Expired      uint64
	WriteSeconds          float64 // in the writers' file writes
	ReadSeconds           float64 // in reads (file I/O and the CRC)
	ReadBytesPerSecond    float64

	Skips         map[string]uint64 // offers not written, by SkipReasons
	WriteFailures map[string]uint64 // by WriteFailures
	ReadFailures  map[string]uint64 // by ReadFailures
}

// Stats reports the tier's state and totals.
func (t *Tier) Stats() Stats {
	t.mu.Lock()
	s := Stats{Blocks: int64(len(t.mu.blocks)), Bytes: t.mu.used}
	for _, tn := range t.mu.tenants {
		s.Bytes -= tn.reserved // used counts the writes in flight
	}
	t.mu.Unlock()
	c := &t.stats
	s.CapacityBytes = t.cfg.CapacityBytes
	s.PendingBytes = t.pending.Load()
	s.Spilled, s.SpilledBytes = c.spilled.Load(), c.spilledBytes.Load()
	s.Read, s.ReadBytes = c.read.Load(), c.readBytes.Load()
	s.Evicted, s.Expired = c.evicted.Load(), c.expired.Load()
	s.WriteSeconds = float64(c.writeNanos.Load()) / 1e9
	s.ReadSeconds = float64(c.readNanos.Load()) / 1e9
	s.ReadBytesPerSecond = t.rate.get()
	s.Skips = make(map[string]uint64, len(SkipReasons))
	for i, r := range SkipReasons {
		s.Skips[r] = c.skips[i].Load()
	}
	s.WriteFailures = make(map[string]uint64, len(WriteFailures))
	for i, r := range WriteFailures {
		s.WriteFailures[r] = c.writeFailures[i].Load()
	}
	s.ReadFailures = make(map[string]uint64, len(ReadFailures))
	for i, r := range ReadFailures {
		s.ReadFailures[r] = c.readFailures[i].Load()
	}
	return s
}
