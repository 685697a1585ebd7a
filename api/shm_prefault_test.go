package api

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mappingRss is the resident size of this process's mapping that starts at
// mem, from /proc/self/smaps: what its page tables map.
func mappingRss(t *testing.T, mem []byte) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	defer f.Close()
	start := fmt.Sprintf("%x-", uintptr(unsafe.Pointer(&mem[0])))
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, "-") && !strings.Contains(line, ":") || strings.HasPrefix(line, start) {
			in = strings.HasPrefix(line, start)
			continue
		}
		if in && strings.HasPrefix(line, "Rss:") {
			kb, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no mapping at %s in smaps", start)
	return 0
}

// populateResident maps the pages a segment holds and leaves its holes
// alone: a node that allocates lazily keeps its memory.
func TestPopulateResidentMapsOnlyAllocatedPages(t *testing.T) {
	const size = 8 << 20
	fd, err := unix.MemfdCreate("prefault-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skipf("memfd: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	// The node's side: the first quarter prefaulted (allocated and
	// mapped, as --prefault does), the third written by puts.
	node, err := unix.Mmap(fd, 0, size/4, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(node)
	if err := unix.Fallocate(fd, 0, 0, size/4); err != nil {
		t.Fatal(err)
	}
	writer, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	for i := size / 2; i < size*3/4; i += 4096 {
		writer[i] = 1
	}
	unix.Munmap(writer)
	// A client's fresh mapping of the segment.
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if rss := mappingRss(t, mem); rss != 0 {
		t.Fatalf("a fresh mapping maps %d bytes", rss)
	}
	page := uint64(unix.Getpagesize())
	if !populateResident(mem, make([]byte, size/page), page) {
		t.Skip("this kernel lacks MADV_POPULATE_WRITE")
	}
	if rss := mappingRss(t, mem); rss != size/2 {
		t.Fatalf("after populating: %d bytes mapped, want the %d allocated", rss, size/2)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 != size/2 {
		t.Fatalf("the segment holds %d bytes after populating, want %d: holes were filled", st.Blocks*512, size/2)
	}
}
