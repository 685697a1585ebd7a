package journal

import (
	"os"

	"golang.org/x/sys/unix"
)

// fdatasync syncs f's data and the metadata needed to read it back (its
// length), not its timestamps.
func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }
