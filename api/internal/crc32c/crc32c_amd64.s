#include "textflag.h"

// func castagnoliFold(crc uint32, dst, src []byte, k *[12]uint64, mode uint8, streamLen int, streams *[4]uint32) uint32
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
//
// With streamLen > 0 (a positive multiple of 64) the last 4·streamLen
// bytes of src are four streams of streamLen bytes that the CRC32
// instruction checksums on the integer pipes while VPCLMULQDQ folds the
// rest on the vector pipes (see hybridFold in crc32c_fold.go): the fold
// returns the register after the vector part only, and each stream's
// register, started from zero, goes to streams. The vector part must then
// be 256 + 512·(streamLen/64) bytes: every pass of the loop folds 512
// bytes and takes 64 bytes of each stream.
TEXT ·castagnoliFold(SB), NOSPLIT, $0-92
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
	MOVQ streamLen+72(FP), R10
	TESTQ R10, R10
	JNZ  hybrid
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
	JMP reduce

// The hybrid loops. Registers: SI the vector part, CX its bytes left; R8
// stream 0 and R11 stream 3 (streams 1 and 2 at R8+R10 and R8+2·R10, R10
// = streamLen); BX = dst - src, so a byte's destination is its source
// address plus BX (R12 = BX+R10 and R13 = BX+2·R10 for streams 1 and 2);
// the streams' registers AX, DI, R9, DX (k is reloaded for the
// reduction).
hybrid:
	MOVQ R10, R11
	SHLQ $2, R11
	SUBQ R11, CX
	MOVQ SI, R8
	ADDQ CX, R8
	LEAQ (R10)(R10*2), R11
	ADDQ R8, R11
	MOVQ DI, BX
	SUBQ SI, BX
	LEAQ (BX)(R10*1), R12
	LEAQ (BX)(R10*2), R13
	XORL AX, AX
	XORL DI, DI
	XORL DX, DX
	CMPQ R9, $1
	MOVL $0, R9
	JB   hsumloop
	JE   hcopyloop
	JMP  hntloop

// FOLD_MEM folds the 256 bytes at off(SI) into Z0-Z3.
#define FOLD_MEM(off) \
	VPCLMULQDQ $0x00, Z5, Z0, Z6; \
	VPCLMULQDQ $0x11, Z5, Z0, Z0; \
	VPTERNLOGD $0x96, (off)(SI), Z6, Z0; \
	VPCLMULQDQ $0x00, Z5, Z1, Z7; \
	VPCLMULQDQ $0x11, Z5, Z1, Z1; \
	VPTERNLOGD $0x96, (off+64)(SI), Z7, Z1; \
	VPCLMULQDQ $0x00, Z5, Z2, Z8; \
	VPCLMULQDQ $0x11, Z5, Z2, Z2; \
	VPTERNLOGD $0x96, (off+128)(SI), Z8, Z2; \
	VPCLMULQDQ $0x00, Z5, Z3, Z9; \
	VPCLMULQDQ $0x11, Z5, Z3, Z3; \
	VPTERNLOGD $0x96, (off+192)(SI), Z9, Z3

// FOLD_COPY copies the 256 bytes at off(SI) to off(SI)(BX*1) with the
// store instruction st and folds them into Z0-Z3 from the registers.
#define FOLD_COPY(st, off) \
	VMOVDQU64 (off)(SI), Z10; \
	VMOVDQU64 (off+64)(SI), Z11; \
	VMOVDQU64 (off+128)(SI), Z12; \
	VMOVDQU64 (off+192)(SI), Z13; \
	st Z10, (off)(SI)(BX*1); \
	st Z11, (off+64)(SI)(BX*1); \
	st Z12, (off+128)(SI)(BX*1); \
	st Z13, (off+192)(SI)(BX*1); \
	VPCLMULQDQ $0x00, Z5, Z0, Z6; \
	VPCLMULQDQ $0x11, Z5, Z0, Z0; \
	VPTERNLOGD $0x96, Z10, Z6, Z0; \
	VPCLMULQDQ $0x00, Z5, Z1, Z7; \
	VPCLMULQDQ $0x11, Z5, Z1, Z1; \
	VPTERNLOGD $0x96, Z11, Z7, Z1; \
	VPCLMULQDQ $0x00, Z5, Z2, Z8; \
	VPCLMULQDQ $0x11, Z5, Z2, Z2; \
	VPTERNLOGD $0x96, Z12, Z8, Z2; \
	VPCLMULQDQ $0x00, Z5, Z3, Z9; \
	VPCLMULQDQ $0x11, Z5, Z3, Z3; \
	VPTERNLOGD $0x96, Z13, Z9, Z3

// CRC64 takes the 64 bytes at (base)(idx*scale) into the register r.
#define CRC64(base, idx, scale, r) \
	CRC32Q 0(base)(idx*scale), r; \
	CRC32Q 8(base)(idx*scale), r; \
	CRC32Q 16(base)(idx*scale), r; \
	CRC32Q 24(base)(idx*scale), r; \
	CRC32Q 32(base)(idx*scale), r; \
	CRC32Q 40(base)(idx*scale), r; \
	CRC32Q 48(base)(idx*scale), r; \
	CRC32Q 56(base)(idx*scale), r

// CRC64B takes the 64 bytes at (base) into the register r.
#define CRC64B(base, r) \
	CRC32Q 0(base), r; \
	CRC32Q 8(base), r; \
	CRC32Q 16(base), r; \
	CRC32Q 24(base), r; \
	CRC32Q 32(base), r; \
	CRC32Q 40(base), r; \
	CRC32Q 48(base), r; \
	CRC32Q 56(base), r

// COPY64 copies the 64 bytes at (base)(idx*scale) to (base)(didx*1)
// with the store instruction st, through the register zr.
#define COPY64(st, zr, base, idx, scale, didx) \
	VMOVDQU64 (base)(idx*scale), zr; \
	st zr, (base)(didx*1)

// COPY64B copies the 64 bytes at (base) to (base)(BX*1).
#define COPY64B(st, zr, base) \
	VMOVDQU64 (base), zr; \
	st zr, (base)(BX*1)

// Streams 0 and 1, then 2 and 3. (R14, R15, Z15 are left alone: Go's
// internal ABI gives them fixed roles.)
#define STREAMS_LO \
	CRC64B(R8, AX); \
	CRC64(R8, R10, 1, DI)

#define STREAMS_HI \
	CRC64(R8, R10, 2, R9); \
	CRC64B(R11, DX)

#define ADVANCE \
	ADDQ $512, SI; \
	ADDQ $64, R8; \
	ADDQ $64, R11; \
	SUBQ $512, CX

hsumloop:
	FOLD_MEM(0)
	STREAMS_LO
	FOLD_MEM(256)
	STREAMS_HI
	ADVANCE
	JNZ hsumloop
	JMP hdone

// COPY_PASS is one pass of a copying hybrid loop, its stores made with
// st: 512 bytes folded and copied, 64 of each stream copied and
// checksummed.
#define COPY_PASS(st) \
	FOLD_COPY(st, 0); \
	COPY64B(st, Z14, R8); \
	COPY64(st, Z16, R8, R10, 1, R12); \
	STREAMS_LO; \
	FOLD_COPY(st, 256); \
	COPY64(st, Z17, R8, R10, 2, R13); \
	COPY64B(st, Z18, R11); \
	STREAMS_HI; \
	ADVANCE

hcopyloop:
	COPY_PASS(VMOVDQU64)
	JNZ hcopyloop
	JMP hdone

hntloop:
	COPY_PASS(VMOVNTDQ)
	JNZ hntloop
	SFENCE

hdone:
	MOVQ streams+80(FP), R8
	MOVL AX, 0(R8)
	MOVL DI, 4(R8)
	MOVL R9, 8(R8)
	MOVL DX, 12(R8)
	MOVQ k+56(FP), DX

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
	MOVL   R8, ret+88(FP)
	VZEROUPPER
	RET
