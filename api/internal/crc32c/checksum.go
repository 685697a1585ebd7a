// Package crc32c computes the CRC-32C kvpool stores with every block: by
// hash/crc32 (the CRC32 instruction) for short runs, and by folding 256
// bytes at a time with AVX-512 VPCLMULQDQ for long ones (crc32c_fold.go),
// about twice as fast, with a third of a long run handed to the CRC32
// instruction on the integer pipes beside the fold (hybridFold, about
// three times as fast); and it combines the CRCs of pieces without
// reading them again. Package api exports it as Checksum, UpdateChecksum and
// CombineChecksum.
package crc32c

import (
	"hash/crc32"
	"unsafe"
)

// castagnoli is the CRC-32C table; hash/crc32 uses the SSE4.2 / ARMv8 CRC
// instructions for it (about 27 GB/s per core on our machines).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// foldMinBytes is where the folding CRC starts to pay: below it the fixed
// cost of loading and reducing four 512-bit registers dominates.
const foldMinBytes = 1024

// Checksum returns the CRC-32C of b.
func Checksum(b []byte) uint32 { return Update(0, b) }

// Update extends crc with b, so a value can be checksummed in pieces
// as it streams: Update(Update(0, a), b) == Checksum(a‖b).
// On CPUs with AVX-512 VPCLMULQDQ, runs of 1 KiB and more are folded 256
// bytes at a time (crc32c_fold.go), about twice the speed of hash/crc32.
func Update(crc uint32, b []byte) uint32 {
	if hasFoldCRC && len(b) >= foldMinBytes {
		n := len(b) &^ 255
		crc = ^foldCRC(^crc, b[:n])
		b = b[n:]
	}
	return crc32.Update(crc, castagnoli, b)
}

// castagnoliReflected is CRC-32C's polynomial bit-reflected, as the
// register sees it.
const castagnoliReflected = 0x82F63B78

// mulModP multiplies two polynomials held bit-reflected (bit 31 is x^0)
// modulo CRC-32C's polynomial. It has no branches on the operands: a CRC
// register is random, and a loop that branched on its bits (one
// misprediction in two) took about 200 ns where this takes 30.
func mulModP(a, b uint32) uint32 {
	var p uint32
	for range 32 {
		// Add b·x^i when a's coefficient of x^i (its top bit, as a is
		// shifted up) is set, then multiply b by x modulo P.
		p ^= b & uint32(int32(a)>>31)
		a <<= 1
		b = b>>1 ^ castagnoliReflected&-(b&1)
	}
	return p
}

// x2k[k] is x^(2^k) mod P, bit-reflected.
var x2k = func() (t [32]uint32) {
	t[0] = 1 << 30 // x^1
	for k := 1; k < 32; k++ {
		t[k] = mulModP(t[k-1], t[k-1])
	}
	return t
}()

// shiftBytes returns x^(8·n) mod P, bit-reflected: what multiplies a
// CRC register to move it past n bytes of zeros. It walks the bits of n,
// square-and-multiply, starting at x^(2^3) for bytes.
func shiftBytes(n uint64) uint32 {
	p := uint32(1) << 31
	for k := 3; n != 0; n, k = n>>1, k+1 {
		if n&1 != 0 {
			p = mulModP(x2k[k&31], p)
		}
	}
	return p
}

// shiftTable multiplies by one constant modulo P with four lookups: the
// product is linear in the register, so each byte of it indexes the
// products of its 256 values.
type shiftTable [4][256]uint32

// newShiftTable returns the table that multiplies by k.
func newShiftTable(k uint32) *shiftTable {
	t := new(shiftTable)
	for i := range t {
		for v := 1; v < 256; v++ {
			low := v & -v // v's lowest set bit
			if v == low {
				t[i][v] = mulModP(k, uint32(v)<<(8*i))
			} else {
				t[i][v] = t[i][v^low] ^ t[i][low]
			}
		}
	}
	return t
}

// pieceShiftConstant is x^(8·streamLen) for the streams hybridFold hands
// the CRC32 instruction in a piece of hybridMinBytes.
func pieceShiftConstant() uint32 {
	return shiftBytes(piecePasses * 64)
}

// mul returns v times the table's constant, modulo P.
func (t *shiftTable) mul(v uint32) uint32 {
	return t[0][v&0xff] ^ t[1][v>>8&0xff] ^ t[2][v>>16&0xff] ^ t[3][v>>24]
}

// Combine returns the CRC-32C of a‖b from the CRC of a, the CRC of
// b and b's length: pieces of a value checksummed as they arrive, in any
// order, combine into the value's checksum without reading it again.
func Combine(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA
	}
	// Move crcA past lenB bytes, then add b's.
	return mulModP(shiftBytes(uint64(lenB)), crcA) ^ crcB
}

// nonTemporalMinBytes is the copy size from which stores go around the
// caches, as runtime·memmove's do from 1 MiB: a block that large is not
// read back soon by the core that writes it (a Put's destination is the
// arena, read later by a Get on another core or by a NIC), and writing it
// through the caches would first read every line of the destination for
// ownership, out of memory that is cold.
const nonTemporalMinBytes = 1 << 20

// nonTemporalStores reports whether a copy of n bytes into dst should use
// non-temporal stores, which require dst 64-byte aligned.
func nonTemporalStores(dst []byte, n int) bool {
	return n >= nonTemporalMinBytes && uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%64 == 0
}

// Copy copies src into dst, which must be at least as long, and returns
// Update(crc, src): one pass over the bytes instead of two, so the
// checksum costs no extra read of src and no second core. Where the CPU
// has the folding CRC, it is computed from the registers the copy loads,
// and large copies store around the caches as copy does; elsewhere it is
// copy then Update.
func Copy(crc uint32, dst, src []byte) uint32 {
	if len(dst) < len(src) {
		panic("crc32c: Copy into a shorter slice")
	}
	if hasFoldCRC && len(src) >= foldMinBytes {
		n := len(src) &^ 255
		crc = ^foldCopyCRC(^crc, dst, src[:n])
		dst, src = dst[n:], src[n:]
	}
	copy(dst, src)
	return crc32.Update(crc, castagnoli, src)
}
