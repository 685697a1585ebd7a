package pool

import (
	"testing"
	"time"
)

func TestPlacements(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ps := newPlacements(2 * time.Second)
	k := func(s ...string) [][]byte {
		var out [][]byte
		for _, x := range s {
			out = append(out, []byte(x))
		}
		return out
	}
	ps.add(placement{node: "a", at: t0, serviceS: 0.5, tenant: "t", namespace: "n", keys: k("x", "y", "z")})
	ps.add(placement{node: "a", at: t0.Add(100 * time.Millisecond), serviceS: 0.25, tenant: "t", namespace: "n", keys: k("x", "q")})
	ps.add(placement{node: "b", at: t0.Add(200 * time.Millisecond), serviceS: 1, tenant: "u", namespace: "n", keys: k("x")})
	for _, tc := range []struct {
		name       string
		at         time.Duration
		node       string
		reportedAt time.Duration
		tenant     string
		keys       [][]byte
		queue      float64
		prefix     int
	}{
		{"both placements count before any report", 300 * time.Millisecond, "a", -time.Hour, "t", k("x", "y", "w"), 0.75, 2},
		{"a report after the first ends its queue share, not its prefix", 300 * time.Millisecond, "a", 50 * time.Millisecond, "t", k("x", "y"), 0.25, 2},
		{"another tenant's chain is not a prefix", 300 * time.Millisecond, "b", -time.Hour, "t", k("x"), 1, 0},
		{"past the ttl nothing counts", 2500 * time.Millisecond, "a", -time.Hour, "t", k("x"), 0, 0},
	} {
		q, p := ps.view(t0.Add(tc.at), tc.node, t0.Add(tc.reportedAt), tc.tenant, "n", tc.keys)
		if q != tc.queue || p != tc.prefix {
			t.Errorf("%s: queue %v prefix %d, want %v and %d", tc.name, q, p, tc.queue, tc.prefix)
		}
	}
	// Bounded: the oldest go first.
	ps = newPlacements(time.Hour)
	ps.max = 3
	for i := range 5 {
		ps.add(placement{node: "a", at: t0.Add(time.Duration(i) * time.Millisecond), serviceS: 1})
	}
	if q, _ := ps.view(t0, "a", t0.Add(-time.Hour), "", "", nil); q != 3 {
		t.Errorf("%v queued seconds kept, want the last 3", q)
	}
}
