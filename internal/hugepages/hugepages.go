// Package hugepages reads how many huge pages the system has free, for
// the tests and benchmarks that use them where they can.
package hugepages

import (
	"fmt"
	"os"
	"strings"
)

// Free returns the number of free huge pages of the default size and
// that size in bytes, from /proc/meminfo (HugePages_Free, Hugepagesize):
// zeros where it says nothing.
func Free() (pages, pageBytes int64) {
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	for line := range strings.Lines(string(meminfo)) {
		if n, ok := strings.CutPrefix(line, "HugePages_Free:"); ok {
			fmt.Sscan(n, &pages)
		}
		if n, ok := strings.CutPrefix(line, "Hugepagesize:"); ok {
			fmt.Sscan(n, &pageBytes)
			pageBytes <<= 10 // kB
		}
	}
	return pages, pageBytes
}

// FreeBytes is Free's pages times their size.
func FreeBytes() int64 {
	pages, size := Free()
	return pages * size
}
