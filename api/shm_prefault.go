package api

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// prefaultStepBytes is how much of the segment one step of prefaultMapping
// maps: small enough that Close, which waits for the step in flight,
// waits milliseconds.
const prefaultStepBytes = 64 << 20

// prefaultMapping maps this process's view of the pages the node has
// allocated in its segment, in the background, so no Put or Get pays for
// them one fault at a time. A fresh mapping of a segment starts with no
// page tables: the first write to each 4 KiB page of it faults, and the
// first copy into a 2 MiB block measured 750 µs against 90 once mapped
// (page tables for the whole segment cost 2 MiB per GiB, which a client
// that touches every block pays anyway). Only pages the node's memory
// already holds (mincore) are mapped, so a node that allocates its arena
// lazily keeps doing so. It runs until done, until stop is closed, or
// until the kernel lacks MADV_POPULATE_WRITE (Linux 5.14), and closes
// done.
func (s *shmPath) prefaultMapping(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	page := uint64(unix.Getpagesize())
	resident := make([]byte, prefaultStepBytes/page)
	for off := uint64(0); off < uint64(len(s.mem)); off += prefaultStepBytes {
		select {
		case <-stop:
			return
		default:
		}
		ok := true
		s.mapped(func() error {
			ok = populateResident(s.mem[off:min(off+prefaultStepBytes, uint64(len(s.mem)))], resident, page)
			return nil
		})
		if !ok {
			return
		}
	}
}

// populateResident maps for writing the runs of pages of mem (page
// aligned) that are resident, using vec for mincore's answer. It reports
// false when the kernel cannot do it.
func populateResident(mem, vec []byte, page uint64) bool {
	vec = vec[:(uint64(len(mem))+page-1)/page]
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return false
	}
	for i := 0; i < len(vec); {
		if vec[i]&1 == 0 {
			i++
			continue
		}
		j := i
		for j < len(vec) && vec[j]&1 != 0 {
			j++
		}
		run := mem[uint64(i)*page : min(uint64(j)*page, uint64(len(mem)))]
		if err := unix.Madvise(run, unix.MADV_POPULATE_WRITE); err != nil {
			return false
		}
		i = j
	}
	return true
}
