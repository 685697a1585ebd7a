package kvevents

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

// readGolden reads a golden message: one hex line per frame, written by
// testdata/golden.py.
func readGolden(t testing.TB, name string) [][]byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var frames [][]byte
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f, err := hex.DecodeString(line)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, f)
	}
	return frames
}

func tokens() []uint32 {
	out := make([]uint32, 32)
	for i := range out {
		out[i] = uint32(i + 1)
	}
	return out
}

func seq(from, to byte) Hash {
	var b []byte
	for i := from; i < to; i++ {
		b = append(b, i)
	}
	return Hash(b)
}

func TestGoldenMessages(t *testing.T) {
	const ts = 1733011200.25
	for _, tc := range []struct {
		file string
		want Message
	}{
		{"array_v1.golden", Message{Topic: "kv-events", Seq: 7, Batch: Batch{TS: ts, DPRank: 0, Events: []Event{
			{Kind: Stored, Hashes: []Hash{IntHash(1001), IntHash(1002)}, Parent: IntHash(1000), TokenIDs: tokens(), BlockSize: 16, Medium: "GPU"},
			{Kind: Removed, Hashes: []Hash{IntHash(1002)}, Medium: "GPU"},
			{Kind: Cleared, Medium: "GPU"},
		}}}},
		{"array_v2.golden", Message{Topic: "kv-events", Seq: 8, Batch: Batch{TS: ts, DPRank: -1, Events: []Event{
			{Kind: Stored, Hashes: []Hash{seq(0, 32), seq(32, 64)}, TokenIDs: tokens(), BlockSize: 16, LoRA: "sql-adapter", Medium: "GPU", Group: 1},
			{Kind: Removed, Hashes: []Hash{seq(0, 32)}, Medium: "CPU", Group: 1},
		}}}},
		{"map.golden", Message{Topic: "kv-events", Seq: 9, Batch: Batch{TS: ts, DPRank: 2, Events: []Event{
			{Kind: Stored, Hashes: []Hash{IntHash(-5), IntHash(1<<63 - 1)}, TokenIDs: tokens(), BlockSize: 16, Medium: "GPU"},
			{Kind: Removed, Hashes: []Hash{IntHash(-5)}, Medium: "GPU"},
			{Kind: Cleared, Medium: "GPU"},
		}}}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := DecodeMessage(readGolden(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decoded\n %+v\nwant\n %+v", got, tc.want)
			}
		})
	}
}

// Every way a message can be wrong is ErrMalformed, and names what.
func TestMalformedMessages(t *testing.T) {
	good := readGolden(t, "array_v1.golden")
	payload := good[2]
	for name, tc := range map[string]struct {
		frames [][]byte
		want   string
	}{
		"two frames":     {[][]byte{good[0], good[1]}, "2 frames"},
		"short sequence": {[][]byte{good[0], good[1][:4], payload}, "4-byte sequence"},
		"truncated":      {[][]byte{good[0], good[1], payload[:len(payload)-3]}, "truncated"},
		"trailing bytes": {[][]byte{good[0], good[1], append(bytes.Clone(payload), 0xc0)}, "after the value"},
		"not msgpack":    {[][]byte{good[0], good[1], {0xc1}}, "not MessagePack"},
		"a string":       {[][]byte{good[0], good[1], {0xa1, 'x'}}, "want an array or a map"},
		"one field":      {[][]byte{good[0], good[1], {0x91, 0x01}}, "1 fields"},
		"unknown event":  {[][]byte{good[0], good[1], mp(t, "[1.0, [[\"BlockMoved\", [1]]]]")}, "unknown event type"},
		"few tokens":     {[][]byte{good[0], good[1], mp(t, "[1.0, [[\"BlockStored\", [1, 2], null, [1, 2, 3], 2, null, \"GPU\"]]]")}, "3 token ids for 2 blocks"},
		"no hashes":      {[][]byte{good[0], good[1], mp(t, "[1.0, [[\"BlockRemoved\", []]]]")}, "non-empty array"},
		"float hash":     {[][]byte{good[0], good[1], mp(t, "[1.0, [[\"BlockRemoved\", [1.5]]]]")}, "want bytes or an integer"},
		"zero block":     {[][]byte{good[0], good[1], mp(t, "[1.0, [[\"BlockStored\", [1], null, [], 0, null, \"GPU\"]]]")}, "block_size 0"},
		"big token":      {[][]byte{good[0], good[1], mp(t, "[1.0, [[\"BlockStored\", [1], null, [4294967296], 1, null, \"GPU\"]]]")}, "token id"},
		"map no hashes":  {[][]byte{good[0], good[1], mp(t, "{\"ts\": 1.0, \"events\": [{\"type\": \"BlockRemoved\"}]}")}, "without block_hashes"},
		"nan ts":         {[][]byte{good[0], good[1], {0x92, 0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 1, 0x90}}, "finite"},
		"huge array":     {[][]byte{good[0], good[1], {0xdd, 0xff, 0xff, 0xff, 0xff}}, "truncated"},
		"deep nesting":   {[][]byte{good[0], good[1], bytes.Repeat([]byte{0x91}, 40)}, "nested deeper"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeMessage(tc.frames)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrMalformed about %q", err, tc.want)
			}
		})
	}
}

// mp encodes a JSON literal as MessagePack, for hand-made messages:
// numbers with a dot are float64, others integers.
func mp(t testing.TB, lit string) []byte {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(lit))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("literal %q: %v", lit, err)
	}
	var buf bytes.Buffer
	encodeTest(t, &buf, v)
	return buf.Bytes()
}

func encodeTest(t testing.TB, w *bytes.Buffer, v any) {
	switch x := v.(type) {
	case nil:
		w.WriteByte(0xc0)
	case string:
		w.WriteByte(0xd9)
		w.WriteByte(byte(len(x)))
		w.WriteString(x)
	case json.Number:
		if strings.Contains(string(x), ".") {
			f, _ := x.Float64()
			w.WriteByte(0xcb)
			binary.Write(w, binary.BigEndian, f)
			return
		}
		n, err := x.Int64()
		if err != nil {
			t.Fatal(err)
		}
		w.WriteByte(0xd3)
		binary.Write(w, binary.BigEndian, n)
	case []any:
		w.WriteByte(0xdc)
		binary.Write(w, binary.BigEndian, uint16(len(x)))
		for _, e := range x {
			encodeTest(t, w, e)
		}
	case map[string]any:
		w.WriteByte(0xde)
		binary.Write(w, binary.BigEndian, uint16(len(x)))
		for k, e := range x {
			encodeTest(t, w, k)
			encodeTest(t, w, e)
		}
	default:
		t.Fatalf("cannot encode %T", v)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	for _, name := range []string{"array_v1.golden", "array_v2.golden", "map.golden"} {
		f.Add(readGolden(f, name)[2])
	}
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90})
	f.Fuzz(func(t *testing.T, b []byte) {
		batch, err := DecodeBatch(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("an error that is not ErrMalformed: %v", err)
			}
			return
		}
		for _, e := range batch.Events {
			if e.Kind == kindInvalid || (e.Kind != Cleared && len(e.Hashes) == 0) || len(e.TokenIDs) != len(e.Hashes)*e.BlockSize && e.Kind == Stored {
				t.Fatalf("accepted an invalid event %+v", e)
			}
		}
		// What decodes re-encodes to itself (Encode, the Go publisher).
		again, err := DecodeBatch(EncodeBatch(batch))
		if math.IsNaN(batch.TS) && math.IsNaN(again.TS) {
			again.TS = batch.TS
		}
		if err != nil || !reflect.DeepEqual(again, batch) {
			t.Fatalf("re-encoded %+v as %+v (%v)", batch, again, err)
		}
	})
}

// What Encode writes decodes to the message it encoded: the golden
// messages, and edge values of every field's width.
func TestEncodeRoundTrips(t *testing.T) {
	msgs := []Message{}
	for _, f := range []string{"array_v1.golden", "array_v2.golden", "map.golden"} {
		m, err := DecodeMessage(readGolden(t, f))
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	long := make([]uint32, 70000)
	for i := range long {
		long[i] = uint32(i) * 65537
	}
	var many []Hash
	for i := range 70000 / 16 {
		many = append(many, IntHash(int64(i)-2000))
	}
	msgs = append(msgs,
		Message{Topic: "", Seq: 1<<64 - 1, Batch: Batch{TS: -1.5, DPRank: 1 << 20, Events: []Event{}}},
		Message{Topic: strings.Repeat("t", 300), Seq: 0, Batch: Batch{TS: 0, DPRank: -1, Events: []Event{
			{Kind: Stored, Hashes: many, Parent: Hash(strings.Repeat("p", 64)), TokenIDs: long[:len(many)*16], BlockSize: 16, Medium: "GPU", LoRA: strings.Repeat("l", 40)},
			{Kind: Stored, Hashes: []Hash{"x"}, TokenIDs: []uint32{math.MaxUint32}, BlockSize: 1, Medium: "CPU", Group: 70000},
			{Kind: Removed, Hashes: many[:17], Medium: "GPU", Group: 3},
			{Kind: Cleared, Medium: "GPU"},
		}}},
	)
	for i, m := range msgs {
		got, err := DecodeMessage(Encode(m))
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("message %d decoded as\n %+v\nwant\n %+v", i, got, m)
		}
	}
}
