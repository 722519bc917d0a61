#!/usr/bin/env bash
# Build the WASM-SIMD draft: wasm/draft.c -> web/build/draft.wasm (gitignored; rebuilt by set-up
# and by tests/test_wasm_draft.py when missing or older than the source).
#   bash wasm/build.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/web/build/draft.wasm}"
mkdir -p "$(dirname "$OUT")"
CLANG="${CLANG:-clang}"
# -ffp-contract=off: no fused multiply-add, so the portable log matches NumPy bit for bit.
# -ffreestanding: no libc (and no implicit memset/memcpy calls).
"$CLANG" --target=wasm32 -O3 -ffreestanding -nostdlib -msimd128 -ffp-contract=off \
    -fno-math-errno -Wall -Wextra -Wno-unused-parameter \
    -Wl,--no-entry -Wl,--export-dynamic -Wl,--strip-all -Wl,-z,stack-size=1048576 \
    -o "$OUT.tmp" "$ROOT/wasm/draft.c"
mv "$OUT.tmp" "$OUT"
echo "built $OUT ($(wc -c < "$OUT") bytes)"
