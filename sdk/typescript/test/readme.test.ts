// The README's examples run as written: its echo agent, its caller and its tools example
// (compiled from the README's blocks by the build), each in a process of its own, against the
// fabric; then the echo agent stops gracefully on SIGINT. The README's other blocks (Signing
// in) are compiled, not run.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const examples = join(dirname(fileURLToPath(import.meta.url)), '..', 'examples', 'readme');

/** Runs `example` (the README's echo agent running meanwhile) until it prints `ready` and
 * exits 0, and returns its output lines; then stops the echo agent with SIGINT. */
async function withEcho(example: string, ready: string): Promise<string[]> {
  const echo = spawn(process.execPath, [join(examples, 'an-echo-agent.js')],
    { stdio: ['ignore', 'ignore', 'pipe'] });
  let echoErr = '';
  echo.stderr.setEncoding('utf8').on('data', (chunk: string) => { echoErr += chunk; });
  const exited = new Promise((resolve) => echo.on('exit', (code) => resolve(code)));
  try {
    let out = { status: 1 as number | null, stdout: '', stderr: '' };
    // The example needs the echo agent registered; it runs until it is.
    for (let i = 0; i < 50; i++) {
      out = spawnSync(process.execPath, [join(examples, example)], { encoding: 'utf8' });
      if (out.status === 0 && out.stdout.includes(ready)) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.equal(out.status, 0, `${out.stderr}\n(echo: ${echoErr})`);
    echo.kill('SIGINT');
    assert.equal(await exited, 0, echoErr);
    return out.stdout.trim().split('\n').map((line) => line.trimEnd());
  } finally {
    echo.kill('SIGKILL');
  }
}

test('the README quick start runs as written', async () => {
  const lines = await withEcho('a-caller.js', 'echo: hello?');
  assert.match(lines[0], /\becho \((idle|busy)\)/);
  assert.deepEqual(lines.slice(1), [
    'echo: hello?',
    'handler_error: asked to fail',
    '3 parts: 1 2 3',
    'completed echo: summarise this',
    '1 []',
  ]);
});

test('the README tools example runs as written', async () => {
  const lines = await withEcho('tools-for-llms.js', 'echo: hello?');
  assert.deepEqual(lines, [
    '18 ask_person',
    'tool call_Qm2Yb7RkT1vJc9Xw',
    'echo: hello?',
    'true {"error":{"kind":"bad_request","message":"send_to_peer: `message` is required"}}',
  ]);
});
