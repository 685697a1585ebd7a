package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/kvpool/kvpool/api"
)

// Header opens a journal: it names the segment the records are about, so
// a journal is never replayed over another segment or another layout.
type Header struct {
	// SegmentID is a random number the node wrote into the segment's own
	// header when it created the segment.
	SegmentID uint64
	// CapacityBytes and PageBytes are the arena's layout.
	CapacityBytes int64
	PageBytes     int64
}

// Version is the journal format this package writes and reads.
const Version = 1

const (
	magic       = "kvpjrnl\x00"
	headerBytes = len(magic) + 4 + 4 + 8 + 8 + 4
)

// ErrClosed is a Flush after Close.
var ErrClosed = errors.New("journal: closed")

// ErrNotJournal is a file that does not start with a journal header of
// this version.
var ErrNotJournal = errors.New("journal: not a kvpool journal")

func appendHeader(dst []byte, h Header) []byte {
	start := len(dst)
	dst = append(dst, magic...)
	dst = binary.LittleEndian.AppendUint32(dst, Version)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(h.PageBytes))
	dst = binary.LittleEndian.AppendUint64(dst, uint64(h.CapacityBytes))
	dst = binary.LittleEndian.AppendUint64(dst, h.SegmentID)
	return binary.LittleEndian.AppendUint32(dst, api.Checksum(dst[start:]))
}

func decodeHeader(b []byte) (Header, error) {
	if len(b) < headerBytes || string(b[:len(magic)]) != magic {
		return Header{}, ErrNotJournal
	}
	if api.Checksum(b[:headerBytes-4]) != binary.LittleEndian.Uint32(b[headerBytes-4:]) {
		return Header{}, fmt.Errorf("%w: header checksum fails", ErrNotJournal)
	}
	if v := binary.LittleEndian.Uint32(b[len(magic):]); v != Version {
		return Header{}, fmt.Errorf("%w: format version %d, this build reads %d", ErrNotJournal, v, Version)
	}
	p := len(magic) + 4
	return Header{
		PageBytes:     int64(binary.LittleEndian.Uint32(b[p:])),
		CapacityBytes: int64(binary.LittleEndian.Uint64(b[p+4:])),
		SegmentID:     binary.LittleEndian.Uint64(b[p+12:]),
	}, nil
}

// Read reads the journal at path and replays it. A missing file is
// os.ErrNotExist; one with a bad header is ErrNotJournal.
func Read(path string) (Header, Replayed, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Header{}, Replayed{}, err
	}
	h, err := decodeHeader(b)
	if err != nil {
		return Header{}, Replayed{}, fmt.Errorf("%s: %w", path, err)
	}
	r, err := Replay(b[headerBytes:])
	if err != nil {
		return Header{}, Replayed{}, fmt.Errorf("%s: %w", path, err)
	}
	return h, r, nil
}

// Writer appends records to a journal file. Append only buffers; Flush
// writes the buffer and syncs the file, so what a crash keeps is what
// the last Flush wrote. The owner decides when to flush (a timer, a
// count, Close).
//
// Safe for concurrent use. Append never blocks on I/O: it may be called
// under the caller's locks.
type Writer struct {
	path string
	// flushMu orders flushes; mu guards the buffer. Append takes only
	// mu, so it never waits for a flush's write or sync.
	flushMu sync.Mutex
	mu      sync.Mutex
	f       *os.File
	buf     []byte
	spare   []byte
	records int64 // appended since Create or Open
	size    int64 // bytes in the file and the buffer
	err     error // the first write or sync error: every later Flush returns it
}

// Create writes a new journal at path holding only h (replacing any file
// there, atomically: a temporary file, synced and renamed over it), and
// returns a Writer appending to it.
func Create(path string, h Header) (*Writer, error) {
	return Rewrite(path, h, nil)
}

// Rewrite writes a new journal at path holding h and a Put for each of
// blocks (compaction: what a long journal replays to), replacing the
// file atomically, and returns a Writer appending to it.
func Rewrite(path string, h Header, blocks []Record) (*Writer, error) {
	b := appendHeader(nil, h)
	for _, r := range blocks {
		b = AppendRecord(b, r)
	}
	f, err := writeReplacing(path, b)
	if err != nil {
		return nil, err
	}
	return &Writer{path: path, f: f, size: int64(len(b))}, nil
}

// writeReplacing writes b to a temporary file beside path, syncs it,
// renames it over path and syncs the directory, and returns the new file
// open for appending at its end.
func writeReplacing(path string, b []byte) (*os.File, error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal: create %s: %w", tmp, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("journal: write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("journal: sync %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		f.Close()
		return nil, fmt.Errorf("journal: replace %s: %w", path, err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Open opens the journal at path for appending after the replay r of it
// (from Read): a torn tail is cut off first, so new records follow the
// last good one.
func Open(path string, r Replayed) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("journal: open %s: %w", path, err)
	}
	end := int64(headerBytes) + r.ValidBytes
	if r.Torn > 0 {
		if err := f.Truncate(end); err != nil {
			f.Close()
			return nil, fmt.Errorf("journal: cut the torn tail of %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, fmt.Errorf("journal: sync %s: %w", path, err)
		}
	}
	if _, err := f.Seek(end, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("journal: seek %s: %w", path, err)
	}
	return &Writer{path: path, f: f, size: end}, nil
}

// Append buffers r for the next Flush.
func (w *Writer) Append(r Record) {
	w.mu.Lock()
	n := len(w.buf)
	w.buf = AppendRecord(w.buf, r)
	w.size += int64(len(w.buf) - n)
	w.records++
	w.mu.Unlock()
}

// Pending is how many bytes wait for a Flush.
func (w *Writer) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.buf)
}

// Size is the journal's length in bytes, flushed or not: the owner
// compacts it (Rewrite) once it is much longer than its live blocks'
// records.
func (w *Writer) Size() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.size
}

// Flush writes what Append buffered and syncs it to the file (fdatasync).
// After a failed write or sync the journal is behind its blocks for good:
// every later Flush returns the first error, and the owner should
// rewrite the journal or stop trusting it.
func (w *Writer) Flush() error {
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	return w.flushLocked()
}

// flushLocked is Flush. REQUIRES: w.flushMu.
func (w *Writer) flushLocked() error {
	if w.f == nil {
		return ErrClosed
	}
	w.mu.Lock()
	buf := w.buf
	w.buf, w.spare = w.spare[:0], nil
	err := w.err
	w.mu.Unlock()
	if err != nil {
		return err
	}
	if len(buf) == 0 {
		return nil
	}
	if _, err = w.f.Write(buf); err == nil {
		err = fdatasync(w.f)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.spare = buf[:0]
	if err != nil {
		w.err = fmt.Errorf("journal: flush %s: %w", w.path, err)
		return w.err
	}
	return nil
}

// Compact replaces the journal with a shorter one that replays to the
// same blocks: a Put for each of snapshot, then the records appended
// after mark. mark is Size at the moment snapshot was taken (the store
// takes both under its lock, store.Committed), so the snapshot and the
// records after mark are the journal's whole story. Appends go on
// meanwhile; flushes wait. The new file replaces the old one atomically:
// a crash during Compact leaves one or the other.
func (w *Writer) Compact(h Header, snapshot []Record, mark int64) error {
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	if err := w.flushLocked(); err != nil {
		return err
	}
	w.mu.Lock()
	end := w.size - int64(len(w.buf)) // the old file's length
	w.mu.Unlock()
	if mark < int64(headerBytes) || mark > end {
		return fmt.Errorf("journal: compact at byte %d of a %d-byte journal", mark, end)
	}
	b := appendHeader(nil, h)
	for _, r := range snapshot {
		b = AppendRecord(b, r)
	}
	tail := make([]byte, end-mark)
	if _, err := w.f.ReadAt(tail, mark); err != nil {
		return fmt.Errorf("journal: read %s for compaction: %w", w.path, err)
	}
	b = append(b, tail...)
	f, err := writeReplacing(w.path, b)
	if err != nil {
		return err
	}
	old := w.f
	w.mu.Lock()
	w.f = f
	w.size = int64(len(b)) + int64(len(w.buf))
	w.mu.Unlock()
	return old.Close()
}

// Close flushes and closes the file. Appends after Close are dropped.
func (w *Writer) Close() error {
	err := w.Flush()
	if errors.Is(err, ErrClosed) {
		return nil
	}
	w.flushMu.Lock()
	defer w.flushMu.Unlock()
	if w.f == nil {
		return err
	}
	cerr := w.f.Close()
	w.f = nil
	return errors.Join(err, cerr)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("journal: open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("journal: sync directory %s: %w", dir, err)
	}
	return nil
}
