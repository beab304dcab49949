// Builds ../src/roadie/web/static/vendor/codemirror.min.js from entry.js, and the licence
// file beside it: `make editor-bundle` (or `npm ci && npm run build` here). The versions
// are those of package-lock.json, so the same lock makes the same file.
import { build } from "esbuild";
import { readFileSync, writeFileSync, readdirSync, existsSync } from "node:fs";
import { join } from "node:path";

const out = "../src/roadie/web/static/vendor";
const result = await build({
  entryPoints: ["entry.js"],
  bundle: true,
  minify: true,
  format: "iife",
  globalName: "RoadieCM",
  target: ["es2020"],
  legalComments: "none",
  metafile: true,
  outfile: join(out, "codemirror.min.js"),
});

// Every package whose code is in the bundle, with its licence text.
const used = new Set();
for (const input of Object.keys(result.metafile.inputs)) {
  const match = input.match(/node_modules\/((?:@[^/]+\/)?[^/]+)\//);
  if (match) used.add(match[1]);
}
const parts = ["The file codemirror.min.js bundles these packages (built by editor/build.mjs from editor/package-lock.json):\n"];
for (const name of [...used].sort()) {
  const dir = join("node_modules", name);
  const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
  const file = readdirSync(dir).find((f) => /^licen[cs]e/i.test(f));
  const text = file && existsSync(join(dir, file)) ? readFileSync(join(dir, file), "utf8").trim() : `License: ${pkg.license}`;
  parts.push(`${"=".repeat(78)}\n${name} ${pkg.version} (${pkg.license})\n${"=".repeat(78)}\n${text}\n`);
}
writeFileSync(join(out, "codemirror.LICENSES.txt"), parts.join("\n"));
console.log(`${out}/codemirror.min.js: ${readFileSync(join(out, "codemirror.min.js")).length} bytes, ${used.size} packages`);
