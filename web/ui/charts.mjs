// Plain SVG charts as markup strings (pure; the page sets them with innerHTML). Plain SVG, not a
// plotting library: four small charts need no axes engine, add no dependency to the offline
// bundle, and SVG presentation attributes pass the page's CSP (style-src 'self') where a
// library's inline styles would not. Colours come from CSS classes (light and dark schemes).

const W = 320, H = 120, PAD = 28;
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
const fmt = (x, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : "–");

function frame(title, body, ariaLabel) {
  return `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(ariaLabel)}" class="chart">` +
    `<title>${esc(title)}</title>${body}</svg>`;
}

const empty = (title) => frame(title, `<text x="${W / 2}" y="${H / 2}" text-anchor="middle" class="muted">no data yet</text>`, `${title}: no data yet`);

/** Line with dots: the survival curve S_i over positions i = 0..k (y from 0 to 1). */
export function survivalChart(values) {
  const title = "Survival S_i by position";
  if (!values.length) return empty(title);
  const n = Math.max(values.length - 1, 1);
  const x = (i) => PAD + (i * (W - 2 * PAD)) / n, y = (v) => H - PAD + 8 - v * (H - PAD - 8);
  const pts = values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  const dots = values.map((v, i) => `<circle cx="${x(i).toFixed(1)}" cy="${y(v).toFixed(1)}" r="3" class="series"><title>S_${i} = ${fmt(v, 3)}</title></circle>` +
    `<text x="${x(i).toFixed(1)}" y="${H - 4}" text-anchor="middle" class="axis">${i}</text>`).join("");
  const axes = `<line x1="${PAD}" y1="${y(0)}" x2="${W - PAD}" y2="${y(0)}" class="axisline"/>` +
    `<text x="4" y="${y(1) + 4}" class="axis">1</text><text x="4" y="${y(0) + 4}" class="axis">0</text>`;
  return frame(title, `${axes}<polyline points="${pts}" class="series-line"/>${dots}`,
    `${title}: ${values.map((v, i) => `S${i}=${fmt(v, 2)}`).join(", ")}`);
}

/** Bars: accepted tokens per round (outlined bar: proposed; filled: accepted), the last 60 rounds. */
export function roundsChart(accepted, proposed) {
  const title = "Accepted tokens per round";
  if (!accepted.length) return empty(title);
  const from = Math.max(0, accepted.length - 60);
  const a = accepted.slice(from), p = proposed.slice(from);
  const top = Math.max(1, ...p, ...a);
  const bw = (W - 2 * PAD) / a.length;
  const y = (v) => H - PAD + 8 - (v / top) * (H - PAD - 8);
  const bars = a.map((v, i) => {
    const x0 = PAD + i * bw;
    return `<rect x="${x0.toFixed(1)}" y="${y(p[i]).toFixed(1)}" width="${Math.max(bw - 1, 1).toFixed(1)}" height="${(y(0) - y(p[i])).toFixed(1)}" class="bar-outline"/>` +
      `<rect x="${x0.toFixed(1)}" y="${y(v).toFixed(1)}" width="${Math.max(bw - 1, 1).toFixed(1)}" height="${(y(0) - y(v)).toFixed(1)}" class="bar"><title>round ${from + i + 1}: ${v} of ${p[i]} accepted</title></rect>`;
  }).join("");
  const axes = `<text x="4" y="${y(top) + 4}" class="axis">${top}</text><text x="4" y="${y(0) + 4}" class="axis">0</text>` +
    `<text x="${W - PAD}" y="${H - 4}" text-anchor="end" class="axis">round ${accepted.length}</text>`;
  const mean = accepted.reduce((s, v) => s + v, 0) / accepted.length;
  return frame(title, axes + bars, `${title}: ${accepted.length} rounds, mean ${fmt(mean, 2)} accepted`);
}

/** A waterfall: each segment a bar starting where the previous ended, with its milliseconds. */
export function waterfallChart(segments) {
  const title = "Latency waterfall (ms)";
  if (!segments.length) return empty(title);
  const total = segments.reduce((s, g) => s + g.ms, 0) || 1;
  const rowH = Math.min(14, (H * 2 - 8) / segments.length), h = segments.length * rowH + 8, left = 104;
  let at = 0;
  const rows = segments.map((g, i) => {
    const x0 = left + (at / total) * (W - left - 4), w = Math.max(1, (g.ms / total) * (W - left - 4));
    at += g.ms;
    const yy = 4 + i * rowH;
    return `<text x="${left - 4}" y="${(yy + rowH - 4).toFixed(1)}" text-anchor="end" class="axis">${esc(g.label)} ${fmt(g.ms)}</text>` +
      `<rect x="${x0.toFixed(1)}" y="${(yy + 1).toFixed(1)}" width="${w.toFixed(1)}" height="${(rowH - 3).toFixed(1)}" class="bar seg-${i % 5}"><title>${esc(g.label)}: ${fmt(g.ms, 1)} ms</title></rect>`;
  }).join("");
  return `<svg viewBox="0 0 ${W} ${h.toFixed(0)}" role="img" aria-label="${esc(title)}: ${segments.map((g) => `${esc(g.label)} ${fmt(g.ms)} ms`).join(", ")}" class="chart">` +
    `<title>${esc(title)}</title>${rows}</svg>`;
}

/** Horizontal bars: bytes by category (MiB). */
export function memoryChart(categories) {
  const title = "Memory by category (MiB)";
  const items = Object.entries(categories).filter(([, b]) => Number.isFinite(b) && b > 0);
  if (!items.length) return empty(title);
  const top = Math.max(...items.map(([, b]) => b)), left = 120, rowH = 18;
  const rows = items.map(([name, b], i) => {
    const w = Math.max(1, (b / top) * (W - left - 50)), yy = 4 + i * rowH;
    return `<text x="${left - 4}" y="${yy + 12}" text-anchor="end" class="axis">${esc(name)}</text>` +
      `<rect x="${left}" y="${yy + 2}" width="${w.toFixed(1)}" height="${rowH - 6}" class="bar"><title>${esc(name)}: ${b} bytes</title></rect>` +
      `<text x="${(left + w + 4).toFixed(1)}" y="${yy + 12}" class="axis">${fmt(b / 1048576, 1)}</text>`;
  }).join("");
  return `<svg viewBox="0 0 ${W} ${items.length * rowH + 8}" role="img" aria-label="${esc(title)}: ${items.map(([n, b]) => `${esc(n)} ${fmt(b / 1048576, 1)}`).join(", ")}" class="chart">` +
    `<title>${esc(title)}</title>${rows}</svg>`;
}
