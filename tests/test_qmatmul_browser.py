"""The q8act matmul in headless Chromium: cpu.wasm and its relaxed-SIMD twin cpu_relaxed.wasm give
every output the same bits as the NumPy twin (docs/quant_kernels.md), every format. Chromium ships
relaxed SIMD; Node 20's V8 has it only behind a flag and computes the chained accumulator form wrongly
(wasm/qmatmul.c), so the browser -- where the page loads the relaxed build -- is where it must hold."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from browser_fixture import browser_page, chromium_browser, http_server  # noqa: F401
from test_qmatmul import ALL, first_difference, make_cases
from test_wasm_champion import ensure_wasm

from exactspec.twins import qmatmul_twins as qt

pytestmark = pytest.mark.browser

RUN = """async ({cases}) => {
  const { cpuImports } = await import("/web/champion_wasm/cpu_module.mjs");
  // i32x4.relaxed_dot_i8x16_i7x16_add_s in a one-function module: does this browser have relaxed SIMD?
  const probe = new Uint8Array([0,97,115,109,1,0,0,0,1,5,1,96,0,1,123,3,2,1,0,10,61,1,59,0,
    253,12,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0, 253,12,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
    253,12,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0, 253,147,2, 11]);
  const relaxed = WebAssembly.validate(probe);
  const out = { relaxed, runs: {} };
  const dec = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  for (const name of ["cpu", "cpu_relaxed"]) {
    const bytes = await (await fetch(`/web/build/${name}.wasm`)).arrayBuffer();
    let e;
    try { e = (await WebAssembly.instantiate(bytes, cpuImports(null))).instance.exports; }
    catch (err) { out.runs[name] = String(err); continue; }
    out.runs[name] = cases.map(({ fmt, n, rows, cols, w, scale, x }) => {
      const wb = dec(w), xb = dec(x), sb = scale ? dec(scale) : null;
      const pw = e.champion_alloc(wb.length), px = e.champion_alloc(xb.length), po = e.champion_alloc(n * rows * 4);
      const ps = sb ? e.champion_alloc(sb.length) : 0;
      new Uint8Array(e.memory.buffer).set(wb, pw);
      new Uint8Array(e.memory.buffer).set(xb, px);
      if (sb) new Uint8Array(e.memory.buffer).set(sb, ps);
      const status = e.champion_qmatmul(fmt, pw, ps, px, n, rows, cols, po);
      const y = new Uint8Array(e.memory.buffer.slice(po, po + n * rows * 4));
      let s = ""; for (const b of y) s += String.fromCharCode(b);
      return { status, out: btoa(s) };
    });
  }
  return out;
}"""


def b64(a) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def test_relaxed_and_simd128_builds_equal_the_twin_in_chromium(browser_page, http_server):  # noqa: F811
    ensure_wasm()
    browser_page.goto(http_server.url + "/web/tests/accept_harness.html")
    cases = [(fmt, c) for fmt in ALL for c in make_cases(fmt, seed=300 + qt.FORMATS[fmt])[:6]]
    payload = [{"fmt": qt.FORMATS[fmt], "n": n, "rows": rows, "cols": cols, "w": base64.b64encode(raw).decode(),
                "scale": None if s is None else b64(s.astype("<f4")), "x": b64(x.astype("<f4"))}
               for fmt, (n, rows, cols, raw, s, x) in cases]
    got = browser_page.evaluate(RUN, {"cases": payload})
    assert got["relaxed"] is True, "this Chromium has no relaxed SIMD: the relaxed build is never loaded here"
    differ = []
    for name in ("cpu", "cpu_relaxed"):
        runs = got["runs"][name]
        assert isinstance(runs, list), f"{name}.wasm did not instantiate: {runs}"
        for (fmt, (n, rows, cols, raw, s, x)), r in zip(cases, runs):
            assert r["status"] == 0, (name, fmt, n, rows, cols, r["status"])
            y = np.frombuffer(base64.b64decode(r["out"]), "<f4").reshape(n, rows)
            diff = first_difference(y, qt.qmatmul(fmt, raw, x, rows, cols, s))
            if diff:
                differ.append(f"{name} {fmt} ({n}, {rows}, {cols}): {diff}")
    assert not differ, "\n".join(differ)
