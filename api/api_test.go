package api

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestID(t *testing.T) {
	id := ID(strings.Repeat("ab", 32))
	if id.Short() != "abababababab" || id.String() != string(id) || id.IsZero() {
		t.Errorf("id %s: short %q", id, id.Short())
	}
	var zero ID
	if !zero.IsZero() || zero.Short() != "" {
		t.Errorf("zero id: %q", zero.Short())
	}
	// On the wire an ID is its hex, the zero ID "" (delta.ID.MarshalText).
	data, _ := json.Marshal(struct {
		A ID  `json:"a"`
		B ID  `json:"b"`
		C *ID `json:"c,omitempty"`
	}{A: id})
	if string(data) != `{"a":"`+string(id)+`","b":""}` {
		t.Errorf("json: %s", data)
	}
}

func TestProblemUnwrapsToItsErr(t *testing.T) {
	class := errors.New("not found")
	var err error = &Problem{Detail: "sandbox s: not found", Class: "not_found", Err: class}
	if !errors.Is(err, class) || err.Error() != "sandbox s: not found" {
		t.Errorf("problem: %v", err)
	}
	data, _ := json.Marshal(err)
	if strings.Contains(string(data), "Err") {
		t.Errorf("Err went on the wire: %s", data)
	}
}

func TestInterruptedDescribe(t *testing.T) {
	var none *Interrupted
	if none.Describe("s") != "" {
		t.Error("nil describes something")
	}
	id := ID(strings.Repeat("0f", 32))
	d := (&Interrupted{Rollback: &id, ProcessesLost: "criu failed"}).Describe("s")
	if !strings.Contains(d, "rollback to 0f0f0f0f0f0f") || !strings.Contains(d, "rollback s --abandon") || !strings.Contains(d, "criu failed") {
		t.Errorf("describe: %s", d)
	}
}

func TestDurations(t *testing.T) {
	if MS(1500*1000) != 1.5 || Dur(1.5).Microseconds() != 1500 {
		t.Errorf("MS %v, Dur %v", MS(1500*1000), Dur(1.5))
	}
	if (RetentionPolicy{}).IsZero() == false || (RetentionPolicy{KeepLast: 1}).IsZero() {
		t.Error("IsZero")
	}
}
