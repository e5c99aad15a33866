// Validate an AsyncAPI 3.x document with the official parser (it resolves relative $refs and
// runs the AsyncAPI rules), then check each given JSON Schema file against draft 2020-12.
// Usage: node tests/asyncapi/validate.mjs docs/asyncapi.yaml [docs/schema/*.json]
// Exit 0 valid, 1 any error-severity diagnostic or bad schema file, 2 usage.
import { readFileSync } from 'node:fs';
import { relative } from 'node:path';
import { Parser, fromFile, DiagnosticSeverity } from '@asyncapi/parser';
import Ajv2020 from 'ajv/dist/2020.js';

const [docPath, ...schemaFiles] = process.argv.slice(2);
if (!docPath) {
  console.error('usage: validate.mjs <asyncapi.yaml> [schema.json ...]');
  process.exit(2);
}

let errors = 0;
const { document, diagnostics } = await fromFile(new Parser(), docPath).parse();
for (const d of diagnostics) {
  if (d.severity === DiagnosticSeverity.Error) errors++;
  const file = relative(process.cwd(), d.source ?? docPath);
  const pos = d.range ? `${d.range.start.line + 1}:${d.range.start.character + 1}` : '1:1';
  const sev = DiagnosticSeverity[d.severity].toLowerCase(); // error|warning|information|hint
  console.log(`${file}:${pos} ${sev} [${d.code}] ${d.message} (at /${d.path.join('/')})`);
}
if (!document && errors === 0) errors++; // refused without an error diagnostic

// The parser checks payloads only against the AsyncAPI (draft-07 superset) meta-schema, which
// ignores 2020-12 keywords ($defs, prefixItems, ...). Check the files against 2020-12 proper.
const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: true });
for (const file of schemaFiles) {
  try {
    const schema = JSON.parse(readFileSync(file, 'utf8'));
    if (!ajv.validateSchema(schema)) {
      for (const e of ajv.errors) console.log(`${file} error [json-schema-2020-12] ${e.instancePath || '/'} ${e.message}`);
      errors++;
    } else {
      ajv.compile(schema); // throws on a $ref that does not resolve inside the file
    }
  } catch (e) {
    console.log(`${file} error [json-schema-2020-12] ${e.message}`);
    errors++;
  }
}

const what = document
  ? `AsyncAPI ${document.version()}, ${document.channels().length} channels, ${document.operations().length} operations`
  : 'not parsed';
console.log(`${docPath}: ${errors ? 'INVALID' : 'valid'} (${what}; ${schemaFiles.length} schema files; ${errors} error(s))`);
process.exit(errors ? 1 : 0);
