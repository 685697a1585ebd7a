package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Request is one request of a trace.
type Request struct {
	// ID is its position in the trace, from 0.
	ID int
	// ArrivalS is when it arrives, in seconds from the trace's start
	// (after the time scale).
	ArrivalS float64
	// InputTokens and OutputTokens are the prompt's and the answer's
	// lengths.
	InputTokens, OutputTokens int
	// Blocks are the prompt's prefix-chain blocks, block 0 first: equal
	// ids are equal prefixes (the trace hashes each block with its
	// predecessors, as chain keys do).
	Blocks []uint64
}

// TraceConfig says how to read a trace.
type TraceConfig struct {
	// TimeScale divides the trace's inter-arrival times: 2 replays it at
	// twice its rate. Default 1.
	TimeScale float64
	// BlockTokens is how many tokens one hash id stands for: 512 in the
	// Mooncake traces. Default 512.
	BlockTokens int
	// MaxProblems bounds the problems reported before reading stops.
	// Default 20.
	MaxProblems int
}

func (c *TraceConfig) fill() error {
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = 512
	}
	if c.MaxProblems == 0 {
		c.MaxProblems = 20
	}
	if !(c.TimeScale > 0) || c.BlockTokens < 1 || c.MaxProblems < 1 {
		return fmt.Errorf("sim: time scale %v and block tokens %d must be positive", c.TimeScale, c.BlockTokens)
	}
	return nil
}

// mooncakeLine is one line of a Mooncake trace (JSON Lines):
// {"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}.
type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// ParseTrace reads a trace in the Mooncake format. Timestamps are
// milliseconds and must not decrease; hash_ids must cover the prompt
// (len(hash_ids) = ceil(input_length / BlockTokens)); lengths must be
// positive (an output of 0 is allowed: a prefill-only request). Every
// problem is reported, with its line number, up to MaxProblems; a trace
// with any problem is an error.
func ParseTrace(r io.Reader, cfg TraceConfig) ([]Request, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var out []Request
	var errs []error
	prev := 0.0
	for n := 1; sc.Scan(); n++ {
		if len(errs) >= cfg.MaxProblems {
			errs = append(errs, fmt.Errorf("… stopped after %d problems", cfg.MaxProblems))
			break
		}
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var l mooncakeLine
		if err := json.Unmarshal(line, &l); err != nil {
			errs = append(errs, fmt.Errorf("line %d: %v", n, err))
			continue
		}
		if err := l.check(cfg.BlockTokens); err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", n, err))
			continue
		}
		if *l.Timestamp < prev {
			errs = append(errs, fmt.Errorf("line %d: timestamp %v ms is before the previous line's %v ms", n, *l.Timestamp, prev))
			continue
		}
		prev = *l.Timestamp
		blocks := make([]uint64, len(l.HashIDs))
		for i, h := range l.HashIDs {
			blocks[i] = uint64(h)
		}
		out = append(out, Request{ID: len(out), ArrivalS: *l.Timestamp / 1000 / cfg.TimeScale, InputTokens: *l.InputLength,
			OutputTokens: *l.OutputLength, Blocks: blocks})
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("sim: trace: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("sim: trace: no requests")
	}
	// Arrivals count from the first request.
	base := out[0].ArrivalS
	for i := range out {
		out[i].ArrivalS -= base
	}
	return out, nil
}

func (l *mooncakeLine) check(blockTokens int) error {
	var errs []error
	switch {
	case l.Timestamp == nil:
		errs = append(errs, errors.New("no timestamp"))
	case *l.Timestamp < 0 || *l.Timestamp != *l.Timestamp:
		errs = append(errs, fmt.Errorf("timestamp %v: want milliseconds ≥ 0", *l.Timestamp))
	}
	switch {
	case l.InputLength == nil:
		errs = append(errs, errors.New("no input_length"))
	case *l.InputLength < 1:
		errs = append(errs, fmt.Errorf("input_length %d: want at least 1", *l.InputLength))
	case len(l.HashIDs) != (*l.InputLength+blockTokens-1)/blockTokens:
		errs = append(errs, fmt.Errorf("%d hash_ids for %d input tokens: want %d (one per %d tokens)",
			len(l.HashIDs), *l.InputLength, (*l.InputLength+blockTokens-1)/blockTokens, blockTokens))
	}
	switch {
	case l.OutputLength == nil:
		errs = append(errs, errors.New("no output_length"))
	case *l.OutputLength < 0:
		errs = append(errs, fmt.Errorf("output_length %d: want at least 0", *l.OutputLength))
	}
	for _, h := range l.HashIDs {
		if h < 0 {
			errs = append(errs, fmt.Errorf("hash id %d: want ≥ 0", h))
			break
		}
	}
	return errors.Join(errs...)
}
