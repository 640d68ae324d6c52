#!/usr/bin/env bash
# Installs the pinned third-party MCP gateways and proxies that the profiles beside this file
# drive, and does nothing when they are already installed at those versions (safe to run again,
# e.g. from .ci/run before `callid conform --target scenarios/targets/third-party/NAME.yaml`).
#
#   npm:  matrices/routers/package.json + package-lock.json  ->  matrices/routers/node_modules
#         (supergateway, mcp-proxy, mcp-remote)
#   PyPI: matrices/routers/requirements.txt (exact pins, every dependency)
#         ->  matrices/routers/.venv, made with Python >= 3.12  (mcp-proxy, agentraas)
#
# Exit status: 0 installed (or already were), 1 an install failed or no Python >= 3.12 was found.
set -euo pipefail
cd "$(dirname "$0")/../../.."
dir=matrices/routers

# npm: `npm ls` exits 0 only when the installed tree satisfies package.json, whose versions are
# exact; otherwise `npm ci` installs exactly the lock.
if npm ls --prefix "$dir" --depth=0 >/dev/null 2>&1; then
  echo "npm: already installed"
else
  echo "npm: installing from $dir/package-lock.json"
  if ! npm ci --prefix "$dir" --no-audit --no-fund >/tmp/callid-routers-npm.log 2>&1; then
    echo "error: npm ci in $dir failed; npm said:" >&2
    grep -v EBADENGINE /tmp/callid-routers-npm.log | tail -n 20 >&2
    exit 1
  fi
fi

# PyPI: the venv is kept when `pip freeze` equals the pins; otherwise it is made again.
venv=$dir/.venv
pins() { grep -vE '^\s*(#|$)' "$1" | tr '[:upper:]_' '[:lower:]-' | sort; }
if [ -x "$venv/bin/python" ] &&
   [ "$(pins "$dir/requirements.txt")" = "$("$venv/bin/python" -m pip freeze --disable-pip-version-check 2>/dev/null | pins /dev/stdin)" ]; then
  echo "pip: already installed"
else
  py=""
  for c in python3.13 python3.12 python3 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3; do
    if "$c" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
      py=$(command -v "$c" || echo "$c"); break
    fi
  done
  if [ -z "$py" ]; then
    echo "error: no Python >= 3.12 found (python3.13, python3.12, python3, pyenv)" >&2
    exit 1
  fi
  echo "pip: installing $dir/requirements.txt into $venv with $py"
  if ! { "$py" -m venv --clear "$venv" &&
         "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
           -r "$dir/requirements.txt"; } >/tmp/callid-routers-pip.log 2>&1; then
    echo "error: installing $dir/requirements.txt failed; pip said:" >&2
    tail -n 20 /tmp/callid-routers-pip.log >&2
    exit 1
  fi
fi

bin=$dir/node_modules/.bin
echo "installed: supergateway $("$bin/supergateway" --version 2>/dev/null | tail -n 1)," \
  "mcp-proxy (npm) $("$bin/mcp-proxy" --version 2>/dev/null | tail -n 1)," \
  "mcp-remote $(node -p "require('./$dir/node_modules/mcp-remote/package.json').version")," \
  "$("$venv/bin/python" -m pip freeze --disable-pip-version-check | grep -iE '^(mcp-proxy|agentraas)==' | tr '\n' ' ')"
