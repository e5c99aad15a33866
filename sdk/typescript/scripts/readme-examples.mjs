// Copies the README's TypeScript blocks to examples/readme/<name>.ts (not committed), so the
// build compiles them and test/readme.test.ts runs them as written: only the NATS URL reads
// SWITCHBOARD_NATS_URL when it is set.
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const readme = readFileSync(join(root, 'README.md'), 'utf8');
const out = join(root, 'examples', 'readme');
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
const blocks = [...readme.matchAll(/^## (.+?)\n+```ts\n([\s\S]*?)```/gm)];
for (const [, heading, code] of blocks) {
  const name = heading.trim().toLowerCase().replace(/[^a-z]+/g, '-').replace(/^-|-$/g, '');
  const url = "(process.env.SWITCHBOARD_NATS_URL ?? 'nats://127.0.0.1:4222')";
  writeFileSync(join(out, `${name}.ts`),
    `// From README.md, "${heading.trim()}"; do not edit.\n` +
      code.replaceAll("'nats://127.0.0.1:4222'", url));
}
console.log(`README examples: ${blocks.length}`);
