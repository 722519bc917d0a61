#!/usr/bin/env bash
# One-command set-up for exactspec on Debian 12 (run as root, or with sudo-less root rights).
#
#   bash tools/setup.sh
#
# Installs (only what is missing):
#   - Debian packages: chromium (browser tests), clang-19 + lld-19 (the wasm32 SIMD / relaxed-SIMD CPU module),
#     nodejs + npm (only if `node`/`npm` are missing), python3-venv (only if venv can't work)
#   - .venv/ with `pip install -e .[test]` (torch 2.13.0 CPU comes from the local wheel dir), and
#     xgrammar 0.1.27 with --no-deps (structured output's masks; its triton/ninja are not wanted)
#   - node_modules/ from package-lock.json (`npm ci`): pyodide 314.0.7, @mlc-ai/web-xgrammar 0.1.27
#   - the real model, SmolLM2-135M-Instruct (Q4_1 GGUF), into build/models/ (tools/fetch_models.py);
#     when it cannot be fetched set-up says so in one line and goes on: the product uses the
#     shipped toy pair, and tests that need the model skip saying why (build/models/status.json)
# It never downloads a browser build (no `playwright install`): tests use /usr/bin/chromium.
#
#   bash tools/setup.sh --models-only    # only the real model step (needs .venv)
#
# Idempotent and fast when everything is there: stamp files under .venv/ are keyed on the
# sha256 of pyproject.toml and package-lock.json.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
STEP="start"
T0=$SECONDS

log() { printf 'setup: %s\n' "$*"; }
step() { STEP="$1"; log "$1"; }
on_error() {
    local rc=$?
    printf 'setup: FAILED at step "%s" (exit %s); see the output above\n' "$STEP" "$rc" >&2
    exit "$rc"
}
trap on_error ERR

sha() { sha256sum "$1" | cut -d' ' -f1; }

# ---------------------------------------------------------------- the real model (never fails set-up)
MODELS_DEST="${EXACTSPEC_BUILD_MODELS:-$ROOT/build/models}"
fetch_real_model() {
    # an intact model is reused offline; a failure is one line, and build/models/status.json says why
    local said
    if said="$("$VENV/bin/python" tools/fetch_models.py --dest "$MODELS_DEST" 2>&1 | tail -n 1)"; then
        log "real model: ${said#fetch_models: }"
    else
        log "real model unavailable, using the shipped toy pair instead (${said##*fetch_models: })"
    fi
}
if [ "${1:-}" = "--models-only" ]; then
    fetch_real_model
    exit 0
fi

# ---------------------------------------------------------------- system packages
APT_UPDATED=0
apt_install() {
    # apt_install PKG... : install Debian packages, running `apt-get update` once, only when needed
    if ! command -v apt-get >/dev/null 2>&1; then
        log "apt-get not found: install these by hand: $*"
        return 1
    fi
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
            log "not root and no sudo: install these by hand: $*"
            return 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    if [ "$APT_UPDATED" -eq 0 ]; then
        log "apt-get update"
        $sudo apt-get update -qq
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

step "system packages"
missing=()
for p in chromium clang-19 lld-19 fonts-liberation; do
    pkg_installed "$p" || missing+=("$p")
done
if ! command -v node >/dev/null 2>&1; then missing+=(nodejs); fi
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi
if [ "${#missing[@]}" -gt 0 ]; then
    step "install system packages: ${missing[*]}"
    apt_install "${missing[@]}"
fi
step "check system tools"
for tool in /usr/bin/chromium clang-19 /usr/lib/llvm-19/bin/wasm-ld node npm; do
    command -v "$tool" >/dev/null 2>&1 || { log "missing after install: $tool"; false; }
done

# ---------------------------------------------------------------- Python venv
PY="${PYTHON:-python3}"
step "python venv (.venv)"
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    log "existing .venv is broken: recreating"
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    command -v "$PY" >/dev/null 2>&1 || { log "no $PY on PATH"; false; }
    if ! "$PY" -m venv "$VENV" >/dev/null 2>&1; then
        rm -rf "$VENV"
        step "install python3-venv"
        pyver="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
        apt_install python3-venv "python${pyver}-venv"
        step "python venv (.venv), second try"
        "$PY" -m venv "$VENV"
    fi
    log "created .venv with $("$VENV/bin/python" --version)"
fi

# xgrammar (structured output's masks, the CPython twin of npm @mlc-ai/web-xgrammar: the same
# release) is installed with --no-deps: its declared triton and ninja are never used here (its
# other dependencies, torch, transformers, numpy, typing-extensions and pydantic, are installed)
XGRAMMAR_PIN="xgrammar==0.1.27"
PIP_KEY="$(sha pyproject.toml) $("$VENV/bin/python" -c 'import sys; print(sys.version.split()[0])') $XGRAMMAR_PIN"
PIP_STAMP="$VENV/.stamp-pip"
if [ -f "$PIP_STAMP" ] && [ "$(cat "$PIP_STAMP")" = "$PIP_KEY" ]; then
    log "python packages up to date"
else
    step "pip install -e .[test] (first run: a few minutes)"
    rm -f "$PIP_STAMP"
    pip_args=(--quiet --disable-pip-version-check)
    # torch 2.13.0 CPU build lies on local disk on these machines; make sure pip looks there.
    if compgen -G "/opt/wheels/torch-2.13.0*.whl" >/dev/null; then
        pip_args+=(--find-links /opt/wheels)
    fi
    # (this machine's pip config names an extra local index whose missing folders make pip
    # print one harmless "is ignored" warning per package: drop those lines only)
    "$VENV/bin/python" -m pip install "${pip_args[@]}" -e ".[test]" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    step "pip install $XGRAMMAR_PIN --no-deps (+ pydantic)"
    "$VENV/bin/python" -m pip install "${pip_args[@]}" "pydantic>=2" "typing-extensions>=4.9" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    "$VENV/bin/python" -m pip install "${pip_args[@]}" --no-deps "$XGRAMMAR_PIN" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    step "check python packages"
    "$VENV/bin/python" - <<'PYEOF'
import importlib, sys
for mod in ("exactspec", "pytest", "hypothesis", "playwright", "tokenizers",
            "safetensors", "transformers", "torch", "numpy", "xgrammar"):
    importlib.import_module(mod)
import torch
if torch.__version__.split("+")[0] != "2.13.0":
    sys.exit(f"torch {torch.__version__} installed, 2.13.0 expected")
from importlib.metadata import version
import xgrammar
if version("xgrammar") != "0.1.27":
    sys.exit(f"xgrammar {version('xgrammar')} installed, 0.1.27 expected (npm @mlc-ai/web-xgrammar is 0.1.27)")
xgrammar.GrammarCompiler(xgrammar.TokenizerInfo(["a", "b"]), max_threads=1).compile_builtin_json_grammar()
PYEOF
    [ -x "$VENV/bin/exactspec" ] || { log "console script .venv/bin/exactspec missing"; false; }
    echo "$PIP_KEY" > "$PIP_STAMP"
fi

# ---------------------------------------------------------------- npm (pyodide)
step "node modules (pyodide, web-xgrammar)"
if [ -f package-lock.json ]; then
    NPM_KEY="$(sha package-lock.json) $(sha package.json)"
else
    NPM_KEY="nolock $(sha package.json)"
fi
NPM_STAMP="$VENV/.stamp-npm"
if [ -f "$NPM_STAMP" ] && [ "$(cat "$NPM_STAMP")" = "$NPM_KEY" ] \
        && [ -f node_modules/pyodide/pyodide.asm.wasm ] && [ -f node_modules/@mlc-ai/web-xgrammar/lib/index.js ]; then
    log "node modules up to date"
else
    rm -f "$NPM_STAMP"
    if [ -f package-lock.json ]; then
        step "npm ci"
        npm ci --no-audit --no-fund --loglevel=error
    else
        step "npm install (no package-lock.json)"
        npm install --no-audit --no-fund --loglevel=error
    fi
    [ -f node_modules/pyodide/pyodide.asm.wasm ] || { log "node_modules/pyodide incomplete"; false; }
    [ -f node_modules/@mlc-ai/web-xgrammar/lib/index.js ] || { log "node_modules/@mlc-ai/web-xgrammar incomplete"; false; }
    echo "$NPM_KEY" > "$NPM_STAMP"
fi

# ---------------------------------------------------------------- Pyodide wheels
# jinja2 + a pure-Python markupsafe under build/wheels/, installed offline by the Pyodide boot
# (web/orchestrator/wheels.mjs); the tool does nothing when they are there and intact.
step "pyodide wheels (build/wheels: jinja2, markupsafe)"
"$VENV/bin/python" tools/pyodide_wheels.py build/wheels 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }

# ---------------------------------------------------------------- Pyodide snapshot
# a booted Pyodide with the standard library, jinja2 and exactspec imported
# (tools/pyodide_snapshot.mjs): the orchestrator worker restores it in well under a second instead
# of booting in ~3 s; remade when Pyodide, the wheels, the Python sources or the tool change.
step "pyodide snapshot (build/pyodide_snapshot)"
"$VENV/bin/python" tools/gen_py_files.py   # web/orchestrator/py_files.json from py/exactspec/{core,formats,pyodide}
if [ -f build/pyodide_snapshot/index.json ] && [ -z "$( { find node_modules/pyodide/package.json tools/pyodide_snapshot.mjs \
        web/orchestrator/py_sources.mjs web/orchestrator/py_files.json build/wheels -newer build/pyodide_snapshot/index.json;
        find py/exactspec/__init__.py py/exactspec/core py/exactspec/formats py/exactspec/pyodide \( -name '*.py' -o -name '*.json' \) -newer build/pyodide_snapshot/index.json; } \
        2>/dev/null | head -1)" ]; then
    log "pyodide snapshot up to date"
else
    node tools/pyodide_snapshot.mjs build/pyodide_snapshot
fi

# ---------------------------------------------------------------- WASM draft + champion
step "CPU module: WASM champion + draft (web/build/{cpu,cpu_mt}.wasm)"
if [ -f web/build/cpu.wasm ] && [ -f web/build/cpu_mt.wasm ] &&
   [ -z "$(find wasm -type f \( -newer web/build/cpu.wasm -o -newer web/build/cpu_mt.wasm \))" ]; then
    log "wasm modules up to date"
else
    bash wasm/build.sh
fi

step "real model (build/models: SmolLM2-135M-Instruct GGUF)"
fetch_real_model

STEP="done"
log "ready in $((SECONDS - T0)) s: run tests with .venv/bin/python -m pytest -q"
