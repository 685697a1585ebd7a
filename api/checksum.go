package api

import "github.com/kvpool/kvpool/api/internal/crc32c"

// Checksum returns the CRC-32C of b: the checksum kvpool stores with every
// block and verifies wherever bytes cross a process boundary.
func Checksum(b []byte) uint32 { return crc32c.Checksum(b) }

// UpdateChecksum extends crc with b, so a value can be checksummed in pieces
// as it streams: UpdateChecksum(UpdateChecksum(0, a), b) == Checksum(a‖b).
// On CPUs with AVX-512 VPCLMULQDQ, runs of 1 KiB and more are folded 256
// bytes at a time, about twice the speed of hash/crc32.
func UpdateChecksum(crc uint32, b []byte) uint32 { return crc32c.Update(crc, b) }

// CombineChecksum returns the CRC-32C of a‖b from the CRC of a, the CRC of
// b and b's length: pieces of a value checksummed as they arrive, in any
// order, combine into the value's checksum without reading it again.
func CombineChecksum(crcA, crcB uint32, lenB int64) uint32 { return crc32c.Combine(crcA, crcB, lenB) }

// checksumAlign is the boundary ChecksumArrived folds up to: the fold's
// 256-byte step, which is also a multiple of the cache line.
const checksumAlign = 256

// ChecksumArrived is called after each read into buf, which filled it
// from before to filled bytes; crc is what the previous call returned (0
// before the first). It returns the CRC-32C of buf[:checksummed(filled)]:
// all of buf once it is full, until then up to a multiple of 256 bytes
// from its start, the rest left for the next call. A read from a socket
// ends anywhere, and folding on from there loads every 64-byte line
// across two (512 KiB read from a loopback socket in 64 KiB pieces and
// folded after each read, on the Intel host of the README: 47–49 GB/s
// from where each read ended, 50–55 aligned).
func ChecksumArrived(crc uint32, buf []byte, before, filled int) uint32 {
	if from, to := checksummed(buf, before), checksummed(buf, filled); to > from {
		crc = crc32c.Update(crc, buf[from:to])
	}
	return crc
}

// checksummed is how much of buf, filled to n bytes, ChecksumArrived has
// folded.
func checksummed(buf []byte, n int) int {
	if n == len(buf) {
		return n
	}
	return n - n%checksumAlign
}
