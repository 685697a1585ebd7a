package api

import "hash/crc32"

// castagnoli is the CRC-32C table; hash/crc32 uses the SSE4.2 / ARMv8 CRC
// instructions for it (about 27 GB/s per core on our machines).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// foldMinBytes is where the folding CRC starts to pay: below it the fixed
// cost of loading and reducing four 512-bit registers dominates.
const foldMinBytes = 1024

// Checksum returns the CRC-32C of b: the checksum kvpool stores with every
// block and verifies wherever bytes cross a process boundary.
func Checksum(b []byte) uint32 { return UpdateChecksum(0, b) }

// UpdateChecksum extends crc with b, so a value can be checksummed in pieces
// as it streams: UpdateChecksum(UpdateChecksum(0, a), b) == Checksum(a‖b).
// On CPUs with AVX-512 VPCLMULQDQ, runs of 1 KiB and more are folded 256
// bytes at a time (crc32c_fold.go), about twice the speed of hash/crc32.
func UpdateChecksum(crc uint32, b []byte) uint32 {
	if hasFoldCRC && len(b) >= foldMinBytes {
		n := len(b) &^ 255
		crc = ^foldCRC(^crc, b[:n])
		b = b[n:]
	}
	return crc32.Update(crc, castagnoli, b)
}
