// The official MCP TypeScript SDK's client against turnsnap's MCP server
// (cmd/turnsnap/mcp_test.go runs it): it lists the tools, calls every one
// on a real sandbox and checks each call's effect on the sandbox's files,
// which it reads from the host (the sandbox's root). One JSON object
// (MCP_CONFIG) says how to reach the server:
//   {"transport": "stdio", "command": ..., "args": [...], "env": {...}}
//   {"transport": "http", "url": ..., "token": ...}
// and "sandbox", "root", "branch" say what to act on. It prints a JSON
// summary on its last line and exits 0, or throws (exit 1) naming the
// check that failed.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const cfg = JSON.parse(process.env.MCP_CONFIG);
const root = cfg.root;
const file = (p) => path.join(root, p);

function transport(token) {
  if (cfg.transport === 'stdio') {
    return new StdioClientTransport({ command: cfg.command, args: cfg.args, env: cfg.env, stderr: 'inherit' });
  }
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  return new StreamableHTTPClientTransport(new URL(cfg.url), { requestInit: { headers } });
}

if (cfg.transport === 'http') {
  // Without the bearer token the daemon answers 401 before MCP sees it.
  const c = new Client({ name: 'turnsnap-test', version: '0' });
  await assert.rejects(c.connect(transport('')), /401|nauthorized/, 'connect without the token');
}

const client = new Client({ name: 'turnsnap-test', version: '0' });
await client.connect(transport(cfg.token));

// call returns a successful call's structured content (checked against the
// tool's output schema by the SDK) and its text.
async function call(name, args) {
  const res = await client.callTool({ name, arguments: args ?? {} });
  assert.ok(!res.isError, `${name} ${JSON.stringify(args)}: tool error: ${JSON.stringify(res.content)}`);
  assert.ok(res.structuredContent, `${name}: no structured content`);
  return { out: res.structuredContent, text: res.content.map((c) => c.text ?? '').join('') };
}

const summary = { server: client.getServerVersion(), tools: [] };

// tools/list: the seven tools, each with an object input schema.
const { tools } = await client.listTools();
summary.tools = tools.map((t) => t.name).sort();
assert.deepEqual(summary.tools, ['branch', 'cat', 'checkpoint', 'diff', 'log', 'restore_paths', 'rollback']);
for (const t of tools) {
  assert.equal(t.inputSchema.type, 'object', `${t.name}: input schema`);
  assert.equal(t.outputSchema?.type, 'object', `${t.name}: output schema`);
}
assert.deepEqual([...tools.find((t) => t.name === 'restore_paths').inputSchema.required].sort(), ['checkpoint', 'paths']);

// checkpoint: a change makes a new record, which log lists as the head.
const before = (await call('log')).out.checkpoints;
fs.writeFileSync(file('src/feature.go'), 'feature v1\n');
const cp = (await call('checkpoint', { message: 'feature works', turn: 3 })).out;
assert.equal(cp.sandbox, cfg.sandbox);
assert.equal(cp.turn, 3);
assert.notEqual(cp.class, 'skip');
const log = (await call('log')).out;
assert.equal(log.checkpoints.length, before.length + 1, 'log: one record more');
assert.equal(log.checkpoints[0].id, cp.id);
assert.equal(log.checkpoints[0].message, 'feature works');
assert.ok(log.checkpoints[0].head, 'log: the new checkpoint is the head');
summary.checkpoint = cp.id;

// A destructive turn: main.go broken, feature.go deleted, junk added.
fs.writeFileSync(file('src/main.go'), 'package main // broken\n');
fs.rmSync(file('src/feature.go'));
fs.writeFileSync(file('junk.bin'), Buffer.from([0, 1, 2, 255]));

// diff: the three changes since the head.
const diff = (await call('diff')).out;
const changes = diff.changes.map((c) => `${c.change} ${c.path}`).sort();
assert.deepEqual(changes, ['added /junk.bin', 'deleted /src/feature.go', 'modified /src/main.go']);
const patched = (await call('diff', { patch: true })).out.changes.find((c) => c.path === '/src/main.go');
assert.match(patched.patch, /\+package main \/\/ broken/);

// cat: the bytes as they were, as text content too.
const cat = await call('cat', { checkpoint: cp.id, path: '/src/feature.go' });
assert.equal(cat.out.text, 'feature v1\n');
assert.equal(cat.text, 'feature v1\n');

// restore_paths: feature.go back, nothing else touched.
const rp = (await call('restore_paths', { checkpoint: cp.id, paths: ['/src/feature.go'] })).out;
assert.deepEqual(rp.paths.map((p) => `${p.action} ${p.path}`), ['restored /src/feature.go']);
assert.equal(fs.readFileSync(file('src/feature.go'), 'utf8'), 'feature v1\n');
assert.equal(fs.readFileSync(file('src/main.go'), 'utf8'), 'package main // broken\n');

// rollback: everything as at the checkpoint.
const rb = (await call('rollback', { checkpoint: cp.id })).out;
assert.equal(rb.checkpoint, cp.id);
assert.equal(fs.readFileSync(file('src/main.go'), 'utf8'), 'package main\n');
assert.equal(fs.existsSync(file('junk.bin')), false, 'rollback: junk.bin is gone');
assert.deepEqual((await call('diff')).out.changes, [], 'rollback: no change against the head');

// branch: a new sandbox from the head.
const br = (await call('branch', { name: cfg.branch })).out;
assert.deepEqual(br.sandboxes.map((s) => [s.sandbox, s.checkpoint]), [[cfg.branch, cp.id]]);
summary.branch = br.sandboxes[0].sandbox;

// A failure is a tool error naming its class, not a protocol error.
const bad = await client.callTool({ name: 'rollback', arguments: { checkpoint: '0000000000000000' } });
assert.equal(bad.isError, true);
assert.match(bad.content[0].text, /^not_found: /);
summary.error = bad.content[0].text;

await client.close();
console.log(JSON.stringify(summary));
