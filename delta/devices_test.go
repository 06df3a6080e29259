package delta

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

func TestCheckDevice(t *testing.T) {
	for _, c := range []struct {
		e  Entry
		ok bool
	}{
		{Entry{Name: "null", Type: TypeCharDev, Rdev: unix.Mkdev(1, 3)}, true},
		{Entry{Name: "urandom", Type: TypeCharDev, Rdev: unix.Mkdev(1, 9)}, true},
		{Entry{Name: "ptmx", Type: TypeCharDev, Rdev: unix.Mkdev(5, 2)}, true},
		{Entry{Name: "mem", Type: TypeCharDev, Rdev: unix.Mkdev(1, 1)}, false},
		{Entry{Name: "kmsg", Type: TypeCharDev, Rdev: unix.Mkdev(1, 11)}, false},
		{Entry{Name: "sda", Type: TypeBlockDev, Rdev: unix.Mkdev(8, 0)}, false},
		// A block device with null's numbers is another device.
		{Entry{Name: "b13", Type: TypeBlockDev, Rdev: unix.Mkdev(1, 3)}, false},
		{Entry{Name: "f", Type: TypeFile}, true},
		{Entry{Name: "w", Type: TypeWhiteout}, true},
		{Entry{Name: "p", Type: TypeFIFO}, true},
	} {
		err := CheckDevice(c.e)
		if (err == nil) != c.ok {
			t.Errorf("%s: CheckDevice = %v, want ok=%v", c.e.Name, err, c.ok)
		}
		if err != nil && (!errors.Is(err, errdefs.ErrPrecondition) || !strings.Contains(err.Error(), c.e.Name)) {
			t.Errorf("%s: error %v does not name the entry with ErrPrecondition", c.e.Name, err)
		}
	}
}
