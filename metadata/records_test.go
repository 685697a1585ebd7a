package metadata

import (
	"errors"
	"reflect"
	"testing"
)

func TestBatchRoundTrip(t *testing.T) {
	for _, b := range []*Batch{
		{Records: []Record{{Op: OpAdd, Tenant: "acme", Namespace: "llama", Key: "k1"}, {Op: OpRemove, Tenant: "acme", Namespace: "llama", Key: "k\x00\xff"}, {Op: OpAdd, Tenant: "b", Namespace: "c", Key: "x"}}, UnixNano: 123},
		{Snapshot: true, Reset: true, Part: 1, Parts: 3, Records: []Record{{Op: OpAdd, Tenant: "t", Namespace: "n", Key: "k"}}},
		{Snapshot: true, Part: 0, Parts: 1},
	} {
		got, err := DecodeBatch(AppendBatch(nil, b))
		if err != nil {
			t.Fatal(err)
		}
		if got.Records == nil {
			got.Records = nil
		}
		if len(b.Records) == 0 {
			b.Records = []Record{}
		}
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("got %+v, want %+v", got, b)
		}
	}
}

func TestDecodeBatchRejects(t *testing.T) {
	good := AppendBatch(nil, &Batch{Records: []Record{{Op: OpAdd, Tenant: "t", Namespace: "n", Key: "k"}}})
	cases := map[string][]byte{
		"empty":          nil,
		"version":        append([]byte{9}, good[1:]...),
		"truncated":      good[:len(good)-1],
		"trailing":       append(append([]byte{}, good...), 0),
		"remove in snap": AppendBatch(nil, &Batch{Snapshot: true, Parts: 1, Records: []Record{{Op: OpRemove, Tenant: "t", Namespace: "n", Key: "k"}}}),
		"bad tenant":     AppendBatch(nil, &Batch{Records: []Record{{Op: OpAdd, Tenant: "a/b", Namespace: "n", Key: "k"}}}),
		"empty key":      AppendBatch(nil, &Batch{Records: []Record{{Op: OpAdd, Tenant: "t", Namespace: "n", Key: ""}}}),
		"bad op":         AppendBatch(nil, &Batch{Records: []Record{{Op: Op(7), Tenant: "t", Namespace: "n", Key: "k"}}}),
		"part past end":  AppendBatch(nil, &Batch{Snapshot: true, Part: 2, Parts: 2}),
	}
	for name, b := range cases {
		if _, err := DecodeBatch(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(AppendBatch(nil, &Batch{Records: []Record{{Op: OpAdd, Tenant: "t", Namespace: "n", Key: "k"}, {Op: OpRemove, Tenant: "t", Namespace: "m", Key: "j"}}}))
	f.Add(AppendBatch(nil, &Batch{Snapshot: true, Reset: true, Parts: 2, Part: 1, Records: []Record{{Op: OpAdd, Tenant: "t", Namespace: "n", Key: "k"}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeBatch(b)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to something that decodes the same.
		again, err := DecodeBatch(AppendBatch(nil, got))
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("re-decoding: %v\n%+v\n%+v", err, got, again)
		}
	})
}

func FuzzParseLocKey(f *testing.F) {
	k := keys{"/kvpool/"}
	f.Add(k.loc("node-1", 0x1234, 7))
	f.Add("/kvpool/loc/a/0/0000000000000000")
	f.Fuzz(func(t *testing.T, s string) {
		node, epoch, seq, err := k.parseLoc(s)
		if err != nil {
			return
		}
		if k.loc(node, epoch, seq) != s {
			t.Fatalf("%q parses to (%q,%x,%d) which formats differently", s, node, epoch, seq)
		}
	})
}
