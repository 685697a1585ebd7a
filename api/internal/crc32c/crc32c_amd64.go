package crc32c

import "golang.org/x/sys/cpu"

// castagnoliFold is in crc32c_amd64.s: mode 0 folds src only, 1 also
// copies it into dst, 2 copies with non-temporal stores.
//
//go:noescape
func castagnoliFold(crc uint32, dst, src []byte, k *[12]uint64, mode uint8) uint32

// hasFoldCRC reports whether this CPU runs the 512-bit folding CRC.
var hasFoldCRC = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512DQ &&
	cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// foldCRC returns the raw register after p, whose length is a positive
// multiple of 256. REQUIRES: hasFoldCRC.
func foldCRC(crc uint32, p []byte) uint32 { return castagnoliFold(crc, nil, p, &foldKeys, 0) }

// foldCopyCRC copies src into dst and returns the raw register after src,
// whose length is a positive multiple of 256. REQUIRES: hasFoldCRC,
// len(dst) >= len(src).
func foldCopyCRC(crc uint32, dst, src []byte) uint32 {
	mode := uint8(1)
	if nonTemporalStores(dst, len(src)) {
		mode = 2
	}
	return castagnoliFold(crc, dst, src, &foldKeys, mode)
}
