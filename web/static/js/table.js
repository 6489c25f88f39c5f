// The table under the chart: the same points, sortable, selectable with the keyboard.
// One row is in the tab order at a time (roving tabindex): arrows, Home/End and PageUp/PageDown
// move, Enter or Space opens the plan. Column headers are buttons: Enter sorts.

import { bytes, seconds, mfu, html, setHtml } from "./format.js";

const COLUMNS = [
  { key: "label", title: "point", sort: (r) => [r.kind === "baseline" ? 1 : 0, r.kind === "baseline" ? r.label : r.index] },
  { key: "devices", title: "devices", num: true, sort: (r) => [r.devices] },
  { key: "time_s", title: "time / iteration", num: true, sort: (r) => [r.time_s] },
  { key: "memory_bytes", title: "peak memory / device", num: true, sort: (r) => [r.memory_bytes] },
  { key: "mfu", title: "MFU", num: true, sort: (r) => [r.mfu ?? -1] },
  { key: "fits", title: "fits budget", sort: (r) => [r.fits ? 0 : 1] },
  { key: "summary", title: "plan", sort: (r) => [r.summary] },
];

function cmp(a, b) {
  for (let i = 0; i < a.length; i++) {
    if (a[i] < b[i]) return -1;
    if (a[i] > b[i]) return 1;
  }
  return 0;
}

export function createTable(table, { onSelect }) {
  const head = table.tHead.rows[0];
  const body = table.tBodies[0];
  let rows = [];
  let order = [];
  let sort = { key: "time_s", dir: 1 };
  let selected = null;
  let active = null;

  setHtml(head, html`${COLUMNS.map((c) => html`<th scope="col" data-key="${c.key}"><button type="button">${c.title}</button></th>`)}`);
  head.addEventListener("click", (e) => {
    const th = e.target.closest("th");
    if (!th) return;
    const key = th.dataset.key;
    sort = { key, dir: sort.key === key ? -sort.dir : 1 };
    active = null; // the table is entered at the selected row, else at the top of the new order
    render();
  });

  function render() {
    const col = COLUMNS.find((c) => c.key === sort.key);
    order = [...rows].sort((a, b) => sort.dir * cmp(col.sort(a), col.sort(b)) || cmp(COLUMNS[2].sort(a), COLUMNS[2].sort(b)));
    for (const th of head.cells) {
      th.setAttribute("aria-sort", th.dataset.key === sort.key ? (sort.dir > 0 ? "ascending" : "descending") : "none");
    }
    if (active === null || !rows.some((r) => r.id === active)) active = selected ?? (order[0] && order[0].id);
    const out = [];
    for (const r of order) {
      const isSel = r.id === selected;
      out.push(html`<tr data-id="${r.id}" class="${r.kind}" tabindex="${r.id === active ? 0 : -1}" aria-selected="${isSel}"><td><span class="swatch" style="background:${r.color}"></span>${r.kind === "baseline" ? `baseline: ${r.label}` : `#${r.index}`}</td><td class="num">${r.devices}</td><td class="num">${seconds(r.time_s, 4)}</td><td class="num">${bytes(r.memory_bytes, 4)}</td><td class="num">${mfu(r.mfu)}</td><td class="${r.fits ? "" : "nofit"}">${r.fits ? "yes" : "no"}</td><td class="summary">${r.summary}</td></tr>`);
    }
    setHtml(body, html`${out}`);
  }

  function rowEl(id) { return body.querySelector(`tr[data-id="${id}"]`); }

  function move(id, focus = true) {
    const old = rowEl(active);
    if (old) old.tabIndex = -1;
    active = id;
    const el = rowEl(id);
    if (el) {
      el.tabIndex = 0;
      if (focus) el.focus(); // focusing scrolls it into view
    }
  }

  // bring a row into the table's own scroll box, without scrolling the page
  function reveal(el) {
    const wrap = table.parentElement;
    const headH = table.tHead.offsetHeight;
    const top = el.offsetTop, bottom = top + el.offsetHeight;
    if (top - headH < wrap.scrollTop) wrap.scrollTop = top - headH;
    else if (bottom > wrap.scrollTop + wrap.clientHeight) wrap.scrollTop = bottom - wrap.clientHeight;
  }

  body.addEventListener("click", (e) => {
    const tr = e.target.closest("tr");
    if (!tr) return;
    const id = Number(tr.dataset.id);
    move(id);
    onSelect(id);
  });
  body.addEventListener("keydown", (e) => {
    const tr = e.target.closest("tr");
    if (!tr) return;
    const i = order.findIndex((r) => r.id === Number(tr.dataset.id));
    let j = null;
    switch (e.key) {
      case "ArrowDown": j = Math.min(order.length - 1, i + 1); break;
      case "ArrowUp": j = Math.max(0, i - 1); break;
      case "Home": j = 0; break;
      case "End": j = order.length - 1; break;
      case "PageDown": j = Math.min(order.length - 1, i + 10); break;
      case "PageUp": j = Math.max(0, i - 10); break;
      case "Enter": case " ":
        e.preventDefault();
        onSelect(order[i].id);
        return;
      default: return;
    }
    e.preventDefault();
    move(order[j].id);
  });

  return {
    setRows(next) { rows = next; render(); },
    setSelected(id) {
      selected = id;
      for (const tr of body.querySelectorAll('tr[aria-selected="true"]')) tr.setAttribute("aria-selected", "false");
      const el = rowEl(id);
      if (el) { el.setAttribute("aria-selected", "true"); move(id, false); reveal(el); }
    },
    focus() { const el = rowEl(active); if (el) el.focus(); },
    get order() { return order.map((r) => r.id); },
  };
}
