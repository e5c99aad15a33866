// The README's quick start runs as written: its echo agent and its caller (compiled from the
// README's blocks by the build), each in a process of its own, against the fabric.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const examples = join(dirname(fileURLToPath(import.meta.url)), '..', 'examples', 'readme');

test('the README quick start runs as written', async () => {
  const echo = spawn(process.execPath, [join(examples, 'an-echo-agent.js')], { stdio: 'ignore' });
  try {
    let out = { status: 1 as number | null, stdout: '', stderr: '' };
    // The caller needs the echo agent registered; it asks until it is.
    for (let i = 0; i < 50; i++) {
      out = spawnSync(process.execPath, [join(examples, 'a-caller.js')], { encoding: 'utf8' });
      if (out.status === 0 && out.stdout.includes('echo: hello?')) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.equal(out.status, 0, out.stderr);
    const lines = out.stdout.trim().split('\n');
    assert.match(lines[0], /echo/);
    assert.equal(lines[1], 'echo: hello?');
    assert.match(lines[2], /submitted|accepted|working|completed/);
  } finally {
    echo.kill('SIGINT');
  }
});
