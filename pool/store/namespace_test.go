package store

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvpool/kvpool/api"
)

// Namespaces are freed when nothing refers to them: 4,096 put+remove
// pairs in distinct namespaces used to leave the node refusing every new
// one ("node already holds 4096 namespaces") with no block left.
func TestEmptyNamespacesAreFreed(t *testing.T) {
	cfg := Config{CapacityBytes: 4 << 20, MaxBlockBytes: 1 << 20, MaxNamespaces: 8}
	arena, free := testArena(t, cfg.CapacityBytes)
	defer free()
	s := New(cfg, time.Now, arena, nil)
	check := func(what string) {
		t.Helper()
		if err := s.Check(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for i := range 100 {
		ns := fmt.Appendf(nil, "ns-%d", i)
		if _, err := s.PutBytes([]byte("t"), ns, []byte("k"), []byte("value"), 0, false); err != nil {
			t.Fatalf("put %d into a new namespace: %v", i, err)
		}
		if err := s.Remove([]byte("t"), ns, []byte("k")); err != nil {
			t.Fatal(err)
		}
	}
	check("after 100 put+remove pairs")
	if st := s.Stats(); len(st.Namespaces) != 0 || st.Blocks != 0 {
		t.Fatalf("stats after removing everything: %d namespaces, %d blocks", len(st.Namespaces), st.Blocks)
	}

	// An aborted reservation and a failed one leave nothing behind either.
	r, err := s.Reserve([]byte("t"), []byte("aborted"), []byte("k"), 100, true)
	if err != nil {
		t.Fatal(err)
	}
	s.Abort(r)
	if _, err := s.Reserve([]byte("t"), []byte("too-big"), []byte("k"), 8<<20, true); !errors.Is(err, api.ErrInvalidArgument) {
		t.Fatalf("an oversized reservation: %v", err)
	}
	check("after an abort")
	if n := len(s.Stats().Namespaces); n != 0 {
		t.Fatalf("%d namespaces after an aborted reservation", n)
	}

	// A removed block that a reader still pins keeps its namespace until
	// the reader lets go.
	if _, err := s.PutBytes([]byte("t"), []byte("pinned"), []byte("k"), []byte("v"), 0, false); err != nil {
		t.Fatal(err)
	}
	pin, err := s.Acquire([]byte("t"), []byte("pinned"), []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	s.Remove([]byte("t"), []byte("pinned"), []byte("k"))
	for i := range cfg.MaxNamespaces - 1 {
		if _, err := s.PutBytes([]byte("t"), fmt.Appendf(nil, "full-%d", i), []byte("k"), []byte("v"), 0, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PutBytes([]byte("t"), []byte("one-too-many"), []byte("k"), []byte("v"), 0, false); !errors.Is(err, api.ErrResourceExhausted) {
		t.Fatalf("a ninth namespace while eight are in use: %v, want ResourceExhausted", err)
	}
	check("at the limit with a pinned dead block")
	s.Release(pin)
	if _, err := s.PutBytes([]byte("t"), []byte("one-too-many"), []byte("k"), []byte("v"), 0, false); err != nil {
		t.Fatalf("after the pin's release the slot must serve a new namespace: %v", err)
	}
	check("after reuse")
}
