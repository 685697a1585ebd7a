package store

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
)

// testArena maps size bytes outside the Go heap, as the node's segment is
// (the heap benchmarks must not count the arena); free unmaps them.
func testArena(tb testing.TB, size int64) (mem []byte, free func()) {
	tb.Helper()
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		tb.Fatal(err)
	}
	return mem, func() { unix.Munmap(mem) }
}

// TestStoreDataDriven pins the store's state machine: where reservations
// land, what commit does with equal and different bytes, pins that outlive
// removal, and reclamation of expired reservations, and what a drain refuses. Run with -rewrite to
// regenerate the expected output after an intended change.
func TestStoreDataDriven(t *testing.T) {
	for _, path := range []string{"testdata/store", "testdata/drain"} {
		t.Run(path, func(t *testing.T) { runStoreDataDriven(t, path) })
	}
}

// runStoreDataDriven runs one file of store commands.
func runStoreDataDriven(t *testing.T, path string) {
	var (
		s    *Store
		now  time.Time
		res  map[string]*Reservation
		pins map[string]Pin
		next int
	)
	datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
		arg := func(name string) string {
			var v string
			if d.HasArg(name) {
				d.ScanArgs(t, name, &v)
			}
			return v
		}
		key := func() (tenant, ns, k []byte) {
			parts := strings.SplitN(arg("ns"), "/", 2)
			return []byte(parts[0]), []byte(parts[1]), []byte(arg("key"))
		}
		name := func(prefix string) string { next++; return prefix + strconv.Itoa(next) }
		switch d.Cmd {
		case "new":
			var pages, page int
			d.ScanArgs(t, "pages", &pages)
			d.ScanArgs(t, "page", &page)
			cfg := Config{CapacityBytes: int64(pages * page), PageBytes: int64(page), MaxBlockBytes: int64(pages * page), ReservationTimeout: 30 * time.Second}
			now = time.Unix(1000, 0)
			mem, free := testArena(t, cfg.CapacityBytes)
			t.Cleanup(free)
			s = New(cfg, func() time.Time { return now }, mem, nil)
			res, pins, next = map[string]*Reservation{}, map[string]Pin{}, 0
			return "ok"
		case "reserve":
			tenant, ns, k := key()
			size, _ := strconv.Atoi(arg("size"))
			reserve := func() (*Reservation, error) { return s.Reserve(tenant, ns, k, int64(size), d.HasArg("server")) }
			if d.HasArg("spare") {
				reserve = func() (*Reservation, error) { return s.ReserveSpare(tenant, ns, k, int64(size)) }
			}
			if d.HasArg("promotion") {
				reserve = func() (*Reservation, error) { return s.ReservePromotion(tenant, ns, k, int64(size)) }
			}
			r, err := reserve()
			if err != nil {
				return errString(err)
			}
			n := name("r")
			res[n] = r
			return fmt.Sprintf("%s page=%d pages=%d", n, r.page, s.pagesFor(r.size))
		case "write":
			r := res[arg("r")]
			fill := arg("fill")
			for i := range r.Bytes() {
				r.Bytes()[i] = fill[i%len(fill)]
			}
			return "ok"
		case "commit":
			r := res[arg("r")]
			want, haveWant := uint32(0), d.HasArg("want")
			if haveWant {
				if arg("want") == "right" {
					want = api.Checksum(r.Bytes())
				} else {
					want = api.Checksum(r.Bytes()) ^ 1
				}
			}
			cr, err := s.Commit(r, 0, false, want, haveWant)
			if err != nil {
				return errString(err)
			}
			if cr.Existed {
				return fmt.Sprintf("existed crc=%08x", cr.CRC)
			}
			return fmt.Sprintf("committed crc=%08x", cr.CRC)
		case "abort":
			s.Abort(res[arg("r")])
			return "ok"
		case "acquire":
			tenant, ns, k := key()
			p, err := s.Acquire(tenant, ns, k)
			if err != nil {
				return errString(err)
			}
			n := name("p")
			pins[n] = p
			return fmt.Sprintf("%s offset=%d size=%d crc=%08x first=%q", n, p.Offset, len(p.Mem), p.CRC, p.Mem[:1])
		case "release":
			s.Release(pins[arg("p")])
			return "ok"
		case "remove":
			tenant, ns, k := key()
			if err := s.Remove(tenant, ns, k); err != nil {
				return errString(err)
			}
			return "ok"
		case "locate":
			tenant, ns, _ := key()
			var chain [][]byte
			for _, k := range strings.Split(arg("keys"), ",") {
				chain = append(chain, []byte(k))
			}
			n, err := s.Locate(tenant, ns, chain)
			if err != nil {
				return errString(err)
			}
			return strconv.Itoa(n)
		case "drain":
			s.SetDraining(arg("on") == "true")
			return fmt.Sprintf("draining=%v", s.Draining())
		case "lease":
			tenant, ns, _ := key()
			var keys [][]byte
			for _, k := range strings.Split(arg("keys"), ",") {
				keys = append(keys, []byte(k))
			}
			dur, err := time.ParseDuration(arg("for"))
			if err != nil {
				t.Fatal(err)
			}
			n, until, err := s.Lease(tenant, ns, keys, dur)
			if err != nil {
				return errString(err)
			}
			return fmt.Sprintf("leased %d until +%v", n, until.Sub(now))
		case "put":
			tenant, ns, k := key()
			if _, err := s.PutBytes(tenant, ns, k, []byte(arg("value")), 0, false); err != nil {
				return errString(err)
			}
			return "ok"
		case "hottest":
			var b strings.Builder
			for _, h := range s.Hottest(now) {
				fmt.Fprintf(&b, "%s/%s/%s size=%d", h.Tenant, h.Namespace, h.Key, h.Size)
				if !h.LeasedUntil.IsZero() {
					fmt.Fprintf(&b, " leased until +%v", h.LeasedUntil.Sub(now))
				}
				b.WriteString("\n")
			}
			return b.String()
		case "advance":
			dur, err := time.ParseDuration(arg("by"))
			if err != nil {
				t.Fatal(err)
			}
			now = now.Add(dur)
			return "ok"
		case "rekey":
			if err := s.Rekey(res[arg("r")], []byte(arg("key"))); err != nil {
				return errString(err)
			}
			return "ok"
		case "reclaim":
			return fmt.Sprintf("reclaimed %d", s.ReclaimExpired(now))
		case "stats":
			st := s.Stats()
			if err := s.Check(); err != nil {
				return "INCONSISTENT: " + err.Error()
			}
			var b bytes.Buffer
			fmt.Fprintf(&b, "blocks=%d stored=%d used=%d free=%d reservations=%d reserved=%d largest-free=%d free-runs=%d ext-frag=%.3f int-frag=%.3f",
				st.Blocks, st.StoredBytes, st.UsedBytes, st.FreeBytes, st.Reservations, st.ReservedBytes, st.LargestFreeBytes, st.FreeRuns, st.ExternalFragmentation, st.InternalFragmentation)
			for _, ns := range st.Namespaces {
				fmt.Fprintf(&b, "\n%s/%s: blocks=%d stored=%d", ns.Tenant, ns.Namespace, ns.Blocks, ns.StoredBytes)
			}
			return b.String()
		}
		t.Fatalf("unknown command %q", d.Cmd)
		return ""
	})
}

// errString prints an error's class and message, for expected output.
func errString(err error) string {
	return fmt.Sprintf("error %v: %v", api.Code(err), err)
}
