package main

import (
	"fmt"
	"strconv"
	"strings"
)

// sizeUnits maps suffixes to multipliers: binary (KiB, MiB, GiB, TiB) and
// decimal (KB, MB, GB, TB), case-insensitive; a bare number is bytes.
var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// parseSize parses sizes such as "4096", "4KiB", "2MiB", "1.5GiB", "1GB".
func parseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	if t == "" {
		return 0, fmt.Errorf("size %q has no number", s)
	}
	if n, err := strconv.ParseInt(t, 10, 64); err == nil {
		if n < 0 || (n > 0 && mult > (1<<63-1)/n) {
			return 0, fmt.Errorf("size %q is out of range", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f*float64(mult) >= 1<<63 {
		return 0, fmt.Errorf("size %q: want a number with an optional unit such as 512MiB or 1GiB", s)
	}
	return int64(f * float64(mult)), nil
}

// sizeFlag is a pflag.Value holding a byte size (or a rate in bytes per
// second, as a float64).
type sizeFlag[T int64 | float64] struct{ v *T }

func sizeV[T int64 | float64](p *T) sizeFlag[T] { return sizeFlag[T]{p} }

func (f sizeFlag[T]) String() string {
	if f.v == nil {
		return "0"
	}
	return formatSize(int64(*f.v))
}

func (f sizeFlag[T]) Set(s string) error {
	n, err := parseSize(s)
	if err == nil {
		*f.v = T(n)
	}
	return err
}

func (f sizeFlag[T]) Type() string { return "size" }

// sizeOrOffV is a size, or "off" (stored as -1); rate says the size is
// per second.
type sizeOrOffV struct {
	v    *int64
	rate bool
}

func rateOrOffV(p *int64) sizeOrOffV { return sizeOrOffV{v: p, rate: true} }

func (f sizeOrOffV) String() string {
	if f.v == nil || *f.v == 0 {
		return "0"
	}
	if *f.v < 0 {
		return "off"
	}
	return formatSize(*f.v)
}

func (f sizeOrOffV) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "off") {
		*f.v = -1
		return nil
	}
	n, err := parseSize(s)
	switch {
	case err == nil && n == 0 && f.rate:
		err = fmt.Errorf("rate %q: want a size per second such as 1GiB, or off", s)
	case err == nil && n == 0:
		err = fmt.Errorf("size %q: want a size such as 512KiB, or off", s)
	}
	if err == nil {
		*f.v = n
	}
	return err
}

func (f sizeOrOffV) Type() string {
	if f.rate {
		return "rate|off"
	}
	return "size|off"
}

// formatSize prints n with the largest binary unit that divides it.
func formatSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.s)
		}
	}
	return strconv.FormatInt(n, 10)
}
