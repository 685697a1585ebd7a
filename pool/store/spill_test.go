package store

import (
	"bytes"
	"testing"
	"time"

	"github.com/kvpool/kvpool/eviction"
)

// recordingSpiller is an in-process disk: it copies what it accepts, and
// holds pins until the test writes them (release), as pool/disk does.
type recordingSpiller struct {
	s       *Store
	accept  bool
	offers  []string
	copies  map[string][]byte
	pending []Pin
}

func (r *recordingSpiller) Offer(tenant, namespace string, key []byte, pin Pin, expires int64) bool {
	name := tenant + "/" + namespace + "/" + string(key)
	r.offers = append(r.offers, name)
	if !r.accept {
		return false
	}
	r.copies[name] = bytes.Clone(pin.Mem)
	r.pending = append(r.pending, pin)
	return true
}

func (r *recordingSpiller) release() {
	for _, p := range r.pending {
		r.s.Release(p)
	}
	r.pending = nil
}

// A block is offered to the disk once its reads reach its tenant's
// DiskAdmitReads, once; a declined offer comes again after as many more
// reads; a tenant with NoDisk is never offered; and the pin an accepted
// offer holds keeps the bytes until the spiller releases it, even after
// the block is removed.
func TestSpillAdmission(t *testing.T) {
	mem, free := testArena(t, 1<<20)
	defer free()
	now := time.Unix(1000, 0)
	s := New(Config{CapacityBytes: 1 << 20, PageBytes: 4096, MaxBlockBytes: 1 << 20, ReservationTimeout: time.Minute}.WithDefaults(),
		func() time.Time { return now }, mem, nil)
	sp := &recordingSpiller{s: s, copies: map[string][]byte{}}
	s.SetSpiller(sp)
	s.SetTenant("three", &eviction.TenantConfig{DiskAdmitReads: 3})
	s.SetTenant("none", &eviction.TenantConfig{NoDisk: true})
	put := func(tenant, key string, v []byte) {
		t.Helper()
		if _, err := s.PutBytes([]byte(tenant), []byte("ns"), []byte(key), v, 0, false); err != nil {
			t.Fatal(err)
		}
	}
	read := func(tenant, key string, times int) {
		t.Helper()
		for range times {
			p, err := s.Acquire([]byte(tenant), []byte("ns"), []byte(key))
			if err != nil {
				t.Fatal(err)
			}
			s.Release(p)
		}
	}
	v := bytes.Repeat([]byte("kv"), 5000)
	put("t", "a", v)
	put("three", "b", v)
	put("none", "c", v)

	// Declined at the default's second read, again at the fourth.
	read("t", "a", 3)
	if got := len(sp.offers); got != 1 {
		t.Fatalf("offers after 3 reads: %v, want 1", sp.offers)
	}
	read("t", "a", 1)
	if got := len(sp.offers); got != 2 {
		t.Fatalf("offers after 4 reads: %v, want 2", sp.offers)
	}
	// Accepted: never offered again.
	sp.accept = true
	read("t", "a", 2)
	read("t", "a", 10)
	read("three", "b", 2)
	if got := len(sp.offers); got != 3 {
		t.Fatalf("offers: %v, want 3", sp.offers)
	}
	read("three", "b", 1)
	read("none", "c", 20)
	if want := []string{"t/ns/a", "t/ns/a", "t/ns/a", "three/ns/b"}; len(sp.offers) != 4 || sp.offers[3] != want[3] {
		t.Fatalf("offers: %v, want %v", sp.offers, want)
	}
	if !bytes.Equal(sp.copies["t/ns/a"], v) || !bytes.Equal(sp.copies["three/ns/b"], v) {
		t.Fatal("the spiller saw other bytes")
	}
	// The pins outlive a removal; the pages come back on release.
	if err := s.Remove([]byte("t"), []byte("ns"), []byte("a")); err != nil {
		t.Fatal(err)
	}
	held := s.Stats().UsedBytes
	sp.release()
	if after := s.Stats().UsedBytes; after >= held {
		t.Fatalf("used %d bytes after the spiller released, %d before", after, held)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}
