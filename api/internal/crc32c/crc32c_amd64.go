package crc32c

import "golang.org/x/sys/cpu"

// castagnoliFold is in crc32c_amd64.s: mode 0 folds src only, 1 also
// copies it into dst, 2 copies with non-temporal stores. With streamLen
// > 0 the last 4·streamLen bytes of src are four streams that the CRC32
// instruction checksums beside the fold, their registers written to
// streams (see hybridFold).
//
//go:noescape
func castagnoliFold(crc uint32, dst, src []byte, k *[12]uint64, mode uint8, streamLen int, streams *[4]uint32) uint32

// hasFoldCRC reports whether this CPU runs the 512-bit folding CRC.
var hasFoldCRC = cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512DQ &&
	cpu.X86.HasAVX512VPCLMULQDQ && cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE42

// foldCRC returns the raw register after p, whose length is a positive
// multiple of 256. REQUIRES: hasFoldCRC.
func foldCRC(crc uint32, p []byte) uint32 { return hybridFold(crc, nil, p, 0) }

// foldCopyCRC copies src into dst and returns the raw register after src,
// whose length is a positive multiple of 256. REQUIRES: hasFoldCRC,
// len(dst) >= len(src).
func foldCopyCRC(crc uint32, dst, src []byte) uint32 {
	mode := uint8(1)
	if nonTemporalStores(dst, len(src)) {
		mode = 2
	}
	return hybridFold(crc, dst, src, mode)
}

// pieceShift moves a register past one of the streams of a piece of
// hybridMinBytes (64 KiB, what kvpool's receivers read at most at a
// time, so most of what they fold): four lookups where the
// multiplications took about 300 ns, a third of the fold's time for such
// a piece.
var pieceShift = newShiftTable(pieceShiftConstant())

// hybridFold folds src (a positive multiple of 256 bytes) in the given
// mode. From hybridMinBytes, about a third of it goes to the CRC32
// instruction in four streams while VPCLMULQDQ folds the rest: the two
// run on different pipes, so a pass takes the time of the fold alone
// (measured on an AMD EPYC Turin: 80 GB/s against 55 for the fold, in
// L2). The streams' registers are then moved into place by Combine's
// arithmetic.
func hybridFold(crc uint32, dst, src []byte, mode uint8) uint32 {
	if len(src) < hybridMinBytes {
		return castagnoliFold(crc, dst, src, &foldKeys, mode, 0, nil)
	}
	// 256 bytes to start the fold, then passes of 512 folded and 4×64
	// streamed; what no whole pass covers is folded after.
	passes := (len(src) - 256) / 768
	n := 256 + passes*768
	streamLen := passes * 64
	var streams [4]uint32
	crc = castagnoliFold(crc, dst, src[:n], &foldKeys, mode, streamLen, &streams)
	if passes == piecePasses {
		for _, s := range streams {
			crc = pieceShift.mul(crc) ^ s
		}
	} else {
		shift := shiftBytes(uint64(streamLen))
		for _, s := range streams {
			crc = mulModP(shift, crc) ^ s
		}
	}
	if n < len(src) {
		var rest []byte
		if mode != 0 {
			rest = dst[n:]
		}
		crc = castagnoliFold(crc, rest, src[n:], &foldKeys, mode, 0, nil)
	}
	return crc
}
