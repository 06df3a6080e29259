package benchenv

import "testing"

func TestSize(t *testing.T) {
	t.Setenv(SmallVar, "")
	if Size(10, 1) != 10 || Small() {
		t.Fatal("full size expected without " + SmallVar)
	}
	t.Setenv(SmallVar, "1")
	if Size(10, 1) != 1 || !Small() {
		t.Fatal("small size expected with " + SmallVar)
	}
}

func TestLoad1(t *testing.T) {
	if l := Load1(t); l < 0 {
		t.Fatalf("load %v below zero", l)
	}
}
