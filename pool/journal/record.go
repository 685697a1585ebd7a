// Package journal is a node's index journal: an append-only file of
// checksummed records, one for each block committed to the arena and one
// for each block taken out of it, from which a node restarted over a
// segment that outlived its process rebuilds its index (issue 17).
//
// The journal only says where blocks were. Whether their bytes are still
// intact is the block checksum's business: a node adopting a segment
// checks every block it replays against the CRC its record carries and
// drops the ones that fail, so a record that outlived its block (a kill -9
// between a removal and its record reaching the file, pages reused since)
// costs a block, never a wrong answer.
//
// The file is a header and then records, each
//
//	crc u32 | len u32 | body (len bytes)
//
// where crc is CRC-32C of the body. A record that is short or fails its
// checksum ends the journal: everything after it is a torn tail (a write
// cut by a crash), reported and cut off before appending.
//
// Record encoding and replay here are pure; Writer and Read do the file's
// I/O and hold no goroutines (the owner flushes on its own schedule).
package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/kvpool/kvpool/api"
)

// Kind says what a record records.
type Kind uint8

const (
	// Put: a block was committed at Offset.
	Put Kind = 1
	// Drop: the block under the name left the index (removed, evicted or
	// expired); its pages may be reused from now on.
	Drop Kind = 2
)

func (k Kind) String() string {
	switch k {
	case Put:
		return "put"
	case Drop:
		return "drop"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Record is one entry of the journal. Drop records carry only the name.
type Record struct {
	Kind                   Kind
	Tenant, Namespace, Key []byte
	// Offset and Size locate the block's bytes in the segment, in bytes.
	Offset, Size int64
	// CRC is the CRC-32C of the block's bytes.
	CRC uint32
	// ExpiresUnixNano is when the block's TTL ends; 0 for none.
	ExpiresUnixNano int64
}

const (
	// frameBytes is the crc and length before every body.
	frameBytes = 8
	// nameBytes is the kind and the three name lengths (u16 each).
	nameBytes = 1 + 3*2
	// putBytes is what a Put's body adds: offset, size, crc, expiry.
	putBytes = 8 + 8 + 4 + 8
	// MaxRecordBytes bounds a record's body, so a corrupt length field
	// cannot make a reader allocate or skip gigabytes.
	MaxRecordBytes = nameBytes + putBytes + 3*math.MaxUint16
)

// ErrTorn is a record that is cut short or fails its checksum: the end of
// what the journal holds.
var ErrTorn = errors.New("journal: torn record")

// AppendRecord appends r's encoding to dst. It panics on a name part
// longer than 65,535 bytes (api.ValidateKeyBytes keeps names far shorter)
// or an unknown kind.
func AppendRecord(dst []byte, r Record) []byte {
	if r.Kind != Put && r.Kind != Drop {
		panic(fmt.Sprintf("journal: record of %v", r.Kind))
	}
	for _, part := range [][]byte{r.Tenant, r.Namespace, r.Key} {
		if len(part) > math.MaxUint16 {
			panic(fmt.Sprintf("journal: name part of %d bytes", len(part)))
		}
	}
	body := nameBytes + len(r.Tenant) + len(r.Namespace) + len(r.Key)
	if r.Kind == Put {
		body += putBytes
	}
	start := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, 0) // crc, below
	dst = binary.LittleEndian.AppendUint32(dst, uint32(body))
	dst = append(dst, byte(r.Kind))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(r.Tenant)))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(r.Namespace)))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(r.Key)))
	if r.Kind == Put {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(r.Offset))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(r.Size))
		dst = binary.LittleEndian.AppendUint32(dst, r.CRC)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(r.ExpiresUnixNano))
	}
	dst = append(dst, r.Tenant...)
	dst = append(dst, r.Namespace...)
	dst = append(dst, r.Key...)
	binary.LittleEndian.PutUint32(dst[start:], api.Checksum(dst[start+frameBytes:]))
	return dst
}

// DecodeRecord decodes the record at the start of b and returns it and
// the bytes it took. The record's name parts alias b. A record cut short
// or failing its checksum is ErrTorn; a record whose checksum holds but
// whose body makes no sense (a kind or length this version does not
// know) is another error: the journal was written by something else.
func DecodeRecord(b []byte) (Record, int, error) {
	if len(b) < frameBytes {
		return Record{}, 0, ErrTorn
	}
	crc, n := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
	if n > MaxRecordBytes || uint64(len(b)-frameBytes) < uint64(n) {
		return Record{}, 0, ErrTorn
	}
	body := b[frameBytes : frameBytes+int(n)]
	if api.Checksum(body) != crc {
		return Record{}, 0, ErrTorn
	}
	if len(body) < nameBytes {
		return Record{}, 0, fmt.Errorf("journal: record body of %d bytes", len(body))
	}
	r := Record{Kind: Kind(body[0])}
	lt := int(binary.LittleEndian.Uint16(body[1:]))
	ln := int(binary.LittleEndian.Uint16(body[3:]))
	lk := int(binary.LittleEndian.Uint16(body[5:]))
	rest := body[nameBytes:]
	switch r.Kind {
	case Put:
		if len(rest) < putBytes {
			return Record{}, 0, fmt.Errorf("journal: put record body of %d bytes", len(body))
		}
		r.Offset = int64(binary.LittleEndian.Uint64(rest))
		r.Size = int64(binary.LittleEndian.Uint64(rest[8:]))
		r.CRC = binary.LittleEndian.Uint32(rest[16:])
		r.ExpiresUnixNano = int64(binary.LittleEndian.Uint64(rest[20:]))
		rest = rest[putBytes:]
		if r.Offset < 0 || r.Size <= 0 || r.Offset > math.MaxInt64-r.Size {
			return Record{}, 0, fmt.Errorf("journal: put record of %d bytes at %d", r.Size, r.Offset)
		}
	case Drop:
	default:
		return Record{}, 0, fmt.Errorf("journal: record of %v", r.Kind)
	}
	if len(rest) != lt+ln+lk {
		return Record{}, 0, fmt.Errorf("journal: %v record with %d name bytes for names of %d+%d+%d", r.Kind, len(rest), lt, ln, lk)
	}
	r.Tenant, r.Namespace, r.Key = rest[:lt:lt], rest[lt:lt+ln:lt+ln], rest[lt+ln:]
	return r, frameBytes + int(n), nil
}

// Replayed is what a journal's records leave behind.
type Replayed struct {
	// Blocks are the live blocks, by offset: the last Put of each name
	// not followed by its Drop, less any a later Put overlaps.
	Blocks []Record
	// Records is how many records were read; Overlapped how many live
	// blocks a later Put's range overlapped (their pages were reused with
	// the Drop not yet written); ValidBytes how many bytes from the
	// start of the records decoded (what a writer appends after).
	Records, Overlapped int
	ValidBytes          int64
	// Torn is the length of what followed the last good record: 0 after
	// a clean shutdown.
	Torn int64
}

// Replay applies the records in b, in order. It stops at the first torn
// record; a record that decodes but is invalid is an error. The Blocks'
// names alias b.
func Replay(b []byte) (Replayed, error) {
	type live struct {
		r   Record
		seq int
	}
	byName := map[string]live{}
	var out Replayed
	off := 0
	for off < len(b) {
		r, n, err := DecodeRecord(b[off:])
		if errors.Is(err, ErrTorn) {
			break
		}
		if err != nil {
			return Replayed{}, fmt.Errorf("%w (record %d, at byte %d of the records)", err, out.Records, off)
		}
		name := nameOf(r)
		switch r.Kind {
		case Put:
			byName[name] = live{r: r, seq: out.Records}
		case Drop:
			delete(byName, name)
		}
		out.Records++
		off += n
	}
	out.ValidBytes, out.Torn = int64(off), int64(len(b)-off)
	blocks := make([]live, 0, len(byName))
	for _, l := range byName {
		blocks = append(blocks, l)
	}
	sort.Slice(blocks, func(i, j int) bool {
		if blocks[i].r.Offset != blocks[j].r.Offset {
			return blocks[i].r.Offset < blocks[j].r.Offset
		}
		return blocks[i].seq < blocks[j].seq
	})
	// Two live blocks whose ranges overlap: the pages went to the later
	// Put, so the earlier one's bytes are gone. Sweep by offset, keeping
	// each block that overlaps nothing later-written.
	kept := make([]bool, len(blocks))
	for i := range blocks {
		kept[i] = true
	}
	for i := range blocks {
		end := blocks[i].r.Offset + blocks[i].r.Size
		for j := i + 1; j < len(blocks) && blocks[j].r.Offset < end; j++ {
			if blocks[j].seq > blocks[i].seq {
				kept[i] = false
			} else {
				kept[j] = false
			}
		}
	}
	for i, l := range blocks {
		if kept[i] {
			out.Blocks = append(out.Blocks, l.r)
		} else {
			out.Overlapped++
		}
	}
	return out, nil
}

func nameOf(r Record) string {
	b := make([]byte, 0, 6+len(r.Tenant)+len(r.Namespace)+len(r.Key))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.Tenant)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.Namespace)))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.Key)))
	b = append(b, r.Tenant...)
	b = append(b, r.Namespace...)
	return string(append(b, r.Key...))
}
