package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"strconv"
	"testing"
)

func TestFoldModelMatchesStdlib(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, n := range []int{256, 512, 768, 4096, 1 << 16} {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		for _, init := range []uint32{0, 0xffffffff, 0x12345678} {
			want := crc32.Update(init, castagnoli, p)
			// The model works on the raw register: hash/crc32 inverts on
			// entry and exit.
			got := ^castagnoliFoldModel(^init, p)
			if got != want {
				t.Fatalf("n=%d init=%08x: model %08x, stdlib %08x", n, init, got, want)
			}
		}
	}
}

func TestChecksumMatchesStdlib(t *testing.T) {
	if !hasFoldCRC {
		t.Log("no AVX-512 VPCLMULQDQ here: only the stdlib path runs")
	}
	rng := rand.New(rand.NewPCG(2, 2))
	buf := make([]byte, 1<<20+300)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for _, n := range []int{0, 1, 255, 256, 1023, 1024, 1025, 1280, 4096, 65536 + 17, 1 << 20, len(buf)} {
		for _, off := range []int{0, 1, 7, 13} {
			if off+n > len(buf) {
				continue
			}
			p := buf[off : off+n]
			for _, init := range []uint32{0, 0xdeadbeef} {
				if got, want := Update(init, p), crc32.Update(init, castagnoli, p); got != want {
					t.Fatalf("n=%d off=%d init=%08x: %08x, stdlib %08x", n, off, init, got, want)
				}
			}
		}
	}
}

func FuzzChecksum(f *testing.F) {
	f.Add(uint32(0), make([]byte, 1024))
	f.Add(uint32(7), make([]byte, 4000))
	f.Fuzz(func(t *testing.T, init uint32, p []byte) {
		if got, want := Update(init, p), crc32.Update(init, castagnoli, p); got != want {
			t.Fatalf("len %d: %08x, stdlib %08x", len(p), got, want)
		}
	})
}

func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{4 << 10, 256 << 10, 2 << 20} {
		p := make([]byte, n)
		b.Run("kvpool/"+sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				Checksum(p)
			}
		})
		b.Run("stdlib/"+sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32.Checksum(p, castagnoli)
			}
		})
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return strconv.Itoa(n>>20) + "MiB"
	}
	return strconv.Itoa(n>>10) + "KiB"
}

func TestCombineChecksum(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	p := make([]byte, 3<<20)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	for _, cut := range [][]int{{0}, {1}, {4096}, {1 << 20, 2 << 20}, {7, 100, 65536, 1<<20 + 3}} {
		var crc uint32
		prev := 0
		for _, c := range append(cut, len(p)) {
			crc = Combine(crc, Checksum(p[prev:c]), int64(c-prev))
			prev = c
		}
		if want := Checksum(p); crc != want {
			t.Fatalf("cuts %v: combined %08x, want %08x", cut, crc, want)
		}
	}
	if got := Combine(Checksum([]byte("abc")), Checksum(nil), 0); got != Checksum([]byte("abc")) {
		t.Fatal("combining an empty piece changed the checksum")
	}
}

func FuzzCombineChecksum(f *testing.F) {
	f.Add([]byte("hello, "), []byte("world"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if got, want := Combine(Checksum(a), Checksum(b), int64(len(b))), Checksum(append(append([]byte{}, a...), b...)); got != want {
			t.Fatalf("combine(%q, %q) = %08x, want %08x", a, b, got, want)
		}
	})
}
