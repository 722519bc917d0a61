#!/usr/bin/env bash
# Build the CPU module (WASM-SIMD) into web/build/ (gitignored; rebuilt by set-up and by the tests
# when missing or older than a source in wasm/): the champion and the draft linked into one module
# over one memory, one arena, one status table (docs/champion_wasm.md, "One CPU module"):
#   wasm/common.c + champion.c + draft.c + cpu.c -> cpu.wasm     (one thread)
#                                                -> cpu_mt.wasm  (the champion's thread pool:
#                                                   atomics, an imported shared memory)
#                                                -> cpu_relaxed.wasm, cpu_mt_relaxed.wasm  (the same
#                                                   with relaxed SIMD: the Q4 formats' dot products,
#                                                   the same bits; loaded where the browser has it)
#   bash wasm/build.sh [OUT_DIR]
# EXTRA_CFLAGS (tests: -DCHAMPION_RACE_TEST widens the thread pool's race windows) and BUILDS (the
# builds to make, default all four) for test builds into another OUT_DIR.
# clang 19 (Debian 12's clang-19: relaxed-SIMD intrinsics; tools/setup.sh installs it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-$ROOT/web/build}"
mkdir -p "$OUT_DIR"
CLANG="${CLANG:-clang-19}"
SOURCES=("$ROOT/wasm/common.c" "$ROOT/wasm/champion.c" "$ROOT/wasm/draft.c" "$ROOT/wasm/cpu.c" "$ROOT/wasm/qmatmul.c")
# -ffp-contract=off: no fused multiply-add, so the portable log matches NumPy bit for bit.
# -ffreestanding: no libc (and no implicit memset/memcpy calls).
build() {   # build OUT_NAME [extra flags...]
    local out="$OUT_DIR/$1.wasm"
    case " ${BUILDS:-cpu cpu_mt cpu_relaxed cpu_mt_relaxed} " in *" $1 "*) ;; *) return 0 ;; esac
    shift
    # shellcheck disable=SC2086
    set -- "$@" ${EXTRA_CFLAGS:-}
    "$CLANG" --target=wasm32 -O3 -ffreestanding -nostdlib -msimd128 -ffp-contract=off \
        -fno-math-errno -Wall -Wextra -Wno-unused-parameter "$@" \
        -Wl,--no-entry -Wl,--export-dynamic -Wl,--strip-all -Wl,-z,stack-size=1048576 \
        -o "$out.tmp" "${SOURCES[@]}"
    mv "$out.tmp" "$out"
    echo "built $out ($(wc -c < "$out") bytes)"
}
# helpers are instances of the same module over one shared memory; each sets its own stack
THREADS=(-DCHAMPION_THREADS -matomics -mbulk-memory -mmutable-globals
    -Wl,--import-memory -Wl,--shared-memory -Wl,--max-memory=4294967296 -Wl,--export=__stack_pointer)
RELAXED=(-mrelaxed-simd -DQMATMUL_RELAXED=1)
build cpu
build cpu_mt "${THREADS[@]}"
build cpu_relaxed "${RELAXED[@]}"
build cpu_mt_relaxed "${THREADS[@]}" "${RELAXED[@]}"
