package api

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
)

// TestChecksumArrived fills buffers in pieces of every kind of length, as
// reads from a socket do, and checks that ChecksumArrived covers only
// whole 256-byte runs until the buffer is full and then gives its CRC.
func TestChecksumArrived(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, 255, 256, 257, 4096, 65536 + 77, 1 << 20} {
		buf := make([]byte, size)
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		for _, maxPiece := range []int{1, 100, 256, 1000, 64 << 10} {
			var (
				crc    uint32
				summed int
			)
			for filled := 0; filled < size; {
				before := filled
				filled = min(size, filled+1+rng.IntN(maxPiece))
				crc = ChecksumArrived(crc, buf, before, filled)
				summed = checksummed(buf, filled)
				if summed > filled || (filled < size && summed%checksumAlign != 0) {
					t.Fatalf("size %d, pieces up to %d: covers %d of %d arrived", size, maxPiece, summed, filled)
				}
				if want := Checksum(buf[:summed]); crc != want {
					t.Fatalf("size %d, pieces up to %d: crc of the first %d bytes %08x, want %08x", size, maxPiece, summed, crc, want)
				}
			}
			if summed != size {
				t.Fatalf("size %d, pieces up to %d: covers %d once full", size, maxPiece, summed)
			}
		}
	}
}

// TestReadChecksummed reads values through a reader that returns pieces
// of random lengths: the CRC is the value's, and a short stream is
// io.ErrUnexpectedEOF.
func TestReadChecksummed(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	value := make([]byte, 3<<20+123)
	for i := range value {
		value[i] = byte(rng.Uint32())
	}
	dst := make([]byte, len(value))
	crc, err := ReadChecksummed(&choppyReader{r: bytes.NewReader(value), rng: rng}, dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, value) || crc != Checksum(value) {
		t.Fatalf("read %d bytes with crc %08x, want the value and %08x", len(dst), crc, Checksum(value))
	}
	if _, err := ReadChecksummed(&choppyReader{r: bytes.NewReader(value[:1000]), rng: rng}, dst); err != io.ErrUnexpectedEOF {
		t.Fatalf("a stream 1000 bytes long into %d: %v, want io.ErrUnexpectedEOF", len(dst), err)
	}
}

// choppyReader returns at most a random few KiB per Read.
type choppyReader struct {
	r   io.Reader
	rng *rand.Rand
}

func (c *choppyReader) Read(p []byte) (int, error) {
	return c.r.Read(p[:min(len(p), 1+c.rng.IntN(5000))])
}
