#!/usr/bin/env bash
# Build {module}.wasm from app.js (and wirl.js, wirl's JavaScript helper) with
# componentize-js, pinned, installed into wirl's cache on first use. Needs npm.
set -euo pipefail
cd "$(dirname "$0")"
componentize_js_version={componentize_js}
prefix=${XDG_CACHE_HOME:-$HOME/.cache}/wirl/guest-tools/js-$componentize_js_version
if [ ! -x "$prefix/node_modules/.bin/componentize-js" ]; then
    echo "installing componentize-js $componentize_js_version into $prefix" >&2
    mkdir -p "$prefix"
    (cd "$prefix" && npm install --silent --no-audit --no-fund --no-save \
        "@bytecodealliance/componentize-js@$componentize_js_version" >&2)
fi
# Only the WASI features a reward needs; http and fetch-event would add wasi:http imports.
# The WIT version app.js's first line names (`// wirl-world: reward-plugin@0.2.0`: wit/0.2.0).
version=$(sed -n '1s%^// wirl-world: *[a-z-]*@\([0-9.]*\).*%\1%p' app.js)
wit=wit${version:+/$version}
"$prefix/node_modules/.bin/componentize-js" app.js --wit "$wit" -n reward-plugin -d http -d fetch-event \
    -o {module}.wasm.tmp >/dev/null
mv {module}.wasm.tmp {module}.wasm
echo "built $(pwd)/{module}.wasm" >&2
