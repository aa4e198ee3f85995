// The console's progressive enhancement: every page works without it.
// - a form's submit buttons are disabled once it is sent (a double click sends once;
//   the server does not rely on it: replays and triggers are idempotent there too);
// - "select all" boxes; the queues table refreshes itself from its JSON endpoint, its
//   charts from their fragment, the runs page from its own address.
"use strict";
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.method.toLowerCase() !== "post") return;
  setTimeout(() => form.querySelectorAll("button[type=submit]").forEach((b) => {
    b.disabled = true;
  }), 0);
});
document.addEventListener("change", (event) => {
  const box = event.target;
  const name = box.dataset && box.dataset.selectAll;
  if (!name) return;
  box.form.querySelectorAll(`input[name="${name}"]:not(:disabled)`).forEach((other) => {
    other.checked = box.checked;
  });
});
const seconds = (value) => (value === null || value === undefined ? "-" : `${Math.round(value)} s`);
const plain = (value, none) => (value === null || value === undefined ? none : String(value));
const SHOW = {
  depth: (r) => plain(r.depth, "-"),
  oldest_age: (r) => seconds(r.oldest_age),
  slo: (r) => (r.slo ? seconds(r.slo) : "-"),
  delayed: (r) => plain(r.delayed, "-"),
  next_due_in: (r) => seconds(r.next_due_in),
  in_flight: (r) => plain(r.in_flight, "-"),
  in_inboxes: (r) => plain(r.in_inboxes, "-"),
  consumers: (r) => plain(r.consumers, "?"),
  consumers_alive: (r) => plain(r.consumers_alive, "-"),
  in_per_s: (r) => (r.in_per_s === null || r.in_per_s === undefined ? "-" : r.in_per_s.toFixed(1)),
  out_per_s: (r) => (r.out_per_s === null || r.out_per_s === undefined ? "-" : r.out_per_s.toFixed(1)),
};
function live(marker) {
  const every = Number(marker.dataset.every || 5) * 1000;
  const refresh = async () => {
    try {
      const reply = await fetch(marker.dataset.live, { headers: { accept: "application/json" } });
      if (!reply.ok) throw new Error(String(reply.status));
      for (const row of (await reply.json()).queues) {
        const tr = document.querySelector(`tr[data-queue="${CSS.escape(row.queue)}"]`);
        if (!tr) continue;
        tr.classList.toggle("late", Boolean(row.late));
        for (const [field, show] of Object.entries(SHOW)) {
          const cell = tr.querySelector(`[data-field="${field}"]`);
          if (cell) cell.textContent = show(row);
        }
      }
      marker.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      marker.textContent = `not updated (${error.message}): showing the last reading`;
    }
  };
  setInterval(refresh, every);
}
document.querySelectorAll("[data-live]").forEach(live);
// The runs page: its live parts (running, stuck, the recent list) are fetched again with
// the page's own address and swapped in, unless the operator is typing in one of them.
function refresher(marker) {
  const every = Number(marker.dataset.every || 5) * 1000;
  const targets = marker.dataset.refresh.split(",");
  const refresh = async () => {
    if (document.hidden) return;
    const active = document.activeElement;
    if (active && active.closest && targets.some((t) => active.closest(t))) return;
    try {
      const reply = await fetch(window.location.href, { headers: { accept: "text/html" } });
      if (!reply.ok) throw new Error(String(reply.status));
      const fresh = new DOMParser().parseFromString(await reply.text(), "text/html");
      for (const selector of targets) {
        const now = document.querySelector(selector);
        const next = fresh.querySelector(selector);
        if (now && next) now.replaceWith(document.importNode(next, true));
      }
      marker.textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      marker.textContent = `not updated (${error.message}): showing the last reading`;
    }
  };
  setInterval(refresh, every);
}
document.querySelectorAll("[data-refresh]").forEach(refresher);
// The queues' charts: the server draws them; the fragment is fetched again each minute.
function liveCharts(section) {
  const every = Number(section.dataset.every || 60) * 1000;
  setInterval(async () => {
    try {
      const reply = await fetch(section.dataset.charts, { headers: { accept: "text/html" } });
      if (reply.ok) section.innerHTML = await reply.text();
    } catch (error) {
      // keep the last drawing
    }
  }, every);
}
document.querySelectorAll("[data-charts]").forEach(liveCharts);
