package crc32c

import "golang.org/x/sys/cpu"

// castagnoliVPCLMUL is in crc32c_amd64.s.
//
//go:noescape
func castagnoliVPCLMUL(crc uint32, p []byte, k *[12]uint64) uint32

// hasFoldCRC reports whether this CPU runs the 512-bit folding CRC.
var hasFoldCRC = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512DQ &&
	cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// foldCRC returns the raw register after p, whose length is a positive
// multiple of 256. REQUIRES: hasFoldCRC.
func foldCRC(crc uint32, p []byte) uint32 { return castagnoliVPCLMUL(crc, p, &foldKeys) }

// castagnoliCopyVPCLMUL is in crc32c_amd64.s.
//
//go:noescape
func castagnoliCopyVPCLMUL(crc uint32, dst, src []byte, k *[12]uint64, nonTemporal bool) uint32

// foldCopyCRC copies src into dst and returns the raw register after src,
// whose length is a positive multiple of 256. REQUIRES: hasFoldCRC,
// len(dst) >= len(src).
func foldCopyCRC(crc uint32, dst, src []byte) uint32 {
	return castagnoliCopyVPCLMUL(crc, dst, src, &foldKeys, nonTemporalStores(dst, len(src)))
}
