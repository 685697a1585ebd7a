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

// ChecksumArrived extends crc, the CRC-32C of buf[:done], over the bytes
// that have arrived in buf since, up to filled, and returns the new CRC
// and how far it now covers. Until buf is full it stops at a multiple of
// 256 bytes from buf's start and leaves the rest for the next call: a read
// from a socket ends anywhere, and folding on from there loads every
// 64-byte line across two (512 KiB read from a loopback socket in 64 KiB
// pieces and folded after each read, on the Intel host of the README:
// 47–49 GB/s from where each read ended, 50–55 aligned). Call it after
// each read; the CRC of all of buf is ready once filled is len(buf).
func ChecksumArrived(crc uint32, buf []byte, done, filled int) (uint32, int) {
	end := filled
	if filled < len(buf) {
		end -= filled % checksumAlign
	}
	if end <= done {
		return crc, done
	}
	return crc32c.Update(crc, buf[done:end]), end
}
