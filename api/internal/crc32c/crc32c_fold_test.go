package crc32c

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
	"unsafe"
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

// TestHybridFold checks the fold that hands streams to the CRC32
// instruction, in each mode, for lengths at and around where whole passes
// end (a pass folds 512 bytes and streams 4×64), against hash/crc32, and
// that a copy writes exactly the source's bytes.
func TestHybridFold(t *testing.T) {
	if !hasFoldCRC {
		t.Skip("no AVX-512 VPCLMULQDQ here")
	}
	rng := rand.New(rand.NewPCG(4, 4))
	src := make([]byte, hybridMinBytes+8*768+1024)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	var lengths []int
	for n := hybridMinBytes - 512; n <= len(src); n += 256 {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 2<<20, 2<<20+256, 16<<20)
	for _, n := range lengths {
		p := src
		if n > len(src) {
			p = make([]byte, n)
			for i := range p {
				p[i] = byte(rng.Uint32())
			}
		}
		p = p[:n]
		for mode := range uint8(3) {
			const init = 0x9abcdef0
			backing := make([]byte, n+128)
			base := 64 - int(uintptr(unsafe.Pointer(&backing[0]))%64)
			dst := backing[base : base+n+64]
			for i := range dst {
				dst[i] = 0x55
			}
			var into []byte
			if mode != 0 {
				into = dst
			}
			got := ^hybridFold(^uint32(init), into, p, mode)
			if want := crc32.Update(init, castagnoli, p); got != want {
				t.Fatalf("len %d mode %d: %08x, stdlib %08x", n, mode, got, want)
			}
			switch {
			case mode != 0 && !bytes.Equal(dst[:n], p):
				t.Fatalf("len %d mode %d: bytes differ", n, mode)
			case mode == 0 && dst[0] != 0x55:
				t.Fatalf("len %d: a checksum wrote into dst", n)
			}
			for i, b := range dst[n:] {
				if b != 0x55 {
					t.Fatalf("len %d mode %d: wrote past the copy at +%d", n, mode, i)
				}
			}
		}
	}
}

func FuzzChecksum(f *testing.F) {
	f.Add(uint32(0), make([]byte, 1024))
	f.Add(uint32(7), make([]byte, 4000))
	f.Add(uint32(3), make([]byte, hybridMinBytes+1000)) // streams beside the fold
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

// TestMulModP checks the branch-free multiplication against a
// polynomial's defining identities, and the lookup tables against it.
func TestMulModP(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	const one = 1 << 31 // x^0, bit-reflected
	for range 1000 {
		a, b, c := rng.Uint32(), rng.Uint32(), rng.Uint32()
		if got := mulModP(one, a); got != a {
			t.Fatalf("1·%08x = %08x", a, got)
		}
		if mulModP(a, b) != mulModP(b, a) {
			t.Fatalf("%08x·%08x does not commute", a, b)
		}
		if mulModP(a, b^c) != mulModP(a, b)^mulModP(a, c) {
			t.Fatalf("%08x·(%08x+%08x) does not distribute", a, b, c)
		}
		if mulModP(a, mulModP(b, c)) != mulModP(mulModP(a, b), c) {
			t.Fatalf("(%08x·%08x)·%08x does not associate", a, b, c)
		}
		// x·a: a shifted one place toward x^31, reduced by P.
		if got, want := mulModP(one>>1, a), a>>1^castagnoliReflected*(a&1); got != want {
			t.Fatalf("x·%08x = %08x, want %08x", a, got, want)
		}
	}
	for _, k := range []uint32{one, shiftBytes(64), pieceShiftConstant(), rng.Uint32()} {
		table := newShiftTable(k)
		for range 1000 {
			if v := rng.Uint32(); table.mul(v) != mulModP(k, v) {
				t.Fatalf("table of %08x: %08x·%08x = %08x, want %08x", k, k, v, table.mul(v), mulModP(k, v))
			}
		}
	}
}

// BenchmarkPieceFold is the fold of what a receiver reads at a time, from
// a random register.
func BenchmarkPieceFold(b *testing.B) {
	if !hasFoldCRC {
		b.Skip("no AVX-512 VPCLMULQDQ here")
	}
	p := make([]byte, hybridMinBytes)
	b.SetBytes(int64(len(p)))
	crc := uint32(0x12345678)
	for b.Loop() {
		crc = hybridFold(crc*2654435761, nil, p, 0)
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

// TestCopy checks Copy's bytes and checksum against copy and Update, for
// lengths around every boundary (256-byte folds, the folding threshold,
// non-temporal stores) and for destinations and sources at every
// alignment that matters to the stores.
func TestCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 3))
	src := make([]byte, nonTemporalMinBytes+4096)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	lengths := []int{0, 1, 255, 256, 1023, foldMinBytes, foldMinBytes + 1, 4096 + 255, nonTemporalMinBytes - 1, nonTemporalMinBytes, nonTemporalMinBytes + 257}
	for _, n := range lengths {
		for _, dstOff := range []int{0, 1, 64} {
			for _, srcOff := range []int{0, 3} {
				s := src[srcOff : srcOff+min(n, len(src)-srcOff)]
				backing := make([]byte, len(s)+128+dstOff)
				base := 64 - int(uintptr(unsafe.Pointer(&backing[0]))%64)
				dst := backing[base+dstOff : base+dstOff+len(s)+16]
				for i := range dst {
					dst[i] = 0xAA
				}
				const init = 0x12345678
				got := Copy(init, dst, s)
				if want := crc32.Update(init, castagnoli, s); got != want {
					t.Fatalf("len %d dst+%d src+%d: crc %08x, want %08x", len(s), dstOff, srcOff, got, want)
				}
				if !bytes.Equal(dst[:len(s)], s) {
					t.Fatalf("len %d dst+%d src+%d: bytes differ", len(s), dstOff, srcOff)
				}
				for i, b := range dst[len(s):] {
					if b != 0xAA {
						t.Fatalf("len %d dst+%d src+%d: wrote past the copy at +%d", len(s), dstOff, srcOff, i)
					}
				}
			}
		}
	}
}

func FuzzCopy(f *testing.F) {
	f.Add(uint32(0), make([]byte, 1024), uint8(0))
	f.Add(uint32(9), make([]byte, 5000), uint8(7))
	f.Add(uint32(5), make([]byte, hybridMinBytes+3000), uint8(64))
	f.Fuzz(func(t *testing.T, init uint32, p []byte, off uint8) {
		dst := make([]byte, len(p)+int(off))[off:]
		if got, want := Copy(init, dst, p), crc32.Update(init, castagnoli, p); got != want {
			t.Fatalf("len %d: %08x, stdlib %08x", len(p), got, want)
		}
		if !bytes.Equal(dst, p) {
			t.Fatalf("len %d: bytes differ", len(p))
		}
	})
}

// BenchmarkCopy compares, for a block written into a region much larger
// than the caches (as a Put writes the arena), copy alone, copy then
// Checksum, and Copy.
func BenchmarkCopy(b *testing.B) {
	const region = 1 << 30
	mem := make([]byte, region)
	for i := 0; i < region; i += 4096 {
		mem[i] = 1
	}
	for _, n := range []int{256 << 10, 2 << 20, 16 << 20} {
		src := make([]byte, n)
		frames := region / n
		rng := rand.New(rand.NewPCG(1, 1))
		frame := func() []byte { off := rng.IntN(frames) * n; return mem[off : off+n] }
		b.Run("copy/"+sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(frame(), src)
			}
		})
		b.Run("copy+checksum/"+sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(frame(), src)
				Checksum(src)
			}
		})
		b.Run("Copy/"+sizeName(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				Copy(0, frame(), src)
			}
		})
		if hasFoldCRC {
			// The fold alone, without the CRC32 instruction's streams
			// beside it: what Copy ran before hybridFold.
			b.Run("Copy-fold-only/"+sizeName(n), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					dst := frame()
					mode := uint8(1)
					if nonTemporalStores(dst, n) {
						mode = 2
					}
					castagnoliFold(0, dst, src, &foldKeys, mode, 0, nil)
				}
			})
		}
	}
}

// spanBlockBytes and spanFrames are the block and the number of frames
// the benchmarks of a put's span copy into in turn.
const spanBlockBytes, spanFrames = 2 << 20, 34

// spanMemory returns the frames, every page touched, and a source block.
func spanMemory() (mem, src []byte) {
	mem = make([]byte, spanBlockBytes*spanFrames)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	return mem, make([]byte, spanBlockBytes)
}

// spanCopies are the copies those benchmarks compare: Go's and Copy.
var spanCopies = []struct {
	name string
	copy func(dst, src []byte)
}{
	{"copy", func(dst, src []byte) { copy(dst, src) }},
	{"Copy", func(dst, src []byte) { Copy(0, dst, src) }},
}

// BenchmarkCopyAfterPause measures Copy of 2 MiB blocks into 34 frames in
// turn (a put's span), each copy after a pause in which the thread spins
// without touching memory, as a client waits for its commit's answer. It
// reports the copies' own rate (copy-GB/s), pauses left out. On the
// paravirtualized AMD EPYC host of 2026-12-06 a copy after a pause of
// 30 µs or more ran at 0.6-0.75 of back-to-back copies: the memory system
// slows down when it is left idle, so a put that waits on a slow answer
// pays again in its next copy.
//
//	go test -run '^$' -bench CopyAfterPause ./api/internal/crc32c
func BenchmarkCopyAfterPause(b *testing.B) {
	const n, frames = spanBlockBytes, spanFrames
	mem, src := spanMemory()
	for _, fn := range spanCopies {
		for _, pause := range []time.Duration{0, 10 * time.Microsecond, 30 * time.Microsecond, 70 * time.Microsecond} {
			b.Run(fn.name+"/pause="+pause.String(), func(b *testing.B) {
				var copying time.Duration
				i := 0
				for b.Loop() {
					for start := time.Now(); time.Since(start) < pause; {
					}
					off := i % frames * n
					i++
					t0 := time.Now()
					fn.copy(mem[off:off+n], src)
					copying += time.Since(t0)
				}
				b.ReportMetric(float64(n)*float64(b.N)/copying.Seconds()/1e9, "copy-GB/s")
			})
		}
	}
}
