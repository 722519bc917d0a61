// cache_panel.mjs — the page's list of cached weight files (web/weight_cache.mjs through exactspec.mjs):
// each with its size and a Forget button, their total, and Forget all. Pure rendering over a list;
// the page passes the list and what a click does.
//   renderCachePanel(listElement, totalElement, models, { onForget: (sha256 | null) => ... })

/** "98.4 MB" */
export const megabytes = (bytes) => `${(bytes / 1e6).toFixed(1)} MB`;

/** One line of text per cached file: its name (or its sha256's start), size and when it was stored. */
export function cachedModelText(m) {
  const when = m.stored_at ? `, stored ${m.stored_at.slice(0, 16).replace("T", " ")} UTC` : "";
  return `${m.name ?? `sha256 ${m.sha256.slice(0, 12)}…`}: ${megabytes(m.bytes)}${when}`;
}

/** The summary's words for a list: "none" or "2 files, 112.2 MB". */
export function cacheTotalText(models) {
  if (!models.length) return "none";
  return `${models.length} file${models.length === 1 ? "" : "s"}, ${megabytes(models.reduce((n, m) => n + m.bytes, 0))}`;
}

export function renderCachePanel(list, total, models, { onForget }) {
  total.textContent = cacheTotalText(models);
  list.replaceChildren(...models.map((m) => {
    const li = document.createElement("li");
    const text = document.createElement("span");
    text.textContent = cachedModelText(m);
    text.title = `sha256 ${m.sha256}\n${m.urls.join("\n")}`;
    const forget = document.createElement("button");
    forget.type = "button";
    forget.textContent = "Forget";
    forget.setAttribute("aria-label", `Forget ${m.name ?? m.sha256}`);
    forget.onclick = () => onForget(m.sha256);
    li.append(text, " ", forget);
    return li;
  }));
}
