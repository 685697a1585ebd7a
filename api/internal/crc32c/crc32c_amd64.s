#include "textflag.h"

// func castagnoliFold(crc uint32, dst, src []byte, k *[12]uint64, mode uint8) uint32
//
// Folds src into the CRC register crc (raw, not inverted) 256 bytes at a
// time and returns the register after it; len(src) is a positive multiple
// of 256. mode 0 only reads src (dst is not touched); mode 1 also copies it
// into dst, which is at least as long, storing each 256 bytes from the
// registers the fold loads; mode 2 copies with non-temporal stores
// (VMOVNTDQ, around the caches, as runtime·memmove does for large copies),
// which require dst 64-byte aligned. Requires AVX512F, AVX512VL, AVX512DQ,
// VPCLMULQDQ and SSE4.2. The steps mirror castagnoliFoldModel in
// crc32c_fold.go.
TEXT ·castagnoliFold(SB), NOSPLIT, $0-76
	MOVL    crc+0(FP), AX
	MOVQ    dst_base+8(FP), DI
	MOVQ    src_base+32(FP), SI
	MOVQ    src_len+40(FP), CX
	MOVQ    k+56(FP), DX
	MOVBLZX mode+64(FP), R9

	// Sixteen 128-bit lanes hold the first 256 bytes (stored as read when
	// copying); the initial register is XORed into the first four bytes.
	VMOVDQU64 (SI), Z0
	VMOVDQU64 64(SI), Z1
	VMOVDQU64 128(SI), Z2
	VMOVDQU64 192(SI), Z3
	TESTQ     R9, R9
	JZ        first
	VMOVDQU64 Z0, (DI)
	VMOVDQU64 Z1, 64(DI)
	VMOVDQU64 Z2, 128(DI)
	VMOVDQU64 Z3, 192(DI)
	ADDQ      $256, DI

first:
	VMOVD  AX, X4
	VPXORQ Z4, Z0, Z0
	ADDQ   $256, SI
	SUBQ   $256, CX

	// Fold every lane forward 2048 bits onto the next 256 bytes.
	VBROADCASTI32X4 (DX), Z5
	CMPQ R9, $1
	JB   sumloop
	JE   copyloop
	JMP  ntloop

sumloop:
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
	JMP        sumloop

copyloop:
	CMPQ CX, $256
	JB   reduce
	VMOVDQU64 (SI), Z10
	VMOVDQU64 64(SI), Z11
	VMOVDQU64 128(SI), Z12
	VMOVDQU64 192(SI), Z13
	VMOVDQU64 Z10, (DI)
	VMOVDQU64 Z11, 64(DI)
	VMOVDQU64 Z12, 128(DI)
	VMOVDQU64 Z13, 192(DI)
	VPCLMULQDQ $0x00, Z5, Z0, Z6
	VPCLMULQDQ $0x11, Z5, Z0, Z0
	VPTERNLOGD $0x96, Z10, Z6, Z0
	VPCLMULQDQ $0x00, Z5, Z1, Z7
	VPCLMULQDQ $0x11, Z5, Z1, Z1
	VPTERNLOGD $0x96, Z11, Z7, Z1
	VPCLMULQDQ $0x00, Z5, Z2, Z8
	VPCLMULQDQ $0x11, Z5, Z2, Z2
	VPTERNLOGD $0x96, Z12, Z8, Z2
	VPCLMULQDQ $0x00, Z5, Z3, Z9
	VPCLMULQDQ $0x11, Z5, Z3, Z3
	VPTERNLOGD $0x96, Z13, Z9, Z3
	ADDQ       $256, SI
	ADDQ       $256, DI
	SUBQ       $256, CX
	JMP        copyloop

ntloop:
	CMPQ CX, $256
	JB   ntdone
	VMOVDQU64 (SI), Z10
	VMOVDQU64 64(SI), Z11
	VMOVDQU64 128(SI), Z12
	VMOVDQU64 192(SI), Z13
	VMOVNTDQ  Z10, (DI)
	VMOVNTDQ  Z11, 64(DI)
	VMOVNTDQ  Z12, 128(DI)
	VMOVNTDQ  Z13, 192(DI)
	VPCLMULQDQ $0x00, Z5, Z0, Z6
	VPCLMULQDQ $0x11, Z5, Z0, Z0
	VPTERNLOGD $0x96, Z10, Z6, Z0
	VPCLMULQDQ $0x00, Z5, Z1, Z7
	VPCLMULQDQ $0x11, Z5, Z1, Z1
	VPTERNLOGD $0x96, Z11, Z7, Z1
	VPCLMULQDQ $0x00, Z5, Z2, Z8
	VPCLMULQDQ $0x11, Z5, Z2, Z2
	VPTERNLOGD $0x96, Z12, Z8, Z2
	VPCLMULQDQ $0x00, Z5, Z3, Z9
	VPCLMULQDQ $0x11, Z5, Z3, Z3
	VPTERNLOGD $0x96, Z13, Z9, Z3
	ADDQ       $256, SI
	ADDQ       $256, DI
	SUBQ       $256, CX
	JMP        ntloop

ntdone:
	// Non-temporal stores are weakly ordered: fence them before the
	// caller publishes the bytes.
	SFENCE

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
	MOVL   R8, ret+72(FP)
	VZEROUPPER
	RET

// func castagnoliCopyVPCLMUL(crc uint32, dst, src []byte, k *[12]uint64, nonTemporal bool) uint32
//
// Copies src into dst and folds it into crc as castagnoliVPCLMUL does, in
// one pass: each 256 bytes are loaded once, stored, and folded from the
// registers. len(src) is a positive multiple of 256 and len(dst) is at
// least as long. nonTemporal stores with VMOVNTDQ, which writes around the
// caches (as runtime·memmove does for large copies) and requires dst
// 64-byte aligned. Same CPU requirements as castagnoliVPCLMUL.
