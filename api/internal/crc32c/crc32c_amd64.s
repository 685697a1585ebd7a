#include "textflag.h"

// func castagnoliVPCLMUL(crc uint32, p []byte, k *[12]uint64) uint32
//
// crc is the raw (non-inverted) register; len(p) is a positive multiple of
// 256. Requires AVX512F, AVX512VL, AVX512DQ, VPCLMULQDQ and SSE4.2. The
// steps mirror castagnoliFoldModel in crc32c_fold.go.
TEXT ·castagnoliVPCLMUL(SB), NOSPLIT, $0-44
	MOVL crc+0(FP), AX
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX
	MOVQ k+32(FP), DX

	// Sixteen 128-bit lanes hold the first 256 bytes; the initial register
	// is XORed into the first four bytes.
	VMOVDQU64 (SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	VMOVD     AX, X4
	VPXORQ    Z4, Z0, Z0
	ADDQ      $256, SI
	SUBQ      $256, CX

	// Fold every lane forward 2048 bits onto the next 256 bytes.
	VBROADCASTI32X4 (DX), Z5

loop:
	CMPQ CX, $256
	JB   reduce
	VPCLMULQDQ $0x00, Z5, Z0, Z6
	VPCLMULQDQ $0x11, Z5, Z0, Z0
	VPTERNLOGD $0x96, (SI), Z6, Z0
	VPCLMULQDQ $0x00, Z5, Z1, Z7
	VPCLMULQDQ $0x11, Z5, Z1, Z1
	VPTERNLOGD $0x96, 64(SI), Z7, Z1
	VPCLMULQDQ $0x00, Z5, Z2, Z8
	VPCLMULQDQ $0x11, Z5, Z2, Z2
	VPTERNLOGD $0x96, 128(SI), Z8, Z2
	VPCLMULQDQ $0x00, Z5, Z3, Z9
	VPCLMULQDQ $0x11, Z5, Z3, Z3
	VPTERNLOGD $0x96, 192(SI), Z9, Z3
	ADDQ       $256, SI
	SUBQ       $256, CX
	JMP        loop

reduce:
	// Fold register 0 into 1, 1 into 2, 2 into 3: 512 bits each.
	VBROADCASTI32X4 16(DX), Z5
	VPCLMULQDQ      $0x00, Z5, Z0, Z6
	VPCLMULQDQ      $0x11, Z5, Z0, Z0
	VPTERNLOGD      $0x96, Z1, Z6, Z0
	VPCLMULQDQ      $0x00, Z5, Z0, Z6
	VPCLMULQDQ      $0x11, Z5, Z0, Z0
	VPTERNLOGD      $0x96, Z2, Z6, Z0
	VPCLMULQDQ      $0x00, Z5, Z0, Z6
	VPCLMULQDQ      $0x11, Z5, Z0, Z0
	VPTERNLOGD      $0x96, Z3, Z6, Z0

	// Fold lanes 0..2 forward 384, 256 and 128 bits (lane 3's constants
	// are zero), then XOR all four products with lane 3 itself.
	VMOVDQU64      32(DX), Z5
	VPCLMULQDQ     $0x00, Z5, Z0, Z6
	VPCLMULQDQ     $0x11, Z5, Z0, Z7
	VPXORQ         Z7, Z6, Z6
	VEXTRACTI64X2  $3, Z0, X8
	VEXTRACTI64X4  $1, Z6, Y9
	VPXORQ         Y9, Y6, Y6
	VEXTRACTI128   $1, Y6, X9
	VPXOR          X9, X6, X6
	VPXOR          X8, X6, X6

	// CRC(0, R) with the CRC32 instruction.
	MOVQ   X6, AX
	VPEXTRQ $1, X6, BX
	XORL   R8, R8
	CRC32Q AX, R8
	CRC32Q BX, R8
	MOVL   R8, ret+40(FP)
	VZEROUPPER
	RET
