package trace

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
		"empty command":  strings.Replace(good, `"touch /app/done"`, `""`, 1),
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

const goodV2 = `{"version":2,"name":"t2","cwd":"/app",
"base":{"files":[{"path":"app/blob","content_b64":"AAEC/w==","mode":"0600"}]},
"probe":{"cmd":"cat out","cwd":"/app/sub"},
"verify":{"cmd":"test -f done"},
"turns":[{"steps":[{"start":{"name":"srv","cmd":"sleep 100","cwd":"/tmp"}},{"cmd":"touch done","cwd":"/app","timeout_ms":500},{"stop":"srv"}],"timeout_ms":900,"model_latency_ms":5},
{"steps":[{"cmd":"true"}]}]}`

// A v2 trace keeps its steps' order, decodes binary content, and carries
// its working directories and end probe; a v1 turn's plan is stops, cmds,
// starts, the order v1 always ran.
func TestParseV2(t *testing.T) {
	tr, err := Parse([]byte(goodV2))
	if err != nil {
		t.Fatal(err)
	}
	plan := tr.Turns[0].Plan()
	if len(plan) != 3 || plan[0].Start == nil || plan[1].Cmd != "touch done" || plan[1].TimeoutMS != 500 || plan[2].Stop != "srv" {
		t.Fatalf("plan: %+v", plan)
	}
	if got := tr.Turns[1].Plan(); got[0].TimeoutMS != 0 || tr.Dir(got[0].Cwd) != "/app" || tr.Dir(plan[1].Cwd) != "/app" || tr.Probe.Cwd != "/app/sub" {
		t.Fatalf("cwd/timeout: %+v %+v", got, tr.Probe)
	}
	d, err := tr.Base.Files[0].Data()
	if err != nil || string(d) != "\x00\x01\x02\xff" {
		t.Fatalf("content_b64: %q %v", d, err)
	}
	dir := t.TempDir()
	if err := tr.WriteBase(dir); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "app/blob")); err != nil || string(b) != "\x00\x01\x02\xff" {
		t.Fatalf("written: %q %v", b, err)
	}
	v1, _ := Parse([]byte(good))
	p1 := v1.Turns[0].Plan()
	if len(p1) != 2 || p1[0].Cmd != "touch /app/done" || p1[1].Start == nil || v1.Turns[1].Plan()[0].Stop != "srv" {
		t.Fatalf("v1 plan: %+v", p1)
	}
}

func TestParseV2Rejects(t *testing.T) {
	big := base64.StdEncoding.EncodeToString(make([]byte, MaxBaseBytes+1))
	cases := map[string]string{
		"steps in v1":        strings.Replace(goodV2, `"version":2,`, ``, 1),
		"b64 in v1":          strings.Replace(good, `"content":"echo hi\n"`, `"content_b64":"AA=="`, 1),
		"cwd in v1":          strings.Replace(good, `"name":"t1",`, `"name":"t1","cwd":"/x",`, 1),
		"probe in v1":        strings.Replace(good, `"name":"t1",`, `"name":"t1","probe":{"cmd":"true"},`, 1),
		"cmds in v2":         strings.Replace(goodV2, `{"steps":[{"cmd":"true"}]}`, `{"cmds":["true"]}`, 1),
		"version 3":          strings.Replace(goodV2, `"version":2`, `"version":3`, 1),
		"bad base64":         strings.Replace(goodV2, `AAEC/w==`, `!!`, 1),
		"b64 and content":    strings.Replace(goodV2, `"content_b64"`, `"content":"x","content_b64"`, 1),
		"b64 over the bound": strings.Replace(goodV2, `AAEC/w==`, big, 1),
		"relative cwd":       strings.Replace(goodV2, `"cwd":"/app",`, `"cwd":"app",`, 1),
		"unclean cwd":        strings.Replace(goodV2, `"cwd":"/app/sub"`, `"cwd":"/app/../etc"`, 1),
		"two in a step":      strings.Replace(goodV2, `{"stop":"srv"}`, `{"stop":"srv","cmd":"x"}`, 1),
		"empty step":         strings.Replace(goodV2, `{"stop":"srv"}`, `{}`, 1),
		"cwd on a stop":      strings.Replace(goodV2, `{"stop":"srv"}`, `{"stop":"srv","cwd":"/"}`, 1),
		"stop before start":  strings.Replace(goodV2, `{"start":{"name":"srv","cmd":"sleep 100","cwd":"/tmp"}},{"cmd":"touch done","cwd":"/app","timeout_ms":500},{"stop":"srv"}`, `{"stop":"srv"},{"start":{"name":"srv","cmd":"sleep 100"}}`, 1),
		"step timeout":       strings.Replace(goodV2, `"timeout_ms":500`, `"timeout_ms":99999999`, 1),
		"image in v1":        strings.Replace(good, `"base":{`, `"base":{"image":{"name":"debian-bookworm"},`, 1),
		"image dir and name": strings.Replace(goodV2, `"base":{`, `"base":{"image":{"name":"debian-bookworm","dir":"/x"},`, 1),
		"image neither":      strings.Replace(goodV2, `"base":{`, `"base":{"image":{},`, 1),
		"image bad name":     strings.Replace(goodV2, `"base":{`, `"base":{"image":{"name":"Deb ian"},`, 1),
		"empty probe":        strings.Replace(goodV2, `"cmd":"cat out"`, `"cmd":" "`, 1),
		"seeds in v1":        strings.Replace(good, `"name":"t1",`, `"name":"t1","seeds":1,`, 1),
		"negative seeds":     strings.Replace(goodV2, `"name":"t2",`, `"name":"t2","seeds":-1,`, 1),
		"image oci and tar":  strings.Replace(goodV2, `"base":{`, `"base":{"image":{"oci":"l","tar":"b.tar"},`, 1),
		"generate in v1":     strings.Replace(good, `"base":{`, `"base":{"generate":[{"kind":"vendor","dir":"v","packages":1}],`, 1),
		"generate kind":      strings.Replace(goodV2, `"base":{`, `"base":{"generate":[{"kind":"npm","dir":"v","packages":1}],`, 1),
		"generate too many":  strings.Replace(goodV2, `"base":{`, `"base":{"generate":[{"kind":"vendor","dir":"v","packages":5001}],`, 1),
		"generate outside":   strings.Replace(goodV2, `"base":{`, `"base":{"generate":[{"kind":"vendor","dir":"../v","packages":1}],`, 1),
	}
	for name, in := range cases {
		if _, err := Parse([]byte(in)); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(good))
	f.Add([]byte(goodV2))
	f.Add([]byte(`{"version":2,"name":"a","verify":{"cmd":"true"},"turns":[{"steps":[{"cmd":"x","cwd":"/"}]}]}`))
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
		// Every declared size is bounded: the decoded base, each turn's
		// steps, every command.
		total := 0
		for _, fl := range tr.Base.Files {
			d, err := fl.Data()
			if err != nil {
				t.Fatalf("accepted undecodable content: %v", err)
			}
			total += len(d)
		}
		if total > MaxBaseBytes {
			t.Fatalf("accepted %d bytes of base content", total)
		}
		for _, turn := range tr.Turns {
			plan := turn.Plan()
			if len(plan) > MaxCmdsPerTurn+2*MaxProcesses {
				t.Fatalf("accepted a turn of %d steps", len(plan))
			}
			for _, st := range plan {
				if len(st.Cmd) > MaxCmdBytes || len(st.Cwd) > 1024 || (st.Cmd == "" && st.Start == nil && st.Stop == "") {
					t.Fatalf("accepted step %+v", st)
				}
			}
		}
	})
}

// The vendor generator writes the same tree for the same seed (10,000+
// files for 600 packages), another for another seed; an image is named
// by exactly one of its kinds, relative to the trace's file.
func TestGenerateAndImageKinds(t *testing.T) {
	tr, err := Parse([]byte(strings.Replace(goodV2, `"base":{`, `"base":{"image":{"oci":"layout"},"generate":[{"kind":"vendor","dir":"app/node_modules","packages":600,"seed":3}],`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	tr.src = "/traces"
	if tr.ImageOCI() != "/traces/layout" || tr.ImageTar() != "" || tr.ImageDir() != "" {
		t.Errorf("image paths: %q %q %q", tr.ImageOCI(), tr.ImageTar(), tr.ImageDir())
	}
	digest := func(g Generator) (int, string) {
		dir := t.TempDir()
		root, err := os.OpenRoot(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer root.Close()
		n, err := g.Write(root)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				b, _ := os.ReadFile(p)
				fmt.Fprintf(h, "%s %v %d %x\n", strings.TrimPrefix(p, dir), fi.Mode(), fi.ModTime().Unix(), sha256.Sum256(b))
			}
			return nil
		})
		return n, hex.EncodeToString(h.Sum(nil))
	}
	if tr.SeedCount(2) != 2 {
		t.Error("no seeds cap: want every seed")
	}
	tr.Seeds = 1
	if tr.SeedCount(2) != 1 || tr.SeedCount(0) != 0 {
		t.Error("seeds cap not applied")
	}
	g := tr.Base.Generate[0]
	n1, d1 := digest(g)
	n2, d2 := digest(g)
	if n1 < 10000 || n1 != n2 || d1 != d2 {
		t.Errorf("generator: %d files %s, then %d %s; want the same, at least 10,000", n1, d1, n2, d2)
	}
	g.Seed = 4
	if _, d3 := digest(g); d3 == d1 {
		t.Error("another seed wrote the same tree")
	}
}
