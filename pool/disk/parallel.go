package disk

import (
	"sync"

	"github.com/kvpool/kvpool/api"
)

// A promote reads its block in parts at once: a drive (NVMe, virtio)
// serves several reads in flight faster than one, and the CRC of each
// part is taken while the later parts are still being read, so the
// check costs almost nothing on top of the I/O.
const (
	readParts        = 4
	parallelMinBytes = 1 << 20 // smaller blocks: one read
)

// readChecked reads the header into hdr and the block into dst, and
// returns the CRC-32C of dst. Where dst is not aligned for direct I/O
// it falls back to readData (through a bounce buffer) and one CRC pass.
func (t *Tier) readChecked(fd int, hdr, dst []byte) (uint32, error) {
	if len(dst) < parallelMinBytes || (t.direct && !aligned(dst)) {
		if err := t.readData(fd, hdr, dst); err != nil {
			return 0, err
		}
		return api.Checksum(dst), nil
	}
	body := dst[:len(dst)&^(align-1)]
	rest := dst[len(body):]
	tail := pageBuffers.Get().(*[]byte)
	defer pageBuffers.Put(tail)
	step := int(roundUp(int64(len(body)+readParts-1) / readParts))
	type part struct {
		off  int // into body
		iovs [][]byte
		done chan error
	}
	var parts []*part
	for off := 0; off < len(body); off += step {
		p := &part{off: off, done: make(chan error, 1)}
		p.iovs = [][]byte{body[off:min(off+step, len(body))]}
		parts = append(parts, p)
	}
	parts[0].iovs = append([][]byte{hdr}, parts[0].iovs...)
	if len(rest) > 0 {
		last := parts[len(parts)-1]
		last.iovs = append(last.iovs, *tail)
	}
	var wg sync.WaitGroup
	for _, p := range parts[1:] {
		wg.Go(func() { p.done <- readFull(fd, p.iovs, int64(headerBytes+p.off)) })
	}
	defer wg.Wait() // never return while a read still writes into dst
	parts[0].done <- readFull(fd, parts[0].iovs, 0)
	var crc uint32
	var first error
	for _, p := range parts {
		if err := <-p.done; err != nil {
			if first == nil || err == errShort {
				first = err
			}
			continue
		}
		if first == nil {
			crc = api.UpdateChecksum(crc, body[p.off:min(p.off+step, len(body))])
		}
	}
	if first != nil {
		return 0, first
	}
	copy(rest, *tail)
	return api.UpdateChecksum(crc, rest), nil
}
