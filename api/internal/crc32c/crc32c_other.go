//go:build !amd64

package crc32c

const hasFoldCRC = false

func foldCRC(crc uint32, p []byte) uint32 { panic("crc32c: no folding CRC on this architecture") }

func foldCopyCRC(crc uint32, dst, src []byte) uint32 {
	panic("crc32c: no folding CRC on this architecture")
}
