#!/usr/bin/env bash
# Build {module}.wasm from app.py (and wirl.py, wirl's Python helper) with componentize-py,
# pinned, installed into wirl's cache on first use. Needs python3.
set -euo pipefail
cd "$(dirname "$0")"
componentize_py_version={componentize_py}
venv=${XDG_CACHE_HOME:-$HOME/.cache}/wirl/guest-tools/python-$componentize_py_version
if [ ! -x "$venv/bin/componentize-py" ]; then
    echo "installing componentize-py $componentize_py_version into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "componentize-py==$componentize_py_version"
fi
# The WIT version app.py's first line names (`# wirl-world: reward-plugin@0.2.0`: wit/0.2.0).
version=$(sed -n '1s%^# wirl-world: *[a-z-]*@\([0-9.]*\).*%\1%p' app.py)
wit=wit${version:+/$version}
"$venv/bin/componentize-py" -d "$wit" -w reward-plugin componentize -p . app -o {module}.wasm.tmp >/dev/null
mv {module}.wasm.tmp {module}.wasm
echo "built $(pwd)/{module}.wasm" >&2
