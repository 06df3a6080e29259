package trace

import (
	"errors"
	"strings"
	"testing"

	"github.com/turnsnap/turnsnap/internal/errdefs"
)

const good = `{"name":"t1","base":{"files":[{"path":"app/a.sh","content":"echo hi\n","mode":"0755"}]},
"verify":{"cmd":"test -f /app/done"},
"turns":[{"cmds":["touch /app/done"],"start":[{"name":"srv","cmd":"sleep 100","probe":{"cmd":"echo x"}}]},
{"stop":["srv"],"model_latency_ms":5}]}`

func TestParseGood(t *testing.T) {
	tr, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Name != "t1" || len(tr.Turns) != 2 || tr.Turns[0].Start[0].Probe.Cmd != "echo x" {
		t.Fatalf("parsed %+v", tr)
	}
}

func TestParseRejects(t *testing.T) {
	cases := map[string]string{
		"unknown field":  strings.Replace(good, `"verify"`, `"verifyy":{},"verify"`, 1),
		"trailing data":  good + `{}`,
		"absolute path":  strings.Replace(good, `"app/a.sh"`, `"/etc/passwd"`, 1),
		"escaping path":  strings.Replace(good, `"app/a.sh"`, `"../x"`, 1),
		"harness path":   strings.Replace(good, `"app/a.sh"`, `"bin/sh"`, 1),
		"bad mode":       strings.Replace(good, `"0755"`, `"9"`, 1),
		"no verify":      strings.Replace(good, `"test -f /app/done"`, `""`, 1),
		"stop unknown":   strings.Replace(good, `"stop":["srv"]`, `"stop":["nope"]`, 1),
		"huge timeout":   strings.Replace(good, `"model_latency_ms":5`, `"timeout_ms":99999999`, 1),
		"neg latency":    strings.Replace(good, `"model_latency_ms":5`, `"model_latency_ms":-1`, 1),
		"bad name":       strings.Replace(good, `"t1"`, `"T 1"`, 1),
		"no turns":       `{"name":"x","base":{},"verify":{"cmd":"true"},"turns":[]}`,
		"too big":        strings.Repeat(" ", MaxFileBytes+1),
		"nul in command": strings.Replace(good, `touch /app/done`, `touch \u0000`, 1),
	}
	for name, in := range cases {
		if _, err := Parse([]byte(in)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}

// The standard traces in bench/traces load, and each has the agent-like
// mix the issue asks for: most turns are read-only by their commands.
func TestStandardTracesLoad(t *testing.T) {
	trs, err := LoadDir("../traces")
	if err != nil {
		t.Fatal(err)
	}
	if len(trs) < 6 {
		t.Fatalf("%d standard traces, want at least 6", len(trs))
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(`{"name":"a","verify":{"cmd":"true"},"turns":[{}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := Parse(b)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("error without a class: %v", err)
			}
			return
		}
		if tr.Check() != nil || len(tr.Turns) == 0 || len(tr.Turns) > MaxTurns {
			t.Fatal("accepted a trace that does not check")
		}
	})
}
