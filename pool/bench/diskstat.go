package bench

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// deviceReads counts the read requests the block device under a
// directory completed, from /sys/dev/block/MAJ:MIN/stat (the kernel's
// iostat counters, partitions included). A direct read of 2 MiB is one
// request when its destination is physically contiguous enough and more
// when it is not, and the destination memory alone changes a virtual
// disk's rate, so the benchmark reports kibibytes per request beside
// each rate.
type deviceReads struct {
	stat string // "" when the directory is not on a block device
}

func deviceReadsOf(dir string) deviceReads {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || unix.Major(st.Dev) == 0 {
		return deviceReads{} // tmpfs, overlay and friends: no device
	}
	p := fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(st.Dev), unix.Minor(st.Dev))
	if _, err := os.Stat(p); err != nil {
		return deviceReads{}
	}
	return deviceReads{stat: p}
}

// ioCount is read requests and the bytes they moved.
type ioCount struct {
	requests, bytes uint64
}

// now is the device's totals so far (zero without a device).
func (d deviceReads) now() ioCount {
	if d.stat == "" {
		return ioCount{}
	}
	b, err := os.ReadFile(d.stat)
	if err != nil {
		return ioCount{}
	}
	// Fields: reads completed, reads merged, sectors read (512 bytes), ...
	var reads, merged, sectors uint64
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &reads, &merged, &sectors); err != nil {
		return ioCount{}
	}
	return ioCount{requests: reads, bytes: sectors * 512}
}

// during adds to c the device reads body makes.
func (d deviceReads) during(c *ioCount, body func() error) error {
	before := d.now()
	err := body()
	after := d.now()
	c.requests += after.requests - before.requests
	c.bytes += after.bytes - before.bytes
	return err
}

// kibPerRequest is 0 when no request was seen.
func (c ioCount) kibPerRequest() float64 {
	if c.requests == 0 {
		return 0
	}
	return float64(c.bytes) / 1024 / float64(c.requests)
}
