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
