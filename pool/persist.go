package pool

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvpool/kvpool/api"
	"github.com/kvpool/kvpool/pool/journal"
	"github.com/kvpool/kvpool/pool/store"
)

// PersistConfig makes a node's blocks outlive its process.
type PersistConfig struct {
	// DataDir is the node's state directory. With it the arena lives in a
	// file that outlives the process (SegmentPath, by default
	// /dev/shm/kvpool-<node id>-<hash of DataDir>), the node keeps an
	// index journal of its committed blocks here, and a node started
	// again with the same DataDir adopts the blocks it held, each checked
	// against its CRC before it is served. Default "": blocks die with
	// the process.
	DataDir string
	// Fresh discards the blocks a DataDir's segment holds and starts
	// empty.
	Fresh bool
	// JournalFlushInterval is how often the journal is synced to disk:
	// the blocks committed within it are what a kill -9 can lose (a
	// SIGTERM loses nothing). Default 100 ms.
	JournalFlushInterval time.Duration
	// JournalCompactBytes: a journal this long, and four times as long as
	// after its last compaction, is rewritten to hold only the live
	// blocks (churn adds about 100 bytes a put and a removal). Default
	// 64 MiB.
	JournalCompactBytes int64
}

func (c *PersistConfig) fill(nodeID string, sc *StoreConfig) {
	if c.JournalFlushInterval == 0 {
		c.JournalFlushInterval = 100 * time.Millisecond
	}
	if c.JournalCompactBytes == 0 {
		c.JournalCompactBytes = 64 << 20
	}
	if c.DataDir != "" && sc.SegmentPath == "" && nodeID != "" {
		abs, err := filepath.Abs(c.DataDir)
		if err != nil {
			abs = c.DataDir
		}
		sum := sha256.Sum256([]byte(abs))
		sc.SegmentPath = filepath.Join("/dev/shm", "kvpool-"+nodeID+"-"+hex.EncodeToString(sum[:4]))
	}
}

func (c *PersistConfig) validate() []error {
	var p problems
	if c.JournalFlushInterval < time.Millisecond || c.JournalFlushInterval > time.Minute {
		p.add("journal flush interval %v: from 1ms to 1m", c.JournalFlushInterval)
	}
	if c.Fresh && c.DataDir == "" {
		p.add("fresh discards a data directory's blocks: give the data directory too")
	}
	if c.JournalCompactBytes < 0 {
		p.add("journal compact bytes %d: must not be negative", c.JournalCompactBytes)
	}
	return p
}

// A persistent segment is the arena followed by one trailer page that
// says what the arena is: it lets a restarted node refuse a segment that
// is not the one its journal describes.
const (
	trailerMagic   = "kvpseg\x00\x00"
	trailerVersion = 1
	trailerBytes   = len(trailerMagic) + 4 + 4 + 8 + 8 + 4
	journalName    = "index.journal"
)

type segmentTrailer struct {
	id            uint64
	capacityBytes int64
	pageBytes     int64
}

func (t segmentTrailer) encode() []byte {
	b := append([]byte(nil), trailerMagic...)
	b = binary.LittleEndian.AppendUint32(b, trailerVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(t.pageBytes))
	b = binary.LittleEndian.AppendUint64(b, uint64(t.capacityBytes))
	b = binary.LittleEndian.AppendUint64(b, t.id)
	return binary.LittleEndian.AppendUint32(b, api.Checksum(b))
}

func decodeTrailer(b []byte) (segmentTrailer, error) {
	if len(b) < trailerBytes || string(b[:len(trailerMagic)]) != trailerMagic {
		return segmentTrailer{}, errors.New("no kvpool segment trailer")
	}
	if api.Checksum(b[:trailerBytes-4]) != binary.LittleEndian.Uint32(b[trailerBytes-4:]) {
		return segmentTrailer{}, errors.New("the segment trailer's checksum fails")
	}
	if v := binary.LittleEndian.Uint32(b[len(trailerMagic):]); v != trailerVersion {
		return segmentTrailer{}, fmt.Errorf("segment format version %d; this build reads %d", v, trailerVersion)
	}
	p := len(trailerMagic) + 4
	return segmentTrailer{
		pageBytes:     int64(binary.LittleEndian.Uint32(b[p:])),
		capacityBytes: int64(binary.LittleEndian.Uint64(b[p+4:])),
		id:            binary.LittleEndian.Uint64(b[p+12:]),
	}, nil
}

// persistence is a node's hold on its DataDir: the journal its store
// writes to, and what the start found.
type persistence struct {
	journal *journal.Writer
	header  journal.Header
	store   *store.Store
	log     *slog.Logger
	every   time.Duration
	// compactAt is the journal length that triggers a compaction.
	compactAt, compactMin int64
	compactions           atomic.Int64
	// flushErrors counts failed flushes (a metric).
	flushErrors atomic.Int64
	started     RestoreReport
}

// RestoreReport is what a node found in its DataDir when it started.
type RestoreReport struct {
	// Adopted blocks and their bytes; Dropped failed their checksum (torn
	// by a crash mid-write, or their pages reused with the journal
	// behind); Expired had passed their TTL; Overlapped were superseded
	// in the journal by a later block on their pages.
	Adopted, Dropped, Expired, Overlapped int
	AdoptedBytes                          int64
	// TornJournalBytes is what followed the journal's last whole record.
	TornJournalBytes int64
	// Fresh says the node started empty: no journal yet, --fresh, or the
	// segment was gone (the host rebooted).
	Fresh bool
	// Took is how long reading, checking and adopting took.
	Took time.Duration
}

// openPersistent opens the node's segment and journal under cfg.DataDir:
// it adopts the segment and its blocks when the journal describes it,
// and creates both otherwise. The store is made here, over the segment,
// because Restore must precede every other use of it.
func openPersistent(cfg *Config, words []uint64, log *slog.Logger) (*segment, *store.Store, *persistence, error) {
	begin := time.Now()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, nil, nil, fmt.Errorf("pool: create data directory: %w", err)
	}
	jpath := filepath.Join(cfg.DataDir, journalName)
	path := cfg.SegmentPath
	want := segmentTrailer{capacityBytes: cfg.CapacityBytes, pageBytes: cfg.PageBytes}
	// The trailer is one arena page, or one huge page on hugetlbfs,
	// where a file is sized and mapped in whole huge pages.
	huge, err := hugePageBytes(path)
	if err != nil {
		return nil, nil, nil, err
	}
	trailer := max(cfg.PageBytes, huge)
	report := RestoreReport{Fresh: true}
	fresh := func() (*segment, *store.Store, *journal.Writer, error) {
		seg, err := createSegment("kvpool-"+cfg.NodeID, path, cfg.CapacityBytes, trailer, cfg.LockMemory, cfg.Prefault, true, false)
		if err != nil {
			return nil, nil, nil, err
		}
		var id [8]byte
		rand.Read(id[:])
		want.id = binary.LittleEndian.Uint64(id[:])
		copy(seg.trailer, want.encode())
		w, err := journal.Create(jpath, journal.Header{SegmentID: want.id, CapacityBytes: want.capacityBytes, PageBytes: want.pageBytes})
		if err != nil {
			return nil, nil, nil, errors.Join(err, seg.close())
		}
		return seg, store.New(cfg.StoreConfig, cfg.Now, seg.mem, words), w, nil
	}
	done := func(seg *segment, st *store.Store, w *journal.Writer) (*segment, *store.Store, *persistence, error) {
		report.Took = time.Since(begin)
		p := &persistence{journal: w, header: journal.Header{SegmentID: want.id, CapacityBytes: want.capacityBytes, PageBytes: want.pageBytes},
			store: st, log: log, every: cfg.JournalFlushInterval, started: report, compactMin: cfg.JournalCompactBytes}
		p.compactAt = max(p.compactMin, 4*w.Size())
		st.SetJournal(journalSink{w})
		return seg, st, p, nil
	}

	hdr, replayed, err := journal.Read(jpath)
	switch {
	case cfg.Fresh || errors.Is(err, os.ErrNotExist):
		if cfg.Fresh {
			log.Info("starting fresh: discarding the data directory's blocks", "data_dir", cfg.DataDir)
		}
		seg, st, w, err := fresh()
		if err != nil {
			return nil, nil, nil, err
		}
		return done(seg, st, w)
	case err != nil:
		return nil, nil, nil, fmt.Errorf("pool: %w; start with --fresh to discard the data directory's blocks", err)
	}
	if hdr.CapacityBytes != cfg.CapacityBytes || hdr.PageBytes != cfg.PageBytes {
		return nil, nil, nil, fmt.Errorf("pool: the data directory %s holds a %d-byte arena of %d-byte pages; this node is configured for %d bytes of %d-byte pages: "+
			"start with the same --capacity and --page-size to keep its blocks, or with --fresh to discard them", cfg.DataDir, hdr.CapacityBytes, hdr.PageBytes, cfg.CapacityBytes, cfg.PageBytes)
	}
	seg, err := adoptSegment(path, cfg.CapacityBytes, trailer, cfg.LockMemory)
	if errors.Is(err, os.ErrNotExist) {
		log.Warn("the segment is gone (the host restarted?): starting empty", "segment", path, "journal_blocks", len(replayed.Blocks))
		seg, st, w, err := fresh()
		if err != nil {
			return nil, nil, nil, err
		}
		return done(seg, st, w)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	got, err := decodeTrailer(seg.trailer)
	if err == nil && (got.id != hdr.SegmentID || got.capacityBytes != hdr.CapacityBytes || got.pageBytes != hdr.PageBytes) {
		err = fmt.Errorf("segment %016x of %d bytes in %d-byte pages, the journal describes segment %016x", got.id, got.capacityBytes, got.pageBytes, hdr.SegmentID)
	}
	if err != nil {
		return nil, nil, nil, errors.Join(fmt.Errorf("pool: segment %s is not the one the journal in %s describes (%v): start with --fresh to discard both", path, cfg.DataDir, err), seg.close())
	}

	// Check every block's bytes, in parallel, before any is served.
	want.id = hdr.SegmentID
	report = RestoreReport{Overlapped: replayed.Overlapped, TornJournalBytes: replayed.Torn}
	ok := verifyBlocks(seg.mem, replayed.Blocks)
	var adopt []store.RestoredBlock
	var keep []journal.Record
	for i, r := range replayed.Blocks {
		if !ok[i] {
			report.Dropped++
			continue
		}
		adopt = append(adopt, store.RestoredBlock{Tenant: string(r.Tenant), Namespace: string(r.Namespace), Key: r.Key,
			Offset: r.Offset, Size: r.Size, CRC: r.CRC, ExpiresUnixNano: r.ExpiresUnixNano})
		keep = append(keep, r)
	}
	st := store.New(cfg.StoreConfig, cfg.Now, seg.mem, words)
	expired, err := st.Restore(adopt)
	if err != nil {
		return nil, nil, nil, errors.Join(fmt.Errorf("pool: adopt the blocks of %s: %w; start with --fresh to discard them", path, err), seg.close())
	}
	report.Expired = expired
	report.Adopted = len(adopt) - expired
	report.AdoptedBytes = int64(st.Stats().StoredBytes) // less the expired
	// The new journal holds what was adopted (expired blocks too: the
	// store forgets them, and their records only cost a skip next time).
	w, err := journal.Rewrite(jpath, hdr, keep)
	if err != nil {
		return nil, nil, nil, errors.Join(err, seg.close())
	}
	return done(seg, st, w)
}

// verifyBlocks checksums each block's bytes in the arena against its
// record, on every core; ok[i] says block i is intact.
func verifyBlocks(mem []byte, blocks []journal.Record) []bool {
	ok := make([]bool, len(blocks))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				k := int(next.Add(1) - 1)
				if k >= len(blocks) {
					return
				}
				b := blocks[k]
				if b.Offset < 0 || b.Size <= 0 || b.Offset > int64(len(mem))-b.Size {
					continue
				}
				ok[k] = api.Checksum(mem[b.Offset:b.Offset+b.Size]) == b.CRC
			}
		})
	}
	wg.Wait()
	return ok
}

// run syncs the journal every interval until ctx ends.
func (p *persistence) run(ctx context.Context) error {
	t := time.NewTicker(p.every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := p.journal.Flush(); err != nil {
			p.flushErrors.Add(1)
			if !failing {
				// The journal is now behind: a restart adopts the blocks
				// of its last good flush (each still checked by CRC).
				p.log.Error("index journal flush failed; a restart will keep only the blocks journaled before now", "err", err)
				failing = true
			}
			continue
		}
		if p.journal.Size() >= p.compactAt {
			if err := p.compact(); err != nil {
				p.log.Error("index journal compaction failed; the journal keeps growing", "err", err)
				p.compactAt *= 2
			}
		}
	}
}

// compact rewrites the journal as the store's live blocks and what was
// appended since they were taken.
func (p *persistence) compact() error {
	began := time.Now()
	before := p.journal.Size()
	blocks, mark := p.store.Committed(p.journal.Size)
	records := make([]journal.Record, len(blocks))
	for i, b := range blocks {
		records[i] = journal.Record{Kind: journal.Put, Tenant: []byte(b.Tenant), Namespace: []byte(b.Namespace), Key: b.Key,
			Offset: b.Offset, Size: b.Size, CRC: b.CRC, ExpiresUnixNano: b.ExpiresUnixNano}
	}
	if err := p.journal.Compact(p.header, records, mark); err != nil {
		return err
	}
	after := p.journal.Size()
	p.compactAt = max(p.compactMin, 4*after)
	p.compactions.Add(1)
	p.log.Info("index journal compacted", "blocks", len(blocks), "bytes_before", before, "bytes_after", after, "took", time.Since(began))
	return nil
}

// close flushes the journal and closes it: after a clean shutdown every
// committed block is journaled.
func (p *persistence) close() error { return p.journal.Close() }

// journalSink turns the store's commits and unlinks into journal records.
type journalSink struct{ w *journal.Writer }

func (j journalSink) Committed(tenant, namespace string, key []byte, offset, size int64, crc uint32, expires int64) {
	j.w.Append(journal.Record{Kind: journal.Put, Tenant: []byte(tenant), Namespace: []byte(namespace), Key: key,
		Offset: offset, Size: size, CRC: crc, ExpiresUnixNano: expires})
}

func (j journalSink) Unlinked(tenant, namespace string, key []byte) {
	j.w.Append(journal.Record{Kind: journal.Drop, Tenant: []byte(tenant), Namespace: []byte(namespace), Key: key})
}

// adoptSegment maps an existing persistent segment at path: the arena
// (capacity bytes) and its trailer page. The caller checks the trailer.
// A missing file is os.ErrNotExist.
func adoptSegment(path string, capacity, page int64, lock bool) (*segment, error) {
	owner, err := ownSegmentPath(path)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		releaseSegmentPath(path, owner)
		if errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("pool: open segment file: %w", err)
	}
	s := &segment{file: f, path: path, owner: owner, keep: true}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, errors.Join(fmt.Errorf("pool: stat segment %s: %w", path, err), s.close())
	}
	if st.Size != capacity+page {
		return nil, errors.Join(fmt.Errorf("pool: segment %s is %d bytes, not the %d of a %d-byte arena and its trailer page: start with --fresh to discard it",
			path, st.Size, capacity+page, capacity), s.close())
	}
	if err := s.mapAll(capacity, page, lock, false); err != nil {
		return nil, errors.Join(err, s.close())
	}
	return s, nil
}
