//go:build !amd64

package crc32c

const hasFoldCRC = false

func foldCRC(crc uint32, p []byte) uint32 { panic("crc32c: no folding CRC on this architecture") }

func foldCopyCRC(crc uint32, dst, src []byte) uint32 {
	panic("crc32c: no folding CRC on this architecture")
}

func castagnoliFold(crc uint32, dst, src []byte, k *[12]uint64, mode uint8, streamLen int, streams *[4]uint32) uint32 {
	panic("crc32c: no folding CRC on this architecture")
}

func hybridFold(crc uint32, dst, src []byte, mode uint8) uint32 {
	panic("crc32c: no folding CRC on this architecture")
}
