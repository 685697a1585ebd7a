package eviction

import (
	"testing"
	"time"
)

// FuzzPolicy drives every policy with the operations encoded in data, four
// bytes each (op, id, arg, arg), and checks that none panics and that Len,
// Bytes, membership and the internal invariants stay consistent.
func FuzzPolicy(f *testing.F) {
	f.Add([]byte{0, 1, 0, 0, 0, 2, 1, 0, 0, 3, 2, 5, 3, 0, 0, 0})
	f.Add([]byte{0, 1, 9, 9, 0, 1, 0, 0, 1, 1, 0, 0, 2, 1, 0, 0, 3, 0, 0xff, 0})
	f.Add([]byte{0, 5, 4, 0, 0, 4, 3, 1, 0, 3, 2, 2, 0, 2, 1, 3, 2, 3, 0, 0, 3, 0, 0, 0, 4, 7, 5, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, k := range kinds {
			fuzzOne(t, k, data)
		}
	})
}

func fuzzOne(t *testing.T, k Kind, data []byte) {
	p := New(k, Config{Counters: 4}) // tiny: LFU ages every 40 accesses
	held := make(map[ID]int64)
	var bytes int64
	for i := 0; i+4 <= len(data); i += 4 {
		op, id, a1, a2 := data[i]%7, ID(data[i+1]%32+1), data[i+2], data[i+3]
		now := t0.Add(time.Duration(i) * time.Second)
		switch op {
		case 0: // add
			b := Block{ID: id, Bytes: int64(a2), Parent: ID(a1 % 40), Hash: uint64(a1 & 0x43)}
			if a1&0x80 != 0 {
				b.Expires = now.Add(time.Duration(int8(a2)) * time.Second)
			}
			p.Add(b, now)
			bytes += b.Bytes - held[id]
			held[id] = b.Bytes
		case 1:
			p.Touch(id, now)
		case 2:
			p.Remove(id)
			bytes -= held[id]
			delete(held, id)
		case 3, 4: // victim, evicted if op is 4; pinned: ids ≡ a1 mod a2
			mod := ID(a2%8 + 1)
			pinned := func(x ID) bool { return a2 != 0 && x%mod == ID(a1)%mod }
			v, ok := p.Victim(now, pinned)
			if !ok {
				for h := range held {
					if !pinned(h) {
						t.Fatalf("%v: Victim found none, but %d is unpinned", k, h)
					}
				}
				break
			}
			if _, in := held[v]; !in || pinned(v) {
				t.Fatalf("%v: Victim = %d (held %t, pinned %t)", k, v, in, pinned(v))
			}
			if op == 4 {
				p.Remove(v)
				bytes -= held[v]
				delete(held, v)
			}
		case 5:
			_ = p.Admit(Block{ID: id, Hash: uint64(a2 & 3)}, ID(a1%32+1))
		case 6:
			p.Miss(uint64(a1 & 0x43))
		}
		if p.Len() != len(held) || p.Bytes() != bytes {
			t.Fatalf("%v: Len, Bytes = %d, %d; want %d, %d", k, p.Len(), p.Bytes(), len(held), bytes)
		}
	}
	if err := checkInvariants(p); err != nil {
		t.Fatalf("%v: %v", k, err)
	}
	for _, id := range order(p) {
		if _, ok := held[id]; !ok {
			t.Fatalf("%v: drained %d, which is not held", k, id)
		}
		delete(held, id)
	}
	if len(held) != 0 {
		t.Fatalf("%v: not drained: %v", k, held)
	}
}
