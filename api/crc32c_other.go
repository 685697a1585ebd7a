//go:build !amd64

package api

const hasFoldCRC = false

func foldCRC(crc uint32, p []byte) uint32 { panic("api: no folding CRC on this architecture") }
