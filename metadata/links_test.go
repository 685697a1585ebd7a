package metadata

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvpool/kvpool/internal/eventually"
)

func TestDecodeNodeLinks(t *testing.T) {
	good := NodeLinks{Node: "node-a", UnixNano: 123, Links: []LinkRecord{
		{Peer: "node-b", BytesPerSecond: 12.5e9, RTTMicros: 80, Samples: 42},
		{Peer: "node-c", BytesPerSecond: 0, RTTMicros: 0, Samples: 0},
	}}
	goodJSON, err := json.Marshal(good)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		in   string
		want *NodeLinks // nil: ErrMalformed
	}{
		{"good", string(goodJSON), &good},
		{"no links", `{"node":"node-a","unix_nano":1,"links":[]}`, &NodeLinks{Node: "node-a", UnixNano: 1, Links: []LinkRecord{}}},
		{"bad json", `{"node":"node-a",`, nil},
		{"not an object", `[]`, nil},
		{"empty", ``, nil},
		{"no node", `{"links":[]}`, nil},
		{"bad node", `{"node":"a/b","links":[]}`, nil},
		{"bad peer", `{"node":"a","links":[{"peer":"b c","bps":1}]}`, nil},
		{"empty peer", `{"node":"a","links":[{"bps":1}]}`, nil},
		{"negative bps", `{"node":"a","links":[{"peer":"b","bps":-1}]}`, nil},
		{"NaN bps", `{"node":"a","links":[{"peer":"b","bps":NaN}]}`, nil},
		{"Inf bps", `{"node":"a","links":[{"peer":"b","bps":1e999}]}`, nil},
		{"negative rtt", `{"node":"a","links":[{"peer":"b","bps":1,"rtt_us":-1}]}`, nil},
		{"negative samples", `{"node":"a","links":[{"peer":"b","bps":1,"samples":-1}]}`, nil},
		{"peer twice", `{"node":"a","links":[{"peer":"b","bps":1},{"peer":"b","bps":2}]}`, nil},
		{"bps as string", `{"node":"a","links":[{"peer":"b","bps":"1"}]}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeNodeLinks([]byte(tc.in))
			if tc.want == nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("got %+v, %v; want ErrMalformed", got, err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, *tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, *tc.want)
			}
		})
	}
}

func TestLinkRecordValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		rec  LinkRecord
		ok   bool
	}{
		{"good", LinkRecord{Peer: "b", BytesPerSecond: 1e9, RTTMicros: 10, Samples: 3}, true},
		{"zero", LinkRecord{Peer: "b"}, true},
		{"NaN", LinkRecord{Peer: "b", BytesPerSecond: math.NaN()}, false},
		{"+Inf", LinkRecord{Peer: "b", BytesPerSecond: math.Inf(1)}, false},
		{"-Inf", LinkRecord{Peer: "b", BytesPerSecond: math.Inf(-1)}, false},
		{"negative bps", LinkRecord{Peer: "b", BytesPerSecond: -0.5}, false},
		{"negative rtt", LinkRecord{Peer: "b", RTTMicros: -1}, false},
		{"fetch costs", LinkRecord{Peer: "b", FixedMicros: 250, PerBlockMicros: 13.5, PerDoublingMicros: 150, FetchBytesPerSecond: 4e9}, true},
		{"negative fixed", LinkRecord{Peer: "b", FixedMicros: -1}, false},
		{"negative per block", LinkRecord{Peer: "b", PerBlockMicros: -1}, false},
		{"negative per doubling", LinkRecord{Peer: "b", PerDoublingMicros: -1}, false},
		{"NaN per doubling", LinkRecord{Peer: "b", PerDoublingMicros: math.NaN()}, false},
		{"bad peer", LinkRecord{Peer: "b/c"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.rec.validate(); (err == nil) != tc.ok {
				t.Fatalf("validate: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestSanitizeLinks(t *testing.T) {
	in := []LinkRecord{
		{Peer: "node-c", BytesPerSecond: 3},
		{Peer: "bad peer", BytesPerSecond: 1},
		{Peer: "node-b", BytesPerSecond: 2},
		{Peer: "node-d", BytesPerSecond: math.NaN()},
		{Peer: "node-b", BytesPerSecond: 9},
	}
	got, dropped, _ := sanitizeLinks(in)
	want := []LinkRecord{{Peer: "node-b", BytesPerSecond: 2}, {Peer: "node-c", BytesPerSecond: 3}}
	if dropped != 3 || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, dropped %d; want %+v, dropped 3", got, dropped, want)
	}
	if in[0].Peer != "node-c" {
		t.Fatal("sanitizeLinks reordered its input")
	}
}

func TestLinkChange(t *testing.T) {
	base := []LinkRecord{{Peer: "b", BytesPerSecond: 1000, RTTMicros: 100, Samples: 5}, {Peer: "c", BytesPerSecond: 0, RTTMicros: 0, Samples: 0}}
	with := func(f func([]LinkRecord) []LinkRecord) []LinkRecord { return f(slices.Clone(base)) }
	for _, tc := range []struct {
		name              string
		was, now          []LinkRecord
		material, samples bool
	}{
		{"same", base, base, false, false},
		{"both empty", nil, []LinkRecord{}, false, false},
		{"first links", nil, base, true, false},
		{"all gone", base, []LinkRecord{}, true, false},
		{"peer left", base, base[:1], true, false},
		{"peer replaced", base, with(func(l []LinkRecord) []LinkRecord { l[1].Peer = "d"; return l }), true, false},
		{"bps +4%", base, with(func(l []LinkRecord) []LinkRecord { l[0].BytesPerSecond = 1040; return l }), false, false},
		{"bps exactly 5%", base, with(func(l []LinkRecord) []LinkRecord { l[0].BytesPerSecond = 950; return l }), false, false},
		{"bps +6%", base, with(func(l []LinkRecord) []LinkRecord { l[0].BytesPerSecond = 1060; return l }), true, false},
		{"bps -10%", base, with(func(l []LinkRecord) []LinkRecord { l[0].BytesPerSecond = 900; return l }), true, false},
		{"bps off zero", base, with(func(l []LinkRecord) []LinkRecord { l[1].BytesPerSecond = 1; return l }), true, false},
		{"rtt +3%", base, with(func(l []LinkRecord) []LinkRecord { l[0].RTTMicros = 103; return l }), false, false},
		{"rtt +20%", base, with(func(l []LinkRecord) []LinkRecord { l[0].RTTMicros = 120; return l }), true, false},
		{"samples only", base, with(func(l []LinkRecord) []LinkRecord { l[0].Samples = 6; return l }), false, true},
		{"seed measured", base, with(func(l []LinkRecord) []LinkRecord { l[1].Samples = 1; return l }), true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			material, samples := linkChange(tc.was, tc.now)
			if material != tc.material || samples != tc.samples {
				t.Fatalf("linkChange = (%v, %v), want (%v, %v)", material, samples, tc.material, tc.samples)
			}
		})
	}
}

func FuzzDecodeNodeLinks(f *testing.F) {
	f.Add([]byte(`{"node":"node-a","unix_nano":5,"links":[{"peer":"node-b","bps":1.5e9,"rtt_us":90,"samples":3}]}`))
	f.Add([]byte(`{"node":"node-a","links":null}`))
	f.Add([]byte(`{"node":"a","links":[{"peer":"b","bps":-0}]}`))
	f.Add([]byte(`{"node":"a","links":[{"peer":"b","bps":1e999}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeNodeLinks(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// Whatever decodes encodes, and decodes the same again.
		enc, err := json.Marshal(got)
		if err != nil {
			t.Fatalf("encoding %+v: %v", got, err)
		}
		again, err := DecodeNodeLinks(enc)
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("re-decoding: %v\n%+v\n%+v", err, got, again)
		}
	})
}

// linkSource is a Links function whose output the test changes.
type linkSource struct {
	mu    sync.Mutex
	links []LinkRecord
	calls int
}

func (s *linkSource) get() []LinkRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return slices.Clone(s.links)
}

// set replaces the links and returns how many polls came before: every
// poll after that many sees the new links.
func (s *linkSource) set(links ...LinkRecord) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.links = links
	return s.calls
}

func (s *linkSource) polls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// waitPolled waits until n polls after poll from have completed. Polls run
// one at a time on the member's goroutine, so once poll from+n+1 started,
// polls from+1..from+n finished, writes included.
func (s *linkSource) waitPolled(t *testing.T, from, n int) {
	t.Helper()
	eventually.True(t, "the member to poll its links", patience, func() bool { return s.polls() > from+n })
}

func TestMemberPublishesLinks(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	mm := startMirror(t, newClient(t, e.ClientURL()))
	toB := LinkRecord{Peer: "node-b", BytesPerSecond: 1e9, RTTMicros: 100}
	src := &linkSource{links: []LinkRecord{toB}}
	var skew atomic.Int64 // added to the member's clock
	a := startMember(t, cli, "node-a", func(c *MemberConfig) {
		c.Links = src.get
		c.LinkInterval = 20 * time.Millisecond
		c.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	})
	writes := func() uint64 { return a.Stats().LinkWrites }
	sees := func(mm *Mirror, want LinkRecord) func() bool {
		return func() bool { got, ok := mm.Link("node-a", want.Peer); return ok && got == want }
	}

	// The registration carries the first set; unchanged polls write nothing.
	eventually.True(t, "the mirror to see the first links", patience, sees(mm, toB))
	src.waitPolled(t, src.polls(), 3)
	if w := writes(); w != 1 {
		t.Fatalf("%d link writes after unchanged polls, want 1 (at registration)", w)
	}
	if got := mm.Links(); len(got) != 1 || got[0].Node != "node-a" || got[0].UnixNano == 0 || !slices.Equal(got[0].Links, []LinkRecord{toB}) {
		t.Fatalf("Links() = %+v", got)
	}
	if _, ok := mm.Link("node-b", "node-a"); ok {
		t.Fatal("a link node-b never published")
	}
	// A mirror that starts now loads the record.
	if late := startMirror(t, newClient(t, e.ClientURL())); !sees(late, toB)() {
		t.Fatalf("a loading mirror has %+v", late.Links())
	}

	// A 10% change (and a seed becoming a measurement) is written.
	toB = LinkRecord{Peer: "node-b", BytesPerSecond: 1.1e9, RTTMicros: 100, Samples: 10}
	from := src.set(toB)
	eventually.True(t, "the mirror to see a 10% change", patience, sees(mm, toB))
	// The mirror can see the write before the member counts it: wait for
	// the poll that wrote to finish.
	src.waitPolled(t, from, 1)
	if w := writes(); w != 2 {
		t.Fatalf("%d link writes, want 2", w)
	}

	// A 1% change is not, nor is a new sample count while the record is
	// fresh.
	from = src.set(LinkRecord{Peer: "node-b", BytesPerSecond: 1.1e9 * 1.01, RTTMicros: 101, Samples: 11})
	src.waitPolled(t, from, 3)
	from = src.set(LinkRecord{Peer: "node-b", BytesPerSecond: 1.1e9 * 1.01, RTTMicros: 101, Samples: 20})
	src.waitPolled(t, from, 3)
	if w := writes(); w != 2 {
		t.Fatalf("%d link writes after small changes, want 2", w)
	}
	if !sees(mm, toB)() {
		t.Fatalf("the mirror has %+v after small changes, want %+v", mm.Links(), toB)
	}
	// Once the record is linkRefresh old, new sample counts are written.
	skew.Add(int64(linkRefresh + time.Second))
	toB = LinkRecord{Peer: "node-b", BytesPerSecond: 1.1e9 * 1.01, RTTMicros: 101, Samples: 20}
	eventually.True(t, "the mirror to see refreshed samples", patience, sees(mm, toB))

	// Peers appear and leave.
	toC := LinkRecord{Peer: "node-c", BytesPerSecond: 5e8, RTTMicros: 300, Samples: 1}
	src.set(toC, toB) // unsorted: the member sorts
	eventually.True(t, "the mirror to see node-c", patience, sees(mm, toC))
	src.set(toB)
	eventually.True(t, "node-c to leave", patience, func() bool { _, ok := mm.Link("node-a", "node-c"); return !ok && sees(mm, toB)() })

	// A new lease carries the links at once.
	old := a.Epoch()
	if _, err := cli.Revoke(context.Background(), clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "the links record on a new lease", patience, func() bool {
		resp, err := cli.Get(context.Background(), keys{"/kvpool/"}.link("node-a"))
		return err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].Lease != old && resp.Kvs[0].Lease == a.Epoch()
	})
	eventually.True(t, "the mirror to see the links of the new epoch", patience, sees(mm, toB))

	// A stopped member revokes its lease, and its links leave.
	a.cancel()
	<-a.done
	eventually.True(t, "the links to leave with the lease", patience, func() bool { return len(mm.Links()) == 0 && mm.Stats().Links == 0 })
	if _, ok := mm.Link("node-a", "node-b"); ok {
		t.Fatal("Link still answers for a stopped node")
	}
}

func TestMemberWithoutLinksDeletesStaleRecord(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	// What an earlier process with the same id left, as if its lease had
	// not expired yet.
	if _, err := cli.Put(context.Background(), keys{"/kvpool/"}.link("node-a"), `{"node":"node-a","links":[{"peer":"node-b","bps":1}]}`); err != nil {
		t.Fatal(err)
	}
	mm := startMirror(t, cli)
	if _, ok := mm.Link("node-a", "node-b"); !ok {
		t.Fatal("the mirror did not load the stale record")
	}
	a := startMember(t, cli, "node-a")
	eventually.True(t, "the stale record to go", patience, func() bool { _, ok := mm.Link("node-a", "node-b"); return !ok })
	if w := a.Stats().LinkWrites; w != 0 {
		t.Fatalf("%d link writes without a Links function", w)
	}
}

func TestMirrorSkipsMalformedLinks(t *testing.T) {
	e := startEtcd(t)
	cli := newClient(t, e.ClientURL())
	mm := startMirror(t, cli)
	good := NodeLinks{Node: "node-g", UnixNano: 7, Links: []LinkRecord{{Peer: "node-h", BytesPerSecond: 2e9, RTTMicros: 50, Samples: 9}, {Peer: "node-a", BytesPerSecond: 1e9}}}
	goodJSON, _ := json.Marshal(good)
	malformed := map[string]string{
		"/kvpool/links/x":      "{",
		"/kvpool/links/node-z": `{"node":"node-y","links":[]}`,
		"/kvpool/links/node-q": `{"node":"node-q","links":[{"peer":"node-a","bps":-1}]}`,
		"/kvpool/links/node-r": `{"node":"node-r","links":[{"peer":"bad peer","bps":1}]}`,
		"/kvpool/links/a/b":    `{"node":"a/b","links":[]}`,
		"/kvpool/links/":       `{"node":"","links":[]}`,
	}
	for k, v := range malformed {
		if _, err := cli.Put(context.Background(), k, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(context.Background(), "/kvpool/links/node-g", string(goodJSON)); err != nil {
		t.Fatal(err)
	}
	want := []NodeLinks{{Node: "node-g", UnixNano: 7, Links: []LinkRecord{good.Links[1], good.Links[0]}}} // sorted by peer
	eventually.True(t, "the watching mirror to hold the good record", patience, func() bool { return reflect.DeepEqual(mm.Links(), want) })
	if got := mm.Stats().Malformed; got != uint64(len(malformed)) {
		t.Fatalf("the watching mirror skipped %d records, want %d", got, len(malformed))
	}
	fresh := startMirror(t, cli)
	if got := fresh.Stats().Malformed; got != uint64(len(malformed)) {
		t.Fatalf("a loading mirror skipped %d records, want %d", got, len(malformed))
	}
	if got := fresh.Links(); !reflect.DeepEqual(got, want) {
		t.Fatalf("a loading mirror holds %+v, want %+v", got, want)
	}
	if l, ok := fresh.Link("node-g", "node-h"); !ok || l != good.Links[0] {
		t.Fatalf("Link(node-g, node-h) = %+v, %v", l, ok)
	}
	// Links returns copies.
	fresh.Links()[0].Links[0].BytesPerSecond = 0
	if l, _ := fresh.Link("node-g", "node-a"); l.BytesPerSecond != 1e9 {
		t.Fatal("Links shares the mirror's state")
	}
}
