package disk

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvpool/kvpool/api"
)

// testMaxSize is the block size bound the format tests decode with.
const testMaxSize = 64 << 20

func encodeHeader(h header) []byte {
	buf := make([]byte, headerBytes)
	h.encode(buf)
	return buf
}

// reseal recomputes the header CRC of b, so that a test reaches the checks
// that follow it.
func reseal(b []byte) {
	binary.LittleEndian.PutUint32(b[headerCRCAt:], crc32.Checksum(b[:headerCRCAt], castagnoli))
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    header
	}{
		{"minimal", header{tenant: "t", namespace: "n", key: []byte{0}, size: 1}},
		{"typical", header{tenant: "acme", namespace: "llama-3-70b.fp8.tp4", key: bytes.Repeat([]byte{0xab}, 32),
			size: 2<<20 + 7, crc: 0xdeadbeef, expiresUnixNano: 1_700_000_000_000_000_000, writtenUnixNano: 1_600_000_000_000_000_000}},
		{"longest names", header{tenant: strings.Repeat("T", api.MaxNameBytes), namespace: strings.Repeat("n", api.MaxNameBytes),
			key: bytes.Repeat([]byte{0xff}, api.MaxKeyBytes), size: testMaxSize, crc: 1}},
		{"no ttl", header{tenant: "a.b_c-d", namespace: "0", key: []byte("key"), size: 4096, expiresUnixNano: 0, writtenUnixNano: 42}},
		{"negative times", header{tenant: "t", namespace: "n", key: []byte("k"), size: 4095, expiresUnixNano: -1, writtenUnixNano: -5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := encodeHeader(tc.h)
			if !bytes.Equal(buf[:8], magic[:]) {
				t.Fatalf("header starts %q, want the magic %q", buf[:8], magic[:])
			}
			got, err := decodeHeader(buf, testMaxSize)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, tc.h) {
				t.Fatalf("decoded %+v, want %+v", got, tc.h)
			}
			// A longer buffer (a header read together with its block)
			// decodes the same.
			long := append(append([]byte(nil), buf...), 1, 2, 3)
			if got, err := decodeHeader(long, testMaxSize); err != nil || !reflect.DeepEqual(got, tc.h) {
				t.Fatalf("decode of a longer buffer: %+v, %v", got, err)
			}
			if again := encodeHeader(got); !bytes.Equal(again, buf) {
				t.Fatal("re-encoding the decoded header changed its bytes")
			}
		})
	}
}

func TestHeaderCorruptionRejected(t *testing.T) {
	valid := header{tenant: "tenant", namespace: "ns", key: []byte("key"), size: 8192, crc: 7, expiresUnixNano: 9, writtenUnixNano: 3}
	le := binary.LittleEndian
	for _, tc := range []struct {
		name    string
		corrupt func(b []byte) []byte
		maxSize int64
	}{
		{"short", func(b []byte) []byte { return b[:headerBytes-1] }, testMaxSize},
		{"empty", func(b []byte) []byte { return nil }, testMaxSize},
		{"magic", func(b []byte) []byte { b[0] ^= 1; reseal(b); return b }, testMaxSize},
		{"all zero", func(b []byte) []byte { return make([]byte, headerBytes) }, testMaxSize},
		{"version", func(b []byte) []byte { le.PutUint16(b[8:], formatVersion+1); reseal(b); return b }, testMaxSize},
		{"version 0", func(b []byte) []byte { le.PutUint16(b[8:], 0); reseal(b); return b }, testMaxSize},
		{"header crc", func(b []byte) []byte { b[headerCRCAt] ^= 0x80; return b }, testMaxSize},
		{"byte flipped under the crc", func(b []byte) []byte { b[20] ^= 4; return b }, testMaxSize},
		{"names too long", func(b []byte) []byte { le.PutUint16(b[14:], maxNameBytes); reseal(b); return b }, testMaxSize},
		{"names overflow the header", func(b []byte) []byte {
			le.PutUint16(b[10:], 0xffff)
			le.PutUint16(b[12:], 0xffff)
			le.PutUint16(b[14:], 0xffff)
			reseal(b)
			return b
		}, testMaxSize},
		{"size 0", func(b []byte) []byte { le.PutUint64(b[16:], 0); reseal(b); return b }, testMaxSize},
		{"size negative", func(b []byte) []byte { le.PutUint64(b[16:], 1<<63); reseal(b); return b }, testMaxSize},
		{"size over max", func(b []byte) []byte { return b }, 8191},
		{"empty tenant", func(b []byte) []byte {
			return encodeHeader(header{tenant: "", namespace: "ns", key: []byte("k"), size: 1})
		}, testMaxSize},
		{"bad tenant character", func(b []byte) []byte {
			return encodeHeader(header{tenant: "a/b", namespace: "ns", key: []byte("k"), size: 1})
		}, testMaxSize},
		{"tenant too long", func(b []byte) []byte {
			return encodeHeader(header{tenant: strings.Repeat("t", api.MaxNameBytes+1), namespace: "ns", key: []byte("k"), size: 1})
		}, testMaxSize},
		{"empty key", func(b []byte) []byte {
			return encodeHeader(header{tenant: "t", namespace: "ns", size: 1})
		}, testMaxSize},
		{"key too long", func(b []byte) []byte {
			return encodeHeader(header{tenant: "t", namespace: "ns", key: make([]byte, api.MaxKeyBytes+1), size: 1})
		}, testMaxSize},
		{"reserved bytes set", func(b []byte) []byte { b[29] = 1; reseal(b); return b }, testMaxSize},
		{"bytes after the names", func(b []byte) []byte { b[headerCRCAt-1] = 1; reseal(b); return b }, testMaxSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.corrupt(encodeHeader(valid))
			h, err := decodeHeader(b, tc.maxSize)
			if err == nil {
				t.Fatalf("decoded %+v from a corrupt header", h)
			}
			if !errors.Is(err, errHeader) {
				t.Fatalf("error %v is not errHeader", err)
			}
		})
	}
}

// FuzzDecodeHeader: decoding never panics, and a header that decodes is
// canonical: it re-encodes to the bytes it came from. Each input is also
// tried with its header CRC recomputed, so that the fuzzer reaches the
// checks behind it.
func FuzzDecodeHeader(f *testing.F) {
	f.Add(encodeHeader(header{tenant: "t", namespace: "n", key: []byte("k"), size: 1}))
	f.Add(encodeHeader(header{tenant: strings.Repeat("T", api.MaxNameBytes), namespace: strings.Repeat("n", api.MaxNameBytes),
		key: bytes.Repeat([]byte{0xff}, api.MaxKeyBytes), size: testMaxSize, crc: 1, expiresUnixNano: -1, writtenUnixNano: 1}))
	f.Add(make([]byte, headerBytes))
	f.Add([]byte("kvpblock"))
	odd := encodeHeader(header{tenant: "t", namespace: "n", key: []byte("k"), size: 1})
	odd[30] = 1
	f.Add(odd)
	f.Fuzz(func(t *testing.T, in []byte) {
		check := func(b []byte) {
			h, err := decodeHeader(b, testMaxSize)
			if err != nil {
				if !errors.Is(err, errHeader) {
					t.Fatalf("error %v is not errHeader", err)
				}
				return
			}
			if again := encodeHeader(h); !bytes.Equal(again, b[:headerBytes]) {
				t.Fatalf("header %+v decoded from bytes it does not re-encode to", h)
			}
		}
		check(in)
		if len(in) >= headerBytes {
			b := append([]byte(nil), in...)
			reseal(b)
			check(b)
		}
	})
}

func TestFileName(t *testing.T) {
	id := blockID("acme", "llama", []byte{1, 2, 3})
	got := fileName(id)
	// Files on disk are found by this name across restarts and
	// versions: it must not change.
	sum := sha256.Sum256([]byte("acme\x00llama\x00\x01\x02\x03"))
	h := hex.EncodeToString(sum[:16])
	if want := filepath.Join(h[:2], h[2:]+fileExt); got != want {
		t.Fatalf("fileName = %q, want %q", got, want)
	}
	if got != fileName(id) {
		t.Fatal("fileName is not stable")
	}
	dir, base := filepath.Split(got)
	if len(dir) != 3 || dir[2] != filepath.Separator || len(base) != 30+len(fileExt) || !strings.HasSuffix(base, fileExt) {
		t.Fatalf("fileName %q is not xx/<30 hex>%s", got, fileExt)
	}
	if _, err := hex.DecodeString(dir[:2] + strings.TrimSuffix(base, fileExt)); err != nil {
		t.Fatalf("fileName %q is not hex: %v", got, err)
	}
	// The separators keep names apart that concatenate alike.
	seen := map[string]string{}
	for _, n := range [][3]string{{"ab", "c", "k"}, {"a", "bc", "k"}, {"a", "b", "ck"}, {"a", "b", "c\x00k"}} {
		p := fileName(blockID(n[0], n[1], []byte(n[2])))
		if prev, dup := seen[p]; dup {
			t.Fatalf("%q and %q share the file %s", prev, n, p)
		}
		seen[p] = strings.Join(n[:], "|")
	}
}
