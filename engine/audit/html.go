package audit

// The page of `turnsnap audit --html`: one self-contained page (inline
// style and script, no network) that draws the audit's turns from the
// report's JSON embedded in it.

import (
	"bytes"
	"encoding/json"
	"html/template"
	"io"
)

var page = template.Must(template.New("audit").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>turnsnap audit: {{.Title}}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em} .turn{border:1px solid #ccc;border-radius:6px;margin:.8em 0;padding:.6em .9em}
.turn h2{font-size:1.05em;margin:.1em 0 .4em} .class{display:inline-block;padding:0 .5em;border-radius:4px;color:#fff;font-size:.85em}
.skip{background:#999}.fs{background:#1f77b4}.process{background:#ff7f0e}.full{background:#d62728}
table{border-collapse:collapse;font-size:.9em} td,th{padding:.1em .6em;text-align:left;border-bottom:1px solid #eee}
.loss{color:#8a1c1c} .muted{color:#777}
</style></head><body>
<h1>turnsnap audit: sandbox <span id="sandbox"></span></h1>
<p id="totals" class="muted"></p>
<div id="turns"></div>
<script type="application/json" id="audit-data">{{.JSON}}</script>
<script>
(function(){
  var rep = JSON.parse(document.getElementById('audit-data').textContent);
  function el(tag, cls, text){ var e=document.createElement(tag); if(cls) e.className=cls; if(text!==undefined) e.textContent=text; return e; }
  document.getElementById('sandbox').textContent = rep.sandbox;
  var t = rep.totals || {};
  document.getElementById('totals').textContent = t.turns + ' checkpoints, ' + t.bytes_new + ' bytes stored, ' + (t.duration_ms||0).toFixed(1) + ' ms checkpointing in all';
  var root = document.getElementById('turns');
  (rep.turns||[]).forEach(function(turn){
    var s = el('section', 'turn'); s.id = 'turn-' + turn.turn; s.setAttribute('data-turn', turn.turn);
    var h = el('h2', null, 'Turn ' + turn.turn + ' ');
    h.appendChild(el('span', 'class ' + turn.class, turn.class));
    h.appendChild(el('span', 'muted', '  ' + String(turn.checkpoint).slice(0,12) + (turn.message ? ' — ' + turn.message : '')));
    s.appendChild(h);
    s.appendChild(el('div', null, 'cost: ' + turn.bytes_new + ' bytes stored, ' + turn.duration_ms.toFixed(1) + ' ms, paused ' + turn.pause_ms.toFixed(1) + ' ms'));
    s.appendChild(el('div', null, 'files: ' + turn.added + ' added, ' + turn.modified + ' modified, ' + turn.deleted + ' deleted' + (turn.files_truncated ? ' (list truncated)' : '')));
    var p = turn.processes;
    s.appendChild(el('div', null, 'processes: ' + p.state + (p.image ? ' (image of ' + p.image_files + ' files, ' + p.image_bytes + ' bytes)' : '')));
    if (p.why) s.appendChild(el('div', 'why', 'why: ' + p.why));
    if ((turn.files||[]).length){
      var tb = el('table'); var hr = el('tr');
      ['change','path','type','size','was','metadata'].forEach(function(c){ hr.appendChild(el('th', null, c)); });
      tb.appendChild(hr);
      turn.files.forEach(function(f){
        var r = el('tr');
        [f.change, f.path, f.type, f.size, f.prev_size||'', (f.meta||[]).join(', ') + (f.content ? (f.meta&&f.meta.length?', ':'') + 'content' : '')].forEach(function(v){ r.appendChild(el('td', null, String(v))); });
        tb.appendChild(r);
      });
      s.appendChild(tb);
    }
    s.appendChild(el('div', 'loss', 'chat-only recovery would lose: ' + turn.chat_only_loses.summary));
    s.appendChild(el('div', 'loss', 'chat+fs recovery would lose: ' + turn.chat_fs_loses.summary));
    root.appendChild(s);
  });
  document.body.setAttribute('data-rendered', String((rep.turns||[]).length));
})();
</script></body></html>
`))

// WriteHTML renders the page for report (sandbox name title): a *Report,
// or its wire twin (api.AuditReport) as a client has it. The page reads
// only the report's JSON, which the two share.
func WriteHTML(w io.Writer, title string, report any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(true) // <, >, & as \u escapes: the JSON cannot close its script element
	if err := enc.Encode(report); err != nil {
		return err
	}
	// html/template would escape the JSON as text inside <script type=application/json>;
	// it is safe as is because SetEscapeHTML removed every '<'.
	return page.Execute(w, struct {
		Title string
		JSON  template.JS
	}{title, template.JS(bytes.TrimSpace(buf.Bytes()))})
}
