package disk

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"

	"github.com/kvpool/kvpool/api"
)

// align is the unit of direct I/O: offsets, lengths and buffer addresses
// are multiples of it. 4 KiB is the logical block size of every NVMe
// drive and file system we run on (512-byte devices accept it too).
const align = 4096

// headerBytes is the header's length: one aligned unit.
const headerBytes = align

// magic starts every block file.
var magic = [8]byte{'k', 'v', 'p', 'b', 'l', 'o', 'c', 'k'}

// formatVersion is the block file's layout version.
const formatVersion = 1

// fileExt ends every block file; tmpExt a file being written.
const (
	fileExt = ".kvb"
	tmpExt  = ".tmp"
)

// header is what a block file says about itself.
//
//	[0,8)   magic "kvpblock"
//	[8,10)  u16 version
//	[10,12) u16 tenant length
//	[12,14) u16 namespace length
//	[14,16) u16 key length
//	[16,24) u64 block size in bytes
//	[24,28) u32 CRC-32C of the block's bytes
//	[28,32) zero
//	[32,40) i64 TTL end, Unix ns (0: none)
//	[40,48) i64 written, Unix ns
//	[48,..) tenant, namespace, key
//	[4092,4096) u32 CRC-32C of bytes [0,4092)
//
// Little-endian throughout.
type header struct {
	tenant, namespace string
	key               []byte
	size              int64
	crc               uint32
	expiresUnixNano   int64
	writtenUnixNano   int64
}

const (
	headerFixed  = 48
	headerCRCAt  = headerBytes - 4
	maxNameBytes = headerCRCAt - headerFixed
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errHeader marks a file that is not a block file this version reads.
var errHeader = errors.New("disk: bad block header")

// encode writes h into dst, which is headerBytes long.
func (h *header) encode(dst []byte) {
	clear(dst[:headerBytes])
	copy(dst, magic[:])
	le := binary.LittleEndian
	le.PutUint16(dst[8:], formatVersion)
	le.PutUint16(dst[10:], uint16(len(h.tenant)))
	le.PutUint16(dst[12:], uint16(len(h.namespace)))
	le.PutUint16(dst[14:], uint16(len(h.key)))
	le.PutUint64(dst[16:], uint64(h.size))
	le.PutUint32(dst[24:], h.crc)
	le.PutUint64(dst[32:], uint64(h.expiresUnixNano))
	le.PutUint64(dst[40:], uint64(h.writtenUnixNano))
	n := copy(dst[headerFixed:], h.tenant)
	n += copy(dst[headerFixed+n:], h.namespace)
	copy(dst[headerFixed+n:], h.key)
	le.PutUint32(dst[headerCRCAt:], crc32.Checksum(dst[:headerCRCAt], castagnoli))
}

// decodeHeader reads a header; maxSize bounds the block size it accepts.
func decodeHeader(src []byte, maxSize int64) (header, error) {
	if len(src) < headerBytes {
		return header{}, fmt.Errorf("%w: %d bytes, want %d", errHeader, len(src), headerBytes)
	}
	le := binary.LittleEndian
	if [8]byte(src[:8]) != magic {
		return header{}, fmt.Errorf("%w: not a kvpool block file", errHeader)
	}
	if got, want := le.Uint32(src[headerCRCAt:]), crc32.Checksum(src[:headerCRCAt], castagnoli); got != want {
		return header{}, fmt.Errorf("%w: header checksum %08x, computed %08x", errHeader, got, want)
	}
	if v := le.Uint16(src[8:]); v != formatVersion {
		return header{}, fmt.Errorf("%w: format version %d, this build reads %d", errHeader, v, formatVersion)
	}
	tl, nl, kl := int(le.Uint16(src[10:])), int(le.Uint16(src[12:])), int(le.Uint16(src[14:]))
	size := int64(le.Uint64(src[16:]))
	if tl+nl+kl > maxNameBytes || size <= 0 || size > maxSize {
		return header{}, fmt.Errorf("%w: names of %d bytes, size %d", errHeader, tl+nl+kl, size)
	}
	names := src[headerFixed:]
	// NB: the layout says [28,32) and everything between the names and the
	// CRC are zero; a header that sets them is not one this version
	// wrote (a later version bumps formatVersion to use them). Rejecting
	// them keeps the format canonical: a header that decodes re-encodes
	// to the same bytes (FuzzDecodeHeader).
	if le.Uint32(src[28:]) != 0 || !allZero(names[tl+nl+kl:headerCRCAt-headerFixed]) {
		return header{}, fmt.Errorf("%w: reserved bytes are not zero", errHeader)
	}
	h := header{
		tenant: string(names[:tl]), namespace: string(names[tl : tl+nl]), key: append([]byte(nil), names[tl+nl:tl+nl+kl]...),
		size: size, crc: le.Uint32(src[24:]),
		expiresUnixNano: int64(le.Uint64(src[32:])), writtenUnixNano: int64(le.Uint64(src[40:])),
	}
	if err := api.ValidateKeyBytes([]byte(h.tenant), []byte(h.namespace), h.key); err != nil {
		return header{}, fmt.Errorf("%w: %v", errHeader, err)
	}
	return h, nil
}

// roundUp is n rounded up to the alignment.
func roundUp(n int64) int64 { return (n + align - 1) &^ (align - 1) }

// fileBytes is the length of a block file for a block of size bytes.
func fileBytes(size int64) int64 { return headerBytes + roundUp(size) }

// blockID is the name's key in the index and the base of its file name.
func blockID(tenant, namespace string, key []byte) string {
	return tenant + "\x00" + namespace + "\x00" + string(key)
}

// fileName is where a block lives under dir/blocks: a hash of its name,
// so any name makes a safe, fixed-length path and files spread over 256
// directories. 128 bits make a collision negligible, and the header names
// the block, so one would be caught when the file is read.
func fileName(id string) string {
	sum := sha256.Sum256([]byte(id))
	h := hex.EncodeToString(sum[:16])
	return filepath.Join(h[:2], h[2:]+fileExt)
}

// allZero reports whether every byte of b is zero.
func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
