#!/usr/bin/env bash
# Build the WASM-SIMD modules into web/build/ (gitignored; rebuilt by set-up and by the tests
# when missing or older than a source in wasm/):
#   wasm/draft.c    -> draft.wasm     (the draft model, docs/draft_wasm.md)
#   wasm/champion.c -> champion.wasm  (the champion + exact decisions, docs/champion_wasm.md)
#                   -> champion_mt.wasm (the same with a thread pool: atomics, imported shared memory)
# All include wasm/common.h.
#   bash wasm/build.sh [OUT_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-$ROOT/web/build}"
mkdir -p "$OUT_DIR"
CLANG="${CLANG:-clang}"
# -ffp-contract=off: no fused multiply-add, so the portable log matches NumPy bit for bit.
# -ffreestanding: no libc (and no implicit memset/memcpy calls).
build() {   # build OUT_NAME SOURCE_NAME [extra flags...]
    local out="$OUT_DIR/$1.wasm" src="$ROOT/wasm/$2.c"
    shift 2
    "$CLANG" --target=wasm32 -O3 -ffreestanding -nostdlib -msimd128 -ffp-contract=off \
        -fno-math-errno -Wall -Wextra -Wno-unused-parameter "$@" \
        -Wl,--no-entry -Wl,--export-dynamic -Wl,--strip-all -Wl,-z,stack-size=1048576 \
        -o "$out.tmp" "$src"
    mv "$out.tmp" "$out"
    echo "built $out ($(wc -c < "$out") bytes)"
}
build draft draft
build champion champion
# helpers are instances of the same module over one shared memory; each sets its own stack
build champion_mt champion -DCHAMPION_THREADS -matomics -mbulk-memory -mmutable-globals \
    -Wl,--import-memory -Wl,--shared-memory -Wl,--max-memory=4294967296 -Wl,--export=__stack_pointer
