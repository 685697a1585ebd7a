package main

import "testing"

// A size-or-off flag takes sizes and "off", refuses zero and junk, and
// prints what it holds as it would be typed.
func TestSizeOrOffFlag(t *testing.T) {
	for _, tc := range []struct {
		in        string
		rate      bool
		want      int64
		printed   string
		wantError bool
	}{
		{in: "512KiB", want: 512 << 10, printed: "512KiB"},
		{in: "off", want: -1, printed: "off"},
		{in: " OFF ", want: -1, printed: "off"},
		{in: "1GiB", rate: true, want: 1 << 30, printed: "1GiB"},
		{in: "0", wantError: true},
		{in: "0", rate: true, wantError: true},
		{in: "lots", wantError: true},
	} {
		v := int64(7)
		f := sizeOrOffV{v: &v, rate: tc.rate}
		err := f.Set(tc.in)
		if tc.wantError {
			if err == nil || v != 7 {
				t.Errorf("Set(%q), rate %v: err %v, value %d; want an error and the value untouched", tc.in, tc.rate, err, v)
			}
			continue
		}
		if err != nil || v != tc.want || f.String() != tc.printed {
			t.Errorf("Set(%q), rate %v: err %v, value %d, printed %q; want %d, %q", tc.in, tc.rate, err, v, f.String(), tc.want, tc.printed)
		}
	}
	if rateOrOffV(new(int64)).Type() != "rate|off" || (sizeOrOffV{}).Type() != "size|off" {
		t.Error("types: want rate|off and size|off")
	}
}
