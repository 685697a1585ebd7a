package eviction

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// TestConformance runs the Policy contract checks against every Kind.
func TestConformance(t *testing.T) {
	cases := []struct {
		name string
		fn   func(t *testing.T, k Kind)
	}{
		{"Kind", testKind},
		{"Accounting", testAccounting},
		{"Empty", testEmpty},
		{"PinnedNeverVictim", testPinnedNeverVictim},
		{"DrainsUnpinned", testDrainsUnpinned},
		{"UnknownIDs", testUnknownIDs},
		{"Admit", testAdmit},
		{"ZeroIDPanics", testZeroIDPanics},
		{"Limits", testLimits},
		{"Miss", testMiss},
		{"Shadow", testShadow},
		{"Rank", testRank},
	}
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.fn(t, k) })
			}
		})
	}
}

func testKind(t *testing.T, k Kind) {
	if got := New(k, Config{}).Kind(); got != k {
		t.Fatalf("Kind() = %v, want %v", got, k)
	}
}

func wantStats(t *testing.T, p Policy, n int, bytes int64) {
	t.Helper()
	if p.Len() != n || p.Bytes() != bytes {
		t.Fatalf("Len, Bytes = %d, %d; want %d, %d", p.Len(), p.Bytes(), n, bytes)
	}
	if err := checkInvariants(p); err != nil {
		t.Fatal(err)
	}
}

func testAccounting(t *testing.T, k Kind) {
	p := New(k, Config{})
	wantStats(t, p, 0, 0)
	p.Add(Block{ID: 1, Bytes: 10}, t0)
	p.Add(Block{ID: 2, Bytes: 20, Parent: 1}, t0)
	p.Add(Block{ID: 3, Bytes: 30, Parent: 2, Expires: t0.Add(time.Minute)}, t0)
	wantStats(t, p, 3, 60)
	p.Add(Block{ID: 2, Bytes: 5, Parent: 1}, t0) // replaces
	wantStats(t, p, 3, 45)
	p.Add(Block{ID: 2, Bytes: 5, Parent: 1}, t0)
	wantStats(t, p, 3, 45)
	p.Remove(1)
	wantStats(t, p, 2, 35)
	p.Remove(1)
	wantStats(t, p, 2, 35)
	p.Remove(3)
	p.Remove(2)
	wantStats(t, p, 0, 0)
}

func testEmpty(t *testing.T, k Kind) {
	p := New(k, Config{})
	if id, ok := p.Victim(t0, nil); ok {
		t.Fatalf("Victim of an empty policy = %d", id)
	}
	p.Add(Block{ID: 1}, t0)
	p.Remove(1)
	if id, ok := p.Victim(t0, nil); ok {
		t.Fatalf("Victim after removing all = %d", id)
	}
}

// fill adds n blocks with a mix of chains, expiries and touches.
func fill(p Policy, rng *rand.Rand, n int) map[ID]int64 {
	held := make(map[ID]int64)
	for i := 1; i <= n; i++ {
		b := Block{ID: ID(i), Bytes: int64(rng.IntN(100))}
		if rng.IntN(2) == 0 {
			b.Hash = rng.Uint64()
		}
		if i > 1 && rng.IntN(3) > 0 {
			b.Parent = ID(rng.IntN(i-1) + 1)
		}
		if rng.IntN(2) == 0 {
			b.Expires = t0.Add(time.Duration(rng.IntN(100)) * time.Second)
		}
		p.Add(b, t0)
		held[b.ID] = b.Bytes
		for range rng.IntN(3) {
			p.Touch(ID(rng.IntN(i)+1), t0)
		}
	}
	return held
}

func testPinnedNeverVictim(t *testing.T, k Kind) {
	rng := rand.New(rand.NewPCG(1, uint64(k)))
	p := New(k, Config{})
	held := fill(p, rng, 40)
	for round := range 200 {
		pins := make(map[ID]bool)
		for range rng.IntN(40) {
			pins[ID(rng.IntN(45)+1)] = true
		}
		id, ok := p.Victim(t0.Add(time.Duration(round)*time.Second), func(id ID) bool { return pins[id] })
		if !ok {
			for h := range held {
				if !pins[h] {
					t.Fatalf("Victim found none, but %d is unpinned", h)
				}
			}
			continue
		}
		if pins[id] {
			t.Fatalf("Victim returned pinned %d", id)
		}
		if _, ok := held[id]; !ok {
			t.Fatalf("Victim returned absent %d", id)
		}
	}
	if err := checkInvariants(p); err != nil {
		t.Fatal(err)
	}
}

func testDrainsUnpinned(t *testing.T, k Kind) {
	rng := rand.New(rand.NewPCG(2, uint64(k)))
	p := New(k, Config{})
	held := fill(p, rng, 60)
	pins := make(map[ID]bool)
	var pinnedBytes int64
	for id, b := range held {
		if rng.IntN(4) == 0 {
			pins[id] = true
			pinnedBytes += b
		}
	}
	for {
		id, ok := p.Victim(t0, func(id ID) bool { return pins[id] })
		if !ok {
			break
		}
		if pins[id] {
			t.Fatalf("Victim returned pinned %d", id)
		}
		if _, ok := held[id]; !ok {
			t.Fatalf("Victim returned absent or evicted %d", id)
		}
		delete(held, id)
		p.Remove(id)
	}
	wantStats(t, p, len(pins), pinnedBytes)
	if len(held) != len(pins) {
		t.Fatalf("%d blocks left, %d pinned", len(held), len(pins))
	}
	// Unpinned, the pinned blocks drain too.
	for {
		id, ok := p.Victim(t0, nil)
		if !ok {
			break
		}
		if !pins[id] {
			t.Fatalf("Victim returned %d, not one of the pinned blocks left", id)
		}
		delete(pins, id)
		p.Remove(id)
	}
	if len(pins) != 0 {
		t.Fatalf("pinned blocks lost: %v", pins)
	}
	wantStats(t, p, 0, 0)
}

// order drains p and returns the eviction order.
func order(p Policy) []ID {
	var out []ID
	for {
		id, ok := p.Victim(t0, nil)
		if !ok {
			return out
		}
		out = append(out, id)
		p.Remove(id)
	}
}

func testUnknownIDs(t *testing.T, k Kind) {
	build := func(noise bool) Policy {
		p := New(k, Config{})
		fill(p, rand.New(rand.NewPCG(3, uint64(k))), 30)
		if noise {
			for id := ID(1000); id < 1010; id++ {
				p.Touch(id, t0)
				p.Remove(id)
			}
			for id := MaxID - 2; id < MaxID+3; id++ {
				p.Touch(id, t0)
				p.Remove(id)
				p.Admit(Block{ID: id}, id)
			}
		}
		return p
	}
	a, b := build(false), build(true)
	if a.Len() != b.Len() || a.Bytes() != b.Bytes() {
		t.Fatalf("unknown ids changed Len, Bytes: %d, %d vs %d, %d", a.Len(), a.Bytes(), b.Len(), b.Bytes())
	}
	if k == LFU {
		// NB: LFU counts unknown touches in its sketch, which may (through
		// collisions) change estimates, so only the accounting must match.
		return
	}
	if oa, ob := order(a), order(b); !slices.Equal(oa, ob) {
		t.Fatalf("unknown ids changed the order:\n%v\n%v", oa, ob)
	}
}

func testAdmit(t *testing.T, k Kind) {
	p := New(k, Config{})
	p.Add(Block{ID: 1}, t0)
	if k == LFU {
		for range 3 {
			p.Touch(1, t0)
		}
		if p.Admit(Block{ID: 2}, 1) {
			t.Fatal("LFU admitted a never seen block over a hot one")
		}
		for range 5 {
			p.Touch(2, t0)
		}
		if !p.Admit(Block{ID: 2}, 1) {
			t.Fatal("LFU refused a hotter block")
		}
		return
	}
	for _, c := range []ID{1, 2} {
		if !p.Admit(Block{ID: c}, 1) {
			t.Fatalf("Admit(%d, 1) = false", c)
		}
	}
}

// testLimits checks the ranges of IDs and sizes: up to MaxID and MaxBytes
// work, beyond them Add panics.
func testLimits(t *testing.T, k Kind) {
	p := New(k, Config{})
	p.Add(Block{ID: MaxID, Bytes: MaxBytes, Parent: MaxID - 1, Expires: t0}, t0)
	p.Add(Block{ID: MaxID - 1, Bytes: MaxBytes, Parent: 1}, t0)
	p.Add(Block{ID: 1, Bytes: 0, Parent: MaxID}, t0)
	wantStats(t, p, 3, 2*MaxBytes)
	if got := order(p); len(got) != 3 {
		t.Fatalf("drained %v", got)
	}
	wantStats(t, p, 0, 0)
	for _, b := range []Block{
		{ID: MaxID + 1},
		{ID: 1<<64 - 1},
		{ID: 1, Parent: MaxID + 1},
		{ID: 1, Bytes: -1},
		{ID: 1, Bytes: MaxBytes + 1},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Add(%+v) did not panic", b)
				}
			}()
			p.Add(b, t0)
		}()
	}
	wantStats(t, p, 0, 0)
}

// testMiss checks that Miss changes nothing but LFU's estimates, and that
// LFU admits a key missed often.
func testMiss(t *testing.T, k Kind) {
	build := func(misses bool) Policy {
		p := New(k, Config{})
		fill(p, rand.New(rand.NewPCG(5, uint64(k))), 30)
		if misses {
			for i := range 60 {
				p.Miss(uint64(i))
				p.Miss(hashID(ID(i%30 + 1)))
			}
		}
		return p
	}
	a, b := build(false), build(true)
	if a.Len() != b.Len() || a.Bytes() != b.Bytes() {
		t.Fatalf("Miss changed Len, Bytes: %d, %d vs %d, %d", a.Len(), a.Bytes(), b.Len(), b.Bytes())
	}
	if err := checkInvariants(b); err != nil {
		t.Fatal(err)
	}
	if k != LFU {
		if oa, ob := order(a), order(b); !slices.Equal(oa, ob) {
			t.Fatalf("Miss changed the order:\n%v\n%v", oa, ob)
		}
		return
	}
	p := New(k, Config{})
	p.Add(Block{ID: 1, Hash: 11}, t0)
	p.Touch(1, t0)
	p.Touch(1, t0)
	if p.Admit(Block{ID: 2, Hash: 22}, 1) {
		t.Fatal("LFU admitted a never seen key over a hot one")
	}
	for range 3 {
		p.Miss(22)
	}
	if !p.Admit(Block{ID: 2, Hash: 22}, 1) {
		t.Fatal("LFU refused a key missed more often than the victim was read")
	}
	// The same key under another ID, or through the ID-derived hash of its
	// old slot, is still the same key.
	if !p.Admit(Block{ID: 3, Hash: 22}, 1) {
		t.Fatal("LFU remembered the ID, not the key")
	}
	if p.Admit(Block{ID: 2}, 1) {
		t.Fatal("LFU gave ID 2's derived hash the frequency of key 22")
	}
}

func testZeroIDPanics(t *testing.T, k Kind) {
	defer func() {
		if recover() == nil {
			t.Fatal("Add with ID 0 did not panic")
		}
	}()
	New(k, Config{}).Add(Block{}, t0)
}

// testShadow drives random operations and compares Len, Bytes and
// membership with a map.
func testShadow(t *testing.T, k Kind) {
	rng := rand.New(rand.NewPCG(4, uint64(k)))
	p := New(k, Config{Counters: 16}) // small, so LFU ages often
	held := make(map[ID]int64)
	var bytes int64
	const ids = 64
	for step := range 20000 {
		now := t0.Add(time.Duration(step) * time.Millisecond)
		id := ID(rng.IntN(ids) + 1)
		switch op := rng.IntN(10); {
		case op < 4:
			b := Block{ID: id, Bytes: int64(rng.IntN(1000)), Hash: uint64(rng.IntN(ids))}
			if rng.IntN(4) > 0 {
				b.Parent = ID(rng.IntN(ids + 4)) // some parents never stored
			}
			if rng.IntN(2) == 0 {
				b.Expires = now.Add(time.Duration(rng.IntN(10000)-2000) * time.Millisecond)
			}
			p.Add(b, now)
			bytes += b.Bytes - held[id]
			held[id] = b.Bytes
		case op < 5:
			p.Touch(id, now)
		case op < 6:
			p.Miss(uint64(rng.IntN(ids)))
		case op < 7:
			p.Remove(id)
			bytes -= held[id]
			delete(held, id)
		default:
			pins := make(map[ID]bool)
			for range rng.IntN(ids) {
				pins[ID(rng.IntN(ids)+1)] = true
			}
			v, ok := p.Victim(now, func(id ID) bool { return pins[id] })
			if !ok {
				for h := range held {
					if !pins[h] {
						t.Fatalf("step %d: Victim found none, but %d is unpinned", step, h)
					}
				}
				break
			}
			if _, in := held[v]; !in || pins[v] {
				t.Fatalf("step %d: Victim = %d (held %t, pinned %t)", step, v, in, pins[v])
			}
			p.Remove(v)
			bytes -= held[v]
			delete(held, v)
		}
		if p.Len() != len(held) || p.Bytes() != bytes {
			t.Fatalf("step %d: Len, Bytes = %d, %d; want %d, %d", step, p.Len(), p.Bytes(), len(held), bytes)
		}
		if step%97 == 0 {
			if err := checkInvariants(p); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
	if err := checkInvariants(p); err != nil {
		t.Fatal(err)
	}
	for _, id := range order(p) {
		if _, ok := held[id]; !ok {
			t.Fatalf("drained %d, which is not held", id)
		}
		delete(held, id)
	}
	if len(held) != 0 {
		t.Fatalf("not drained: %v", held)
	}
}

func TestKindNames(t *testing.T) {
	for _, k := range kinds {
		got, err := ParseKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %v, %v", k.String(), got, err)
		}
	}
	_, err := ParseKind("arc")
	if err == nil {
		t.Fatal("ParseKind(arc) succeeded")
	}
	for _, k := range kinds {
		if !strings.Contains(err.Error(), k.String()) {
			t.Errorf("error %q does not list %q", err, k)
		}
	}
	if s := Kind(0).String(); s != "Kind(0)" {
		t.Errorf("Kind(0).String() = %q", s)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("New(0) did not panic")
		}
	}()
	New(0, Config{})
}

// TestLFUStaleBucket checks that Victim sees estimates raised through sketch
// collisions after a block was bucketed.
func TestLFUStaleBucket(t *testing.T) {
	p := New(LFU, Config{Counters: 16}).(*lfu)
	// Find a and b colliding in every sketch row.
	var a, b ID
	for i := ID(1); a == 0 && i < 10000; i++ {
		for j := i + 1; j < 10000; j++ {
			hi, hj := hashID(i), hashID(j)
			same := true
			for r := range sketchDepth {
				if p.sketch.index(hi, r) != p.sketch.index(hj, r) {
					same = false
					break
				}
			}
			if same {
				a, b = i, j
				break
			}
		}
	}
	if a == 0 {
		t.Fatal("no colliding ids")
	}
	c := a + b // any other id
	p.Add(Block{ID: a}, t0)
	p.Add(Block{ID: c}, t0)
	p.Touch(c, t0)
	p.Touch(c, t0) // c: 2
	for range 6 {
		p.Touch(b, t0) // a's estimate rises to 5 with b's
	}
	if f := lfuBucket(p, a); f != 0 {
		t.Fatalf("a's bucket = %d, want a stale 0", f)
	}
	if v, _ := p.Victim(t0, nil); v != c {
		t.Fatalf("Victim = %d, want %d (estimates %d, %d)", v, c, p.estimate(hashID(a)), p.estimate(hashID(c)))
	}
	if err := checkInvariants(p); err != nil {
		t.Fatal(err)
	}
}

// lfuBucket returns the bucket holding id, or -1.
func lfuBucket(p *lfu, id ID) int {
	for f := range p.buckets {
		for x := p.buckets[f].head; x != 0; x = p.nodes.at(x).next {
			if ID(x) == id {
				return f
			}
		}
	}
	return -1
}

// testRank checks that Rank lists every block once, coldest first: what
// Victim takes first, and, for the policies whose order a removal leaves
// alone, the whole order in which Victim drains them.
func testRank(t *testing.T, k Kind) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, uint64(k)))
		p := New(k, Config{})
		held := fill(p, rng, 1+rng.IntN(60))
		if seed%2 == 0 {
			for id := range held {
				if rng.IntN(4) == 0 {
					p.Remove(id)
					delete(held, id)
				}
			}
		}
		prefix := []ID{7, 7}
		rank := p.Rank(slices.Clone(prefix))
		if !slices.Equal(rank[:2], prefix) {
			t.Fatalf("Rank changed what out held: %v", rank[:2])
		}
		rank = rank[2:]
		if len(rank) != len(held) || len(rank) != p.Len() {
			t.Fatalf("seed %d: Rank lists %d blocks; %d held", seed, len(rank), len(held))
		}
		seen := map[ID]bool{}
		for _, id := range rank {
			if _, ok := held[id]; !ok || seen[id] {
				t.Fatalf("seed %d: Rank lists %d, absent or twice", seed, id)
			}
			seen[id] = true
		}
		if !slices.Equal(p.Rank(nil), rank) {
			t.Fatalf("seed %d: a second Rank differs", seed)
		}
		if len(rank) == 0 {
			continue
		}
		if v, _ := p.Victim(t0, nil); v != rank[0] {
			t.Fatalf("seed %d: Victim is %d, Rank's first %d", seed, v, rank[0])
		}
		switch k {
		case LRU, FIFO, TTL:
			if got := order(p); !slices.Equal(got, rank) {
				t.Fatalf("seed %d: Victim drains in the order\n%v\nRank said\n%v", seed, got, rank)
			}
		}
	}
}
