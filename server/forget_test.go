package server

import (
	"testing"
	"time"
)

// A forget interval below the minimum is a usage error.
func TestServeForgetIntervalBad(t *testing.T) {
	if err := CheckForgetInterval(time.Millisecond); err == nil {
		t.Fatal("1ms accepted")
	}
	if err := CheckForgetInterval(0); err != nil {
		t.Fatal(err)
	}
}
