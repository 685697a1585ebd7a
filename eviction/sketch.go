package eviction

import "math/bits"

// sketchDepth is the number of rows of the count-min sketch.
const sketchDepth = 4

// counterMax is the ceiling of a 4-bit counter.
const counterMax = 15

// sketch is a count-min sketch of 4-bit counters, two per byte, as in
// TinyLFU (Einziger et al., "TinyLFU: A Highly Efficient Cache Admission
// Policy") and ristretto's unexported cmSketch. Row i indexes with
// h + i·h2, a double-hashing scheme, so one 64-bit hash serves every row.
type sketch struct {
	rows [sketchDepth][]byte
	// mask is the row width minus one; the width is a power of two.
	mask uint64
}

func newSketch(counters int) sketch {
	width := uint64(1) << bits.Len64(uint64(max(counters, 16))-1)
	s := sketch{mask: width - 1}
	for i := range s.rows {
		s.rows[i] = make([]byte, width/2)
	}
	return s
}

// index returns the counter of h in row i.
func (s *sketch) index(h uint64, i int) uint64 {
	return (h + uint64(i)*(h>>32|1)) & s.mask
}

func (s *sketch) increment(h uint64) {
	for i := range s.rows {
		idx := s.index(h, i)
		shift := (idx & 1) * 4
		b := &s.rows[i][idx>>1]
		if (*b>>shift)&0xf < counterMax {
			*b += 1 << shift
		}
	}
}

// estimate returns the least of h's counters.
func (s *sketch) estimate(h uint64) uint8 {
	est := uint8(counterMax)
	for i := range s.rows {
		idx := s.index(h, i)
		est = min(est, (s.rows[i][idx>>1]>>((idx&1)*4))&0xf)
	}
	return est
}

// halve ages the sketch: every counter is halved (rounding down).
func (s *sketch) halve() {
	for _, row := range s.rows {
		for j := range row {
			row[j] = (row[j] >> 1) & 0x77
		}
	}
}

// hashID spreads an ID over 64 bits (the splitmix64 finalizer). It is
// deterministic, unlike z.MemHash, whose seed changes with every process.
func hashID(id ID) uint64 {
	x := uint64(id) + 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
