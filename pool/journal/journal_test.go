package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvpool/kvpool/api"
)

func put(tenant, ns, key string, off, size int64, crc uint32) Record {
	return Record{Kind: Put, Tenant: []byte(tenant), Namespace: []byte(ns), Key: []byte(key), Offset: off, Size: size, CRC: crc}
}

func drop(tenant, ns, key string) Record {
	return Record{Kind: Drop, Tenant: []byte(tenant), Namespace: []byte(ns), Key: []byte(key)}
}

// same compares records by value, nil and empty names alike.
func same(a, b Record) bool {
	return a.Kind == b.Kind && bytes.Equal(a.Tenant, b.Tenant) && bytes.Equal(a.Namespace, b.Namespace) && bytes.Equal(a.Key, b.Key) &&
		a.Offset == b.Offset && a.Size == b.Size && a.CRC == b.CRC && a.ExpiresUnixNano == b.ExpiresUnixNano
}

func TestRecordRoundTrip(t *testing.T) {
	long := strings.Repeat("k", 65535)
	for _, r := range []Record{
		put("t", "ns", "key", 0, 1, 0),
		put("tenant-a", "", "\x00\xff", 1<<40, 2<<20, 0xdeadbeef),
		{Kind: Put, Tenant: []byte("t"), Key: []byte("k"), Offset: 4096, Size: 4096, CRC: 7, ExpiresUnixNano: 1_800_000_000_000_000_000},
		drop("t", "ns", "key"),
		drop("", "", ""),
		put(long, long, long, 0, 1, 1),
	} {
		b := AppendRecord([]byte("prefix"), r)
		got, n, err := DecodeRecord(b[len("prefix"):])
		if err != nil {
			t.Fatalf("%v %.20q: %v", r.Kind, r.Key, err)
		}
		if n != len(b)-len("prefix") || !same(got, r) {
			t.Fatalf("%v %.20q: decoded %v (%d of %d bytes)", r.Kind, r.Key, got.Kind, n, len(b)-len("prefix"))
		}
	}
}

// Every cut of a record and every flipped bit of it is a torn record:
// nothing a crash or a bad sector leaves is taken for a record.
func TestDamagedRecordsAreTorn(t *testing.T) {
	b := AppendRecord(nil, put("tenant", "ns", "key", 8192, 2<<20, 0x1234))
	for n := range len(b) {
		if _, _, err := DecodeRecord(b[:n]); !errors.Is(err, ErrTorn) {
			t.Fatalf("record cut to %d of %d bytes: %v", n, len(b), err)
		}
	}
	for i := range len(b) {
		for bit := range 8 {
			c := bytes.Clone(b)
			c[i] ^= 1 << bit
			if _, _, err := DecodeRecord(c); !errors.Is(err, ErrTorn) {
				t.Fatalf("bit %d of byte %d flipped: %v", bit, i, err)
			}
		}
	}
}

func TestReplay(t *testing.T) {
	for _, tc := range []struct {
		name       string
		records    []Record
		tail       []byte
		want       []Record
		overlapped int
	}{
		{name: "empty"},
		{
			name:    "puts sorted by offset",
			records: []Record{put("t", "n", "b", 8192, 4096, 2), put("t", "n", "a", 0, 4096, 1)},
			want:    []Record{put("t", "n", "a", 0, 4096, 1), put("t", "n", "b", 8192, 4096, 2)},
		},
		{
			name:    "a drop ends a put",
			records: []Record{put("t", "n", "a", 0, 4096, 1), put("t", "n", "b", 4096, 4096, 2), drop("t", "n", "a")},
			want:    []Record{put("t", "n", "b", 4096, 4096, 2)},
		},
		{
			name:    "put again after a drop",
			records: []Record{put("t", "n", "a", 0, 4096, 1), drop("t", "n", "a"), put("t", "n", "a", 4096, 4096, 1)},
			want:    []Record{put("t", "n", "a", 4096, 4096, 1)},
		},
		{
			name:    "names differ by tenant and namespace",
			records: []Record{put("t1", "n", "a", 0, 4096, 1), put("t2", "n", "a", 4096, 4096, 2), put("t1", "m", "a", 8192, 4096, 3), drop("t2", "n", "a")},
			want:    []Record{put("t1", "n", "a", 0, 4096, 1), put("t1", "m", "a", 8192, 4096, 3)},
		},
		{
			// b took a's pages before a's drop reached the file: a's
			// bytes are b's now.
			name:       "a later put over live pages wins",
			records:    []Record{put("t", "n", "a", 0, 8192, 1), put("t", "n", "c", 16384, 4096, 3), put("t", "n", "b", 4096, 4096, 2)},
			want:       []Record{put("t", "n", "b", 4096, 4096, 2), put("t", "n", "c", 16384, 4096, 3)},
			overlapped: 1,
		},
		{
			name:       "an earlier put is overlapped from below",
			records:    []Record{put("t", "n", "a", 4096, 4096, 1), put("t", "n", "b", 0, 8192, 2)},
			want:       []Record{put("t", "n", "b", 0, 8192, 2)},
			overlapped: 1,
		},
		{
			name:    "adjacent blocks do not overlap",
			records: []Record{put("t", "n", "a", 0, 4096, 1), put("t", "n", "b", 4096, 4096, 2)},
			want:    []Record{put("t", "n", "a", 0, 4096, 1), put("t", "n", "b", 4096, 4096, 2)},
		},
		{
			name:    "a torn tail ends the replay",
			records: []Record{put("t", "n", "a", 0, 4096, 1)},
			tail:    AppendRecord(nil, drop("t", "n", "a"))[:9],
			want:    []Record{put("t", "n", "a", 0, 4096, 1)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b []byte
			for _, r := range tc.records {
				b = AppendRecord(b, r)
			}
			valid := len(b)
			b = append(b, tc.tail...)
			got, err := Replay(b)
			if err != nil {
				t.Fatal(err)
			}
			if got.Records != len(tc.records) || got.ValidBytes != int64(valid) || got.Torn != int64(len(tc.tail)) || got.Overlapped != tc.overlapped {
				t.Fatalf("records %d, valid %d, torn %d, overlapped %d; want %d, %d, %d, %d",
					got.Records, got.ValidBytes, got.Torn, got.Overlapped, len(tc.records), valid, len(tc.tail), tc.overlapped)
			}
			if len(got.Blocks) != len(tc.want) {
				t.Fatalf("%d blocks, want %d", len(got.Blocks), len(tc.want))
			}
			for i := range tc.want {
				if !same(got.Blocks[i], tc.want[i]) {
					t.Fatalf("block %d: %q at %d, want %q at %d", i, got.Blocks[i].Key, got.Blocks[i].Offset, tc.want[i].Key, tc.want[i].Offset)
				}
			}
		})
	}
}

// A record whose checksum holds but whose body this version cannot read
// was written by something else: an error, not a torn tail.
func TestReplayRefusesForeignRecords(t *testing.T) {
	b := AppendRecord(nil, put("t", "n", "a", 0, 4096, 1))
	foreign := AppendRecord(nil, drop("t", "n", "a"))
	foreign[8] = 9 // kind 9
	rewriteCRC(foreign)
	if _, err := Replay(append(b, foreign...)); err == nil || errors.Is(err, ErrTorn) {
		t.Fatalf("replay of a record of kind 9: %v", err)
	}
}

// rewriteCRC makes rec's checksum match its (altered) body.
func rewriteCRC(rec []byte) { copy(rec, le32(api.Checksum(rec[frameBytes:]))) }

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func TestWriterFlushesWhatACrashKeeps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.journal")
	h := Header{SegmentID: 42, CapacityBytes: 1 << 30, PageBytes: 4096}
	w, err := Create(path, h)
	if err != nil {
		t.Fatal(err)
	}
	w.Append(put("t", "n", "a", 0, 4096, 1))
	w.Append(put("t", "n", "b", 4096, 4096, 2))
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	w.Append(drop("t", "n", "a")) // never flushed: a kill -9 loses it
	gotH, r, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if gotH != h {
		t.Fatalf("header %+v, want %+v", gotH, h)
	}
	if r.Records != 2 || len(r.Blocks) != 2 || r.Torn != 0 {
		t.Fatalf("after one flush: %d records, %d blocks, %d torn bytes; want 2, 2, 0", r.Records, len(r.Blocks), r.Torn)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, r, _ = Read(path); r.Records != 3 || len(r.Blocks) != 1 || string(r.Blocks[0].Key) != "b" {
		t.Fatalf("after Close: %d records, %d blocks; want 3 and block b", r.Records, len(r.Blocks))
	}
	if err := w.Flush(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Flush after Close: %v", err)
	}
}

// A journal cut at any byte (a crash mid-write) replays to the records
// before the cut, and Open appends after the last whole one.
func TestOpenCutsATornTail(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "index.journal")
	h := Header{SegmentID: 7, CapacityBytes: 1 << 20, PageBytes: 4096}
	w, err := Create(path, h)
	if err != nil {
		t.Fatal(err)
	}
	recs := []Record{put("t", "n", "a", 0, 4096, 1), put("t", "n", "b", 4096, 4096, 2), drop("t", "n", "a")}
	var ends []int64 // file length after each record
	for _, r := range recs {
		w.Append(r)
		ends = append(ends, w.Size())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for cut := int64(headerBytes); cut <= int64(len(whole)); cut++ {
		if err := os.WriteFile(path, whole[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		_, r, err := Read(path)
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		wantRecords := 0
		for _, e := range ends {
			if e <= cut {
				wantRecords++
			}
		}
		if r.Records != wantRecords {
			t.Fatalf("cut at %d: %d records, want %d", cut, r.Records, wantRecords)
		}
		w, err := Open(path, r)
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		w.Append(put("t", "n", "z", 65536, 4096, 9))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		_, r2, err := Read(path)
		if err != nil {
			t.Fatal(err)
		}
		if r2.Records != wantRecords+1 || r2.Torn != 0 || string(r2.Blocks[len(r2.Blocks)-1].Key) != "z" {
			t.Fatalf("cut at %d, then an append: %d records, %d torn; want %d, 0, z last", cut, r2.Records, r2.Torn, wantRecords+1)
		}
	}
}

func TestRewriteCompacts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.journal")
	h := Header{SegmentID: 1, CapacityBytes: 1 << 20, PageBytes: 4096}
	w, err := Create(path, h)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		k := fmt.Sprint(i)
		w.Append(put("t", "n", k, 0, 4096, uint32(i)))
		if i < 99 {
			w.Append(drop("t", "n", k))
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, r, err := Read(path)
	if err != nil || len(r.Blocks) != 1 || r.Records != 199 {
		t.Fatalf("before: %d blocks of %d records, %v", len(r.Blocks), r.Records, err)
	}
	w, err = Rewrite(path, h, r.Blocks)
	if err != nil {
		t.Fatal(err)
	}
	w.Append(put("t", "n", "new", 8192, 4096, 5))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, r, err = Read(path)
	if err != nil || r.Records != 2 || len(r.Blocks) != 2 {
		t.Fatalf("after: %d blocks of %d records, %v", len(r.Blocks), r.Records, err)
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file left behind: %v", err)
	}
}

func TestReadRefusesOtherFiles(t *testing.T) {
	dir := t.TempDir()
	good := appendHeader(nil, Header{SegmentID: 1, CapacityBytes: 1 << 20, PageBytes: 4096})
	otherVersion := bytes.Clone(good)
	otherVersion[len(magic)] = 2
	copy(otherVersion[headerBytes-4:], le32(api.Checksum(otherVersion[:headerBytes-4])))
	badCRC := bytes.Clone(good)
	badCRC[headerBytes-1] ^= 1
	for name, b := range map[string][]byte{
		"empty":         nil,
		"short":         good[:headerBytes-1],
		"not a journal": []byte(strings.Repeat("x", 64)),
		"bad checksum":  badCRC,
		"version 2":     otherVersion,
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Read(path); !errors.Is(err, ErrNotJournal) {
			t.Errorf("%s: %v, want ErrNotJournal", name, err)
		}
	}
	if _, _, err := Read(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

// Appends from many goroutines while another flushes: every record lands
// once, whole (run with -race).
func TestConcurrentAppendAndFlush(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.journal")
	w, err := Create(path, Header{SegmentID: 3, CapacityBytes: 1 << 30, PageBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 4, 500
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				w.Append(put("t", "n", fmt.Sprintf("%d-%d", g, i), int64(g*each+i)*4096, 4096, uint32(i)))
			}
		})
	}
	done := make(chan struct{})
	var flushErr error
	go func() {
		defer close(done)
		for range 50 {
			if err := w.Flush(); err != nil {
				flushErr = err
				return
			}
		}
	}()
	wg.Wait()
	<-done
	if flushErr != nil {
		t.Fatal(flushErr)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, r, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if r.Records != writers*each || len(r.Blocks) != writers*each || r.Torn != 0 {
		t.Fatalf("%d records, %d blocks, %d torn; want %d, %d, 0", r.Records, len(r.Blocks), r.Torn, writers*each, writers*each)
	}
}

// Replay never panics, and what it decodes re-encodes to the bytes it
// consumed.
func FuzzReplay(f *testing.F) {
	var seed []byte
	for _, r := range []Record{put("t", "n", "a", 0, 4096, 1), drop("t", "n", "a"), put("t", "", "b", 4096, 8192, 2)} {
		seed = AppendRecord(seed, r)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)-3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var again []byte
		off := 0
		for off < len(b) {
			r, n, err := DecodeRecord(b[off:])
			if err != nil {
				break
			}
			again = AppendRecord(again, r)
			off += n
		}
		if !bytes.Equal(again, b[:off]) {
			t.Fatalf("decoded records re-encode differently")
		}
		got, err := Replay(b)
		if err != nil {
			return
		}
		if got.ValidBytes != int64(off) || got.ValidBytes+got.Torn != int64(len(b)) {
			t.Fatalf("valid %d + torn %d of %d bytes; decoding stopped at %d", got.ValidBytes, got.Torn, len(b), off)
		}
		for i := 1; i < len(got.Blocks); i++ {
			a, c := got.Blocks[i-1], got.Blocks[i]
			if a.Offset+a.Size > c.Offset {
				t.Fatalf("live blocks overlap: [%d,+%d) and [%d,+%d)", a.Offset, a.Size, c.Offset, c.Size)
			}
		}
	})
}

// A compacted journal replays to the same blocks as the one it replaced:
// the snapshot at the mark, then what was appended after it, flushed or
// not.
func TestCompactKeepsTheStory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "index.journal")
	h := Header{SegmentID: 9, CapacityBytes: 1 << 30, PageBytes: 4096}
	w, err := Create(path, h)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		w.Append(put("t", "n", fmt.Sprint(i), int64(i)*4096, 4096, uint32(i)))
		if i%2 == 0 {
			w.Append(drop("t", "n", fmt.Sprint(i)))
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	mark := w.Size()
	_, atMark, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	// After the mark: a flushed drop and put, and an unflushed put.
	w.Append(drop("t", "n", "1"))
	w.Append(put("t", "n", "late", 60*4096, 4096, 60))
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	w.Append(put("t", "n", "later", 61*4096, 4096, 61))
	before := w.Size()
	if err := w.Compact(h, atMark.Blocks, mark); err != nil {
		t.Fatal(err)
	}
	if after := w.Size(); after >= before {
		t.Fatalf("compaction left %d bytes of %d", after, before)
	}
	w.Append(drop("t", "n", "3"))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, r, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"late": true, "later": true}
	for i := 1; i < 50; i += 2 {
		if i != 1 && i != 3 {
			want[fmt.Sprint(i)] = true
		}
	}
	if len(r.Blocks) != len(want) || r.Torn != 0 {
		t.Fatalf("%d blocks (%d torn bytes), want %d", len(r.Blocks), r.Torn, len(want))
	}
	for _, b := range r.Blocks {
		if !want[string(b.Key)] {
			t.Fatalf("block %q after compaction", b.Key)
		}
	}
	if err := w.Compact(h, nil, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Compact after Close: %v", err)
	}
}
