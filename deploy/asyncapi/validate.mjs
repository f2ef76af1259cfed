// Validate an AsyncAPI document with the official parser (@asyncapi/parser, pinned in
// package.json): the AsyncAPI JSON Schema of its version plus the parser's own rules (Spectral's
// AsyncAPI ruleset: references resolve, examples match their schemas, ...). Every error and
// every warning fails; hints and information are printed. Usage: node validate.mjs FILE
import { readFile } from "node:fs/promises";
import { Parser } from "@asyncapi/parser";

const SEVERITY = ["error", "warning", "information", "hint"];
const file = process.argv[2];
if (!file) {
  console.error("usage: node validate.mjs ASYNCAPI.json");
  process.exit(2);
}
const parser = new Parser();
const { document, diagnostics } = await parser.parse(await readFile(file, "utf8"));
let failed = document === undefined;
for (const d of diagnostics) {
  const where = (d.path || []).join(".") || "(document)";
  console.error(`${SEVERITY[d.severity] ?? d.severity}: ${d.code}: ${where}: ${d.message}`);
  if (d.severity <= 1) failed = true;
}
if (failed) {
  console.error(`${file}: not a valid AsyncAPI document`);
  process.exit(1);
}
const ops = document.operations().all();
const sends = ops.filter((op) => op.action() === "send").length;
console.log(
  `${file}: valid AsyncAPI ${document.version()} (${document.servers().all().length} servers, ` +
    `${document.channels().all().length} channels, ${sends} send and ${ops.length - sends} ` +
    `receive operations, ${document.allMessages().all().length} messages)`,
);
