package eviction_test

import (
	"fmt"
	"time"

	"github.com/kvpool/kvpool/eviction"
)

// A caller keeps its own store and asks the policy what to evict, skipping
// the blocks it has pinned.
func Example() {
	k, err := eviction.ParseKind("prefix-lru")
	if err != nil {
		panic(err)
	}
	p := eviction.New(k, eviction.Config{})
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

	// A chain 1 → 2 → 3, then another request reading 1 → 4.
	p.Add(eviction.Block{ID: 1, Bytes: 512}, now)
	p.Add(eviction.Block{ID: 2, Bytes: 512, Parent: 1}, now)
	p.Add(eviction.Block{ID: 3, Bytes: 512, Parent: 2}, now)
	p.Touch(1, now)
	p.Add(eviction.Block{ID: 4, Bytes: 512, Parent: 1}, now)

	// Make room: at most 1 KiB may stay.
	pinned := map[eviction.ID]bool{4: true} // being read
	for p.Bytes() > 1024 {
		id, ok := p.Victim(now, func(id eviction.ID) bool { return pinned[id] })
		if !ok {
			break
		}
		fmt.Println("evict", id)
		p.Remove(id)
	}
	fmt.Println(p.Len(), "left,", p.Bytes(), "bytes")
	// Output:
	// evict 3
	// evict 2
	// 2 left, 1024 bytes
}
