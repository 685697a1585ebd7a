package wire

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestChainRoundTrip(t *testing.T) {
	for _, keys := range [][][]byte{
		nil,
		{[]byte("k")},
		{bytes.Repeat([]byte{1}, MaxKeyBytes), []byte("b"), {0, 0, 7}},
	} {
		got, err := DecodeChain(AppendChain(nil, keys))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got, keys, bytes.Equal) {
			t.Fatalf("round trip of %q: %q", keys, got)
		}
	}
}

func TestDecodeChainRejects(t *testing.T) {
	many := AppendChain(nil, slices.Repeat([][]byte{[]byte("k")}, MaxChainKeys+1))
	for name, v := range map[string][]byte{
		"empty key":         AppendChain(nil, [][]byte{[]byte("a"), {}}),
		"oversized key":     AppendChain(nil, [][]byte{bytes.Repeat([]byte{1}, MaxKeyBytes+1)}),
		"ends in a length":  append(AppendChain(nil, [][]byte{[]byte("a")}), 1),
		"ends inside a key": AppendChain(nil, [][]byte{[]byte("abc")})[:4],
		"too many keys":     many,
	} {
		if _, err := DecodeChain(v); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want a protocol error", name, err)
		}
	}
	if _, err := DecodeChain(many[:len(many)-3]); err != nil {
		t.Errorf("a chain of exactly %d keys: %v", MaxChainKeys, err)
	}
}

func TestFetchResultsRoundTrip(t *testing.T) {
	in := []FetchResult{
		{},
		{Source: "node-0", Size: 2 << 20, Took: 1234567 * time.Nanosecond},
		{Status: 5, Message: "pool: no live node holds acme/n/6b"},
	}
	b := AppendFetchResults(nil, in)
	if n := uint64(len(b)); n > MaxFetchResultsBytes(len(in)) {
		t.Fatalf("%d bytes of results, above the bound %d", n, MaxFetchResultsBytes(len(in)))
	}
	got, err := DecodeFetchResults(b, len(in))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, in) {
		t.Fatalf("got %+v, want %+v", got, in)
	}
	// Long sources and messages are cut, not refused.
	long := []FetchResult{{Status: 14, Source: strings.Repeat("s", 300), Message: strings.Repeat("m", 2*MaxFetchMessageBytes)}}
	got, err = DecodeFetchResults(AppendFetchResults(nil, long), 1)
	if err != nil || len(got[0].Source) != 255 || len(got[0].Message) != MaxFetchMessageBytes {
		t.Fatalf("cut result: %+v, %v", got, err)
	}
}

func TestDecodeFetchResultsRejects(t *testing.T) {
	two := AppendFetchResults(nil, []FetchResult{{Source: "a"}, {Message: "b"}})
	mut := func(f func(b []byte)) []byte { b := bytes.Clone(two); f(b); return b }
	for name, c := range map[string]struct {
		v []byte
		n int
	}{
		"fewer than asked":  {two, 3},
		"more than asked":   {two, 1},
		"truncated":         {two[:len(two)-1], 2},
		"short header":      {two[:10], 1},
		"status not a code": {mut(func(b []byte) { b[0] = 17 }), 2},
		"long message":      {mut(func(b []byte) { b[2], b[3] = 0xff, 0xff }), 2},
		"negative took":     {mut(func(b []byte) { b[19] = 0x80 }), 2},
	} {
		if _, err := DecodeFetchResults(c.v, c.n); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: %v, want a protocol error", name, err)
		}
	}
}

// FuzzDecodeChain: the chain decoder never panics, and what it accepts
// re-encodes to the same bytes.
func FuzzDecodeChain(f *testing.F) {
	f.Add(AppendChain(nil, [][]byte{[]byte("a"), []byte("bc")}))
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, v []byte) {
		keys, err := DecodeChain(v)
		if err != nil {
			return
		}
		if re := AppendChain(nil, keys); !bytes.Equal(re, v) {
			t.Fatalf("accepted %x but re-encodes as %x", v, re)
		}
	})
}

// FuzzDecodeFetchResults: the results decoder never panics, and what it
// accepts re-encodes to the same bytes.
func FuzzDecodeFetchResults(f *testing.F) {
	f.Add(AppendFetchResults(nil, []FetchResult{{Source: "n", Size: 1, Took: 2}, {Status: 5, Message: "x"}}), 2)
	f.Fuzz(func(t *testing.T, v []byte, n int) {
		rs, err := DecodeFetchResults(v, n)
		if err != nil {
			return
		}
		if re := AppendFetchResults(nil, rs); !bytes.Equal(re, v) {
			t.Fatalf("accepted %x but re-encodes as %x", v, re)
		}
	})
}
