package crc32c

import (
	"hash/crc32"
	"math/bits"
)

// CRC-32C by carry-less multiplication ("folding"), after Gopal et al.,
// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ" (Intel,
// 2009), widened to 512-bit registers. hash/crc32 computes CRC-32C with the
// SSE4.2 CRC32 instruction at about 27 GB/s per core here; folding with
// AVX-512 VPCLMULQDQ runs about twice as fast, and the checksum is on the
// data path of every Put and Get.
//
// The math, in the bit-reflected order CRC-32C uses: a 16-byte block X of
// the message, read as two little-endian words (q0, q1), is the polynomial
// H·x^64 + L with H from q0 and L from q1 (bit i of a word is the
// coefficient of x^(63-i)). Moving X forward by D bits, over the bytes that
// follow it, leaves the CRC unchanged if X is replaced by any F ≡ X·x^D
// (mod P), and
//
//	X·x^D ≡ H·(x^(64+D) mod P) + L·(x^D mod P)
//
// is two 64×32-bit carry-less products, each under 96 bits. PCLMULQDQ on
// reflected operands yields the product times x, so the constants are
// x^(64+D-1) mod P and x^(D-1) mod P, reflected into 64-bit words. Sixteen
// such blocks (four 512-bit registers) are folded 256 bytes at a time; at
// the end they are folded into one block R, and CRC(0, R) — two CRC32
// instructions — is the CRC of everything. The initial register is XORed
// into the first four bytes, since CRC(c, M) = CRC(0, M ⊕ c) for |M| ≥ 4.

// hybridMinBytes is where hybridFold starts to hand streams to the CRC32
// instruction: moving their registers into place takes about 150 ns (ten
// or so multiplications modulo P), which the streams earn back from about
// 32 KiB (measured: 32 KiB 0.95 of the fold's time, 64 KiB 0.85).
const hybridMinBytes = 64 << 10

// piecePasses is hybridFold's passes over a piece of hybridMinBytes: 256
// bytes start the fold, then each pass folds 512 and streams 4×64.
const piecePasses = (hybridMinBytes - 256) / 768

// castagnoliPoly is CRC-32C's polynomial in normal bit order, x^32 implied.
const castagnoliPoly = 0x1EDC6F41

// xPowModP returns x^n mod P, bit j the coefficient of x^j.
func xPowModP(n int) uint32 {
	v := uint64(1)
	for range n {
		v <<= 1
		if v&(1<<32) != 0 {
			v ^= 1<<32 | castagnoliPoly
		}
	}
	return uint32(v)
}

// reflect64 places the coefficient of x^j of a 32-bit polynomial at bit
// 63-j of a word, the order the folding loop multiplies in.
func reflect64(v uint32) uint64 { return uint64(bits.Reverse32(v)) << 32 }

// foldConstants returns the pair (for q0, for q1) that moves a block
// forward by d bits.
func foldConstants(d int) [2]uint64 {
	return [2]uint64{reflect64(xPowModP(64 + d - 1)), reflect64(xPowModP(d - 1))}
}

// foldKeys is what the assembly reads: the constants for 2048 bits (the
// main loop), 512 bits (one register into the next), and per lane of the
// last register 384, 256 and 128 bits, then zeros for the last lane.
var foldKeys = func() (k [12]uint64) {
	for i, d := range []int{2048, 512, 384, 256, 128} {
		c := foldConstants(d)
		k[2*i], k[2*i+1] = c[0], c[1]
	}
	return k
}()

// clmul64 is a carry-less 64×64 multiply: the reference the assembly's
// VPCLMULQDQ is checked against.
func clmul64(a, b uint64) (lo, hi uint64) {
	for i := range 64 {
		if b&(1<<i) != 0 {
			lo ^= a << i
			if i > 0 {
				hi ^= a >> (64 - i)
			}
		}
	}
	return lo, hi
}

type block128 struct{ q0, q1 uint64 }

func fold(x block128, k0, k1 uint64) block128 {
	l0, h0 := clmul64(x.q0, k0)
	l1, h1 := clmul64(x.q1, k1)
	return block128{l0 ^ l1, h0 ^ h1}
}

// castagnoliFoldModel is the folding algorithm in plain Go, step for step
// what the assembly does, on a raw (non-inverted) register. len(p) must be
// a positive multiple of 256. Tests check it against hash/crc32, and the
// assembly against it.
func castagnoliFoldModel(crc uint32, p []byte) uint32 {
	load := func(b []byte) block128 {
		return block128{leUint64(b), leUint64(b[8:])}
	}
	var lanes [16]block128
	for i := range lanes {
		lanes[i] = load(p[16*i:])
	}
	lanes[0].q0 ^= uint64(crc)
	for off := 256; off < len(p); off += 256 {
		for i := range lanes {
			n := load(p[off+16*i:])
			f := fold(lanes[i], foldKeys[0], foldKeys[1])
			lanes[i] = block128{f.q0 ^ n.q0, f.q1 ^ n.q1}
		}
	}
	// Fold register 0 into 1, 1 into 2, 2 into 3 (512 bits each).
	for r := 0; r < 3; r++ {
		for l := range 4 {
			f := fold(lanes[4*r+l], foldKeys[2], foldKeys[3])
			n := lanes[4*(r+1)+l]
			lanes[4*(r+1)+l] = block128{f.q0 ^ n.q0, f.q1 ^ n.q1}
		}
	}
	// Fold the last register's lanes into its last lane.
	r := lanes[15]
	for l := range 3 {
		f := fold(lanes[12+l], foldKeys[4+2*l], foldKeys[5+2*l])
		r = block128{r.q0 ^ f.q0, r.q1 ^ f.q1}
	}
	var b [16]byte
	putLEUint64(b[:], r.q0)
	putLEUint64(b[8:], r.q1)
	return ^crc32.Update(^uint32(0), castagnoli, b[:])
}

func leUint64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

func putLEUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}
