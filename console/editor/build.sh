#!/bin/sh
# `make console-editor`: the PromQL editor bundled into one static file the console serves, and
# the licence of every package in it beside it. The versions are package-lock.json's (npm ci).
set -eu
cd "$(dirname "$0")"
out=../static/vendor
npm ci --no-audit --no-fund --ignore-scripts >/dev/null
node_modules/.bin/esbuild editor.js --bundle --minify --format=iife --target=es2020 --legal-comments=none \
  --metafile=meta.json --outfile=$out/promql-editor.js
# every package the bundle holds, with its version and licence text
node -e '
const fs = require("fs"), path = require("path");
const inputs = Object.keys(JSON.parse(fs.readFileSync("meta.json")).inputs);
const pkgs = [...new Set(inputs.filter(i => i.startsWith("node_modules/")).map(i => {
  const parts = i.split("/"); return parts.slice(0, parts[1].startsWith("@") ? 3 : 2).join("/");
}))].sort();
let text = "Licences of the packages bundled into promql-editor.js (make console-editor).\n";
for (const dir of pkgs) {
  const pkg = JSON.parse(fs.readFileSync(path.join(dir, "package.json")));
  const file = fs.readdirSync(dir).find(f => /^(licen[cs]e|copying)/i.test(f));
  text += `\n==== ${pkg.name}@${pkg.version} (${pkg.license}) ====\n\n` + (file ? fs.readFileSync(path.join(dir, file), "utf8") : "(no licence file; see package.json)\n");
}
fs.writeFileSync(process.argv[1], text);
' "$out/promql-editor.LICENSES.txt"
rm -f meta.json
