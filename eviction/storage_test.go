package eviction

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// TestNodeLayout pins the per-ID cost of each policy and checks that nodes
// hold no pointers, so that tables cost the garbage collector nothing to
// scan.
func TestNodeLayout(t *testing.T) {
	for _, c := range []struct {
		typ  reflect.Type
		size uintptr
	}{
		{reflect.TypeFor[lruNode](), 12},
		{reflect.TypeFor[lfuNode](), 24},
		{reflect.TypeFor[ttlNode](), 20},
		{reflect.TypeFor[prefixNode](), 28},
		{reflect.TypeFor[uint32](), 4}, // a heap slot
	} {
		if c.typ.Size() != c.size {
			t.Errorf("%v: %d bytes, want %d", c.typ, c.typ.Size(), c.size)
		}
		if hasPointers(c.typ) {
			t.Errorf("%v holds pointers", c.typ)
		}
	}
}

func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
		return false
	case reflect.Array:
		return hasPointers(t.Elem())
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return false
	}
	return true
}

// TestTable checks growth and lookups across pages.
func TestTable(t *testing.T) {
	var tb table[uint32]
	for _, i := range []uint32{0, 1, 15, 16, 17, pageLen - 1, pageLen, 3*pageLen + 5, 1<<32 - 1} {
		if tb.get(i) != nil && *tb.get(i) != 0 {
			t.Fatalf("get(%d) = %d before grow", i, *tb.get(i))
		}
		*tb.grow(i) = i + 1
	}
	for _, i := range []uint32{0, 1, 15, 16, 17, pageLen - 1, pageLen, 3*pageLen + 5, 1<<32 - 1} {
		if got := *tb.at(i); got != i+1 {
			t.Fatalf("at(%d) = %d, want %d", i, got, i+1)
		}
	}
	if p := tb.get(2*pageLen + 1); p != nil {
		t.Fatalf("get of a page never grown = %d", *p)
	}
	for i, pg := range tb.pages {
		if len(pg) > pageLen || cap(pg) > pageLen {
			t.Fatalf("page %d: len %d cap %d", i, len(pg), cap(pg))
		}
	}
}

// setClockLimit lowers p's logical clock limit, so that it renumbers often.
func setClockLimit(p Policy, limit uint32) bool {
	switch p := p.(type) {
	case *lfu:
		p.clock.limit = limit
	case *ttl:
		p.clock.limit = limit
	case *prefix:
		p.clock.limit = limit
	default:
		return false
	}
	return true
}

// TestRenumber checks that renumbering the logical clock when it fills up
// changes nothing: a policy whose clock renumbers every few ticks makes the
// same decisions as one whose clock never does.
func TestRenumber(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			const ids = 48
			a, b := New(k, Config{Counters: 16}), New(k, Config{Counters: 16})
			if !setClockLimit(b, ids+5) {
				t.Skip("no logical clock")
			}
			ra, rb := rand.New(rand.NewPCG(9, uint64(k))), rand.New(rand.NewPCG(9, uint64(k)))
			for step := range 20000 {
				oa, ob := randomOp(a, ra, ids, step), randomOp(b, rb, ids, step)
				if oa != ob {
					t.Fatalf("step %d: %q without renumbering, %q with", step, oa, ob)
				}
				if step%101 == 0 {
					if err := checkInvariants(b); err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
				}
			}
			if oa, ob := order(a), order(b); !slices.Equal(oa, ob) {
				t.Fatalf("drained %v without renumbering, %v with", oa, ob)
			}
		})
	}
	t.Run("Overflow", func(t *testing.T) {
		p := New(PrefixLRU, Config{})
		setClockLimit(p, 4)
		for id := ID(1); id <= 4; id++ {
			p.Add(Block{ID: id}, t0)
		}
		defer func() {
			if recover() == nil {
				t.Fatal("4 blocks on a clock of 4 ticks did not panic")
			}
		}()
		p.Touch(1, t0)
	})
}

// randomOp applies one random operation to p and describes its outcome.
func randomOp(p Policy, rng *rand.Rand, ids, step int) string {
	now := t0.Add(time.Duration(step) * time.Millisecond)
	id := ID(rng.IntN(ids) + 1)
	out := ""
	switch op := rng.IntN(12); {
	case op < 4:
		b := Block{ID: id, Bytes: int64(rng.IntN(1000)), Hash: uint64(rng.IntN(2 * ids))}
		if rng.IntN(4) > 0 {
			b.Parent = ID(rng.IntN(ids + 4))
		}
		if rng.IntN(2) == 0 {
			b.Expires = now.Add(time.Duration(rng.IntN(10000)-2000) * time.Millisecond)
		}
		p.Add(b, now)
	case op < 7:
		p.Touch(id, now)
	case op < 8:
		p.Miss(uint64(rng.IntN(2 * ids)))
	case op < 9:
		p.Remove(id)
	case op < 10:
		out = fmt.Sprint(p.Admit(Block{ID: id, Hash: uint64(rng.IntN(2 * ids))}, ID(rng.IntN(ids)+1)))
	default:
		pins := make(map[ID]bool)
		for range rng.IntN(ids) {
			pins[ID(rng.IntN(ids)+1)] = true
		}
		v, ok := p.Victim(now, func(id ID) bool { return pins[id] })
		if ok && op == 10 {
			p.Remove(v)
		}
		out = fmt.Sprint(v, ok)
	}
	return fmt.Sprintf("%s len=%d bytes=%d", out, p.Len(), p.Bytes())
}
