package lazy

import (
	"golang.org/x/sys/unix"
)

// placeholderWriter writes into a placeholder's descriptor with pwrite(2)
// for fstree.WriteRuns, which fills each data run at its offset and
// truncates or punches nothing: an ftruncate, even through the group's own
// descriptor, raises a pre-access event on this kernel, and the fill would
// wait for itself (fstree.WriteContent truncates). It is no *os.File, whose
// finalizer would close a descriptor the filler owns.
type placeholderWriter int

func (w placeholderWriter) WriteAt(b []byte, off int64) (int, error) {
	n := 0
	for n < len(b) {
		k, err := unix.Pwrite(int(w), b[n:], off+int64(n))
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}
