package hugepages

import (
	"os"
	"strings"
	"testing"
)

// Free agrees with /proc/meminfo's lines, where the kernel has them.
func TestFreeReadsMeminfo(t *testing.T) {
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil || !strings.Contains(string(meminfo), "Hugepagesize:") {
		t.Skipf("no huge page lines in /proc/meminfo (%v)", err)
	}
	pages, size := Free()
	if size < 4096 || size&(size-1) != 0 {
		t.Fatalf("huge page size %d bytes: want a power of two of at least 4 KiB", size)
	}
	if pages < 0 || FreeBytes() != pages*size {
		t.Fatalf("%d free pages, FreeBytes %d", pages, FreeBytes())
	}
}
