// The README's quick start runs as written: its echo agent and its caller (compiled from the
// README's blocks by the build), each in a process of its own, against the fabric; then the
// echo agent stops gracefully on SIGINT.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const examples = join(dirname(fileURLToPath(import.meta.url)), '..', 'examples', 'readme');

test('the README quick start runs as written', async () => {
  const echo = spawn(process.execPath, [join(examples, 'an-echo-agent.js')],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  let echoErr = '';
  echo.stderr.setEncoding('utf8').on('data', (chunk: string) => { echoErr += chunk; });
  const exited = new Promise((resolve) => echo.on('exit', (code) => resolve(code)));
  try {
    let out = { status: 1 as number | null, stdout: '', stderr: '' };
    // The caller needs the echo agent registered; it asks until it is.
    for (let i = 0; i < 50; i++) {
      out = spawnSync(process.execPath, [join(examples, 'a-caller.js')], { encoding: 'utf8' });
      if (out.status === 0 && out.stdout.includes('echo: hello?')) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.equal(out.status, 0, `${out.stderr}\n(echo: ${echoErr})`);
    const lines = out.stdout.trim().split('\n').map((line) => line.trimEnd());
    assert.match(lines[0], /\becho \((idle|busy)\)/);
    assert.deepEqual(lines.slice(1), [
      'echo: hello?',
      'handler_error: asked to fail',
      '3 parts: 1 2 3',
      'completed echo: summarise this',
      '1 []',
    ]);
    echo.kill('SIGINT');
    assert.equal(await exited, 0, echoErr);
  } finally {
    echo.kill('SIGKILL');
  }
});
