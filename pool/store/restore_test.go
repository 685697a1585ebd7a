package store

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/eviction"
)

// recordingJournal is an in-process journal: it replays what it hears
// into the set of live blocks, as pool/journal's Replay does from a file.
type recordingJournal struct {
	live  map[string]RestoredBlock
	calls int
}

func (j *recordingJournal) Committed(tenant, namespace string, key []byte, offset, size int64, crc uint32, expires int64) {
	j.calls++
	j.live[tenant+"/"+namespace+"/"+string(key)] = RestoredBlock{Tenant: tenant, Namespace: namespace, Key: bytes.Clone(key),
		Offset: offset, Size: size, CRC: crc, ExpiresUnixNano: expires}
}

func (j *recordingJournal) Unlinked(tenant, namespace string, key []byte) {
	j.calls++
	delete(j.live, tenant+"/"+namespace+"/"+string(key))
}

func (j *recordingJournal) blocks() []RestoredBlock {
	var out []RestoredBlock
	for _, b := range j.live {
		out = append(out, b)
	}
	return out
}

// A store over an arena another store filled adopts the blocks its
// journal recorded: same bytes, same checksums, same books, and new puts
// go around them.
func TestRestoreAdoptsAJournalsBlocks(t *testing.T) {
	const page = 4096
	mem, free := testArena(t, 256*page)
	defer free()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	cfg := Config{CapacityBytes: 256 * page, PageBytes: page, DisableEviction: true}
	a := New(cfg, clock, mem, nil)
	j := &recordingJournal{live: map[string]RestoredBlock{}}
	a.SetJournal(j)
	values := map[string][]byte{}
	for i := range 40 {
		tenant := []string{"alpha", "beta"}[i%2]
		key := fmt.Sprintf("k%02d", i)
		v := bytes.Repeat([]byte{byte(i)}, 1000+i*700) // 1 to 8 pages
		if _, err := a.PutBytes([]byte(tenant), []byte("ns"), []byte(key), v, 0, false); err != nil {
			t.Fatal(err)
		}
		values[tenant+"/ns/"+key] = v
	}
	// Removals leave holes and must not come back.
	for i := 0; i < 40; i += 3 {
		tenant := []string{"alpha", "beta"}[i%2]
		key := fmt.Sprintf("k%02d", i)
		if err := a.Remove([]byte(tenant), []byte("ns"), []byte(key)); err != nil {
			t.Fatal(err)
		}
		delete(values, tenant+"/ns/"+key)
	}
	if j.calls != 40+14 {
		t.Fatalf("journal heard %d calls, want 54", j.calls)
	}
	before := sortedStats(a)

	b := New(cfg, clock, mem, nil)
	expired, err := b.Restore(j.blocks())
	if err != nil || expired != 0 {
		t.Fatalf("Restore: %d expired, %v", expired, err)
	}
	if err := b.Check(); err != nil {
		t.Fatal(err)
	}
	after := sortedStats(b)
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("stats after restore\n%+v\nwant\n%+v", after, before)
	}
	for name, v := range values {
		parts := strings.SplitN(name, "/", 3)
		p, err := b.Acquire([]byte(parts[0]), []byte(parts[1]), []byte(parts[2]))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(p.Mem, v) || p.CRC != api.Checksum(v) {
			t.Fatalf("%s: restored bytes or checksum differ", name)
		}
		b.Release(p)
	}
	if _, err := b.Acquire([]byte("alpha"), []byte("ns"), []byte("k00")); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a removed block came back: %v", err)
	}
	// Fill the rest of the arena: no new block may land on a restored one.
	for i := 0; ; i++ {
		if _, err := b.PutBytes([]byte("gamma"), []byte("ns"), fmt.Appendf(nil, "fill%d", i), bytes.Repeat([]byte{0xee}, page), 0, false); err != nil {
			if !errors.Is(err, api.ErrResourceExhausted) {
				t.Fatal(err)
			}
			break
		}
	}
	for name, v := range values {
		parts := strings.SplitN(name, "/", 3)
		p, err := b.Acquire([]byte(parts[0]), []byte(parts[1]), []byte(parts[2]))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p.Mem, v) {
			t.Fatalf("%s overwritten by a put after the restore", name)
		}
		b.Release(p)
	}
	if st := b.Stats(); st.FreeBytes >= page {
		t.Fatalf("%d bytes free after filling the arena", st.FreeBytes)
	}
}

// sortedStats is s's Stats with its namespaces in name order.
func sortedStats(s *Store) Stats {
	st := s.Stats()
	slices.SortFunc(st.Namespaces, func(a, b NamespaceStats) int {
		return strings.Compare(a.Tenant+"\x00"+a.Namespace, b.Tenant+"\x00"+b.Namespace)
	})
	return st
}

// TTLs survive the restore: a block whose TTL ended is skipped, one whose
// has not expires when it would have.
func TestRestoreKeepsTTLs(t *testing.T) {
	const page = 4096
	mem, free := testArena(t, 16*page)
	defer free()
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	cfg := Config{CapacityBytes: 16 * page, PageBytes: page, DefaultTenant: eviction.TenantConfig{DefaultTTL: time.Minute}}
	a := New(cfg, clock, mem, nil)
	j := &recordingJournal{live: map[string]RestoredBlock{}}
	a.SetJournal(j)
	for i, at := range []time.Duration{0, 30 * time.Second} {
		now = time.Unix(1000, 0).Add(at)
		if _, err := a.PutBytes([]byte("t"), []byte("n"), fmt.Appendf(nil, "k%d", i), []byte("value"), 0, false); err != nil {
			t.Fatal(err)
		}
	}
	now = time.Unix(1000, 0).Add(70 * time.Second) // k0 expired at 60 s, k1 expires at 90 s
	b := New(cfg, clock, mem, nil)
	expired, err := b.Restore(j.blocks())
	if err != nil || expired != 1 {
		t.Fatalf("Restore: %d expired, %v; want 1", expired, err)
	}
	if _, err := b.Acquire([]byte("t"), []byte("n"), []byte("k0")); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("expired block restored: %v", err)
	}
	if n := b.Sweep(time.Unix(1000, 0).Add(89 * time.Second)); b.Stats().Blocks != 1 {
		t.Fatalf("before its TTL: %d blocks (swept %d)", b.Stats().Blocks, n)
	}
	b.Sweep(time.Unix(1000, 0).Add(91 * time.Second))
	if b.Stats().Blocks != 0 {
		t.Fatalf("after its TTL: %d blocks", b.Stats().Blocks)
	}
}

func TestRestoreRefusesBadBlocks(t *testing.T) {
	const page = 4096
	ok := RestoredBlock{Tenant: "t", Namespace: "n", Key: []byte("a"), Offset: 0, Size: page}
	with := func(f func(*RestoredBlock)) RestoredBlock {
		b := ok
		b.Key = []byte("other")
		b.Offset = 8 * page
		f(&b)
		return b
	}
	for _, tc := range []struct {
		name   string
		blocks []RestoredBlock
		want   string
	}{
		{"misaligned", []RestoredBlock{ok, with(func(b *RestoredBlock) { b.Offset = 8*page + 512 })}, "page-aligned"},
		{"past the arena", []RestoredBlock{ok, with(func(b *RestoredBlock) { b.Offset = 15 * page; b.Size = 2 * page })}, "page-aligned"},
		{"negative offset", []RestoredBlock{with(func(b *RestoredBlock) { b.Offset = -page })}, "page-aligned"},
		{"overlap", []RestoredBlock{with(func(b *RestoredBlock) { b.Offset = 0; b.Size = 2 * page }), with(func(b *RestoredBlock) { b.Offset = page; b.Key = []byte("b") })}, "overlaps"},
		{"same name twice", []RestoredBlock{ok, with(func(b *RestoredBlock) { b.Key = []byte("a") })}, "same name"},
		{"empty key", []RestoredBlock{with(func(b *RestoredBlock) { b.Key = nil })}, "block 0"},
		{"empty value", []RestoredBlock{with(func(b *RestoredBlock) { b.Size = 0 })}, "block 0"},
		{"too many namespaces", []RestoredBlock{ok, with(func(b *RestoredBlock) { b.Namespace = "m" })}, "at most 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, free := testArena(t, 16*page)
			defer free()
			s := New(Config{CapacityBytes: 16 * page, PageBytes: page, MaxNamespaces: 1}, time.Now, mem, nil)
			_, err := s.Restore(tc.blocks)
			if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Restore: %v; want InvalidArgument saying %q", err, tc.want)
			}
			if st := s.Stats(); st.Blocks != 0 || st.FreeBytes != 16*page {
				t.Fatalf("a refused restore adopted %d blocks, left %d bytes free", st.Blocks, st.FreeBytes)
			}
			if err := s.Check(); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A store in use refuses a restore.
	mem, free := testArena(t, 16*page)
	defer free()
	s := New(Config{CapacityBytes: 16 * page, PageBytes: page}, time.Now, mem, nil)
	if _, err := s.PutBytes([]byte("t"), []byte("n"), []byte("x"), []byte("v"), 0, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Restore([]RestoredBlock{with(func(*RestoredBlock) {})}); !errors.Is(err, api.ErrFailedPrecondition) {
		t.Fatalf("restore into a used store: %v", err)
	}
}
