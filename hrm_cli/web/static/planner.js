// HRM web planner: the form -> the JSON API (/api/view, then /api/compare, /api/exports and the
// figures) -> the tables.
// Vanilla JavaScript, shipped with the package (no CDN): the page works offline. requests.js,
// loaded before it, keeps only the latest Plan's answers ($, text, begin, latest, post, say).
"use strict";

const FIELDS = ["hw", "model", "routing", "workload", "prompt_len", "max_prompt_len", "gen_len", "engine",
  "objective", "max_tpot_ms", "max_ttft_s", "fix"];
const SLIDERS = ["link_gbps", "cpu_scale", "gpu_mem", "cpu_mem"];
let planUrl = null;

function fmt(value, digits = 1) {
  return Number(value).toLocaleString("en-US", {minimumFractionDigits: digits, maximumFractionDigits: digits});
}
function sig(value) {  // 3 significant digits, as the CLI's tables
  return Math.abs(value) >= 100 ? fmt(value, 0) : Number(value).toPrecision(3);
}
function gib(bytes) { return fmt(bytes / 2 ** 30, 2) + " GiB"; }
function policyText(p) {
  return `N=${p.batch_size} mu=${p.micro_batch_size} n=${p.num_micro_batches} attn=${p.attn_on_gpu ? "gpu" : "cpu"} ` +
    `ffn=${p.ffn_on_gpu ? "gpu" : "cpu"} rw=${Number(p.weights_gpu_ratio).toFixed(4)} rc=${Number(p.kv_gpu_ratio).toFixed(4)}`;
}
function cell(row, value) { text(row.insertCell(), value); }

// the fields the URL and the API carry (uploads are not in the URL)
function fields() {
  const out = {};
  for (const name of FIELDS) {
    const value = $(name).value.trim();
    if (value !== "") out[name] = value;
  }
  if ($("padding").checked) out.padding = "true";
  for (const name of SLIDERS) if ($(name).dataset.set === "1") out[name] = $(name).value;
  return out;
}

async function uploads() {
  const out = {};
  for (const [input, key, label] of [["hw_file", "hw_yaml", "hw_name"], ["model_file", "model_config", "model_name"]]) {
    const file = $(input).files[0];
    if (file) { out[key] = await file.text(); out[label] = file.name; }
  }
  return out;
}

// the sections a plan fills, emptied: before each plan and on an error
function clearResults() {
  for (const id of ["out-title", "out-policy", "out-throughput", "out-decode", "out-tpot", "out-tpot-step", "out-ttft",
    "out-bottleneck", "out-binding", "out-pick", "out-notes"]) text($(id), "");
  delete $("out-throughput").dataset.value;
  $("memory").replaceChildren();
  $("explain").tBodies[0].replaceChildren();
  text($("explain-definition"), "");
  $("compare").tBodies[0].replaceChildren();
  $("exports").replaceChildren();
  for (const id of ["fig-roofline", "fig-timeline"]) {
    const img = $(id);
    img.removeAttribute("src");
    img.dataset.loading = "yes";
    img.closest("figure").classList.add("loading");
  }
  const share = $("share-url");
  share.href = "#";
  text(share, "");
  delete document.body.dataset.compared;
  delete document.body.dataset.exported;
  delete document.body.dataset.planned;
}

function showSummary(view) {
  const plan = view.plan, est = plan.estimate;
  text($("out-title"), view.title);
  text($("out-policy"), view.policy);
  const tput = text($("out-throughput"), fmt(est.generation_throughput_tok_s));
  tput.dataset.value = est.generation_throughput_tok_s;
  text($("out-decode"), fmt(est.decode_throughput_tok_s));
  text($("out-tpot"), sig(view.tpot_ms));
  text($("out-tpot-step"), `(one decode step of the whole batch: each of its ${fmt(plan.policy.batch_size, 0)} ` +
    `sequences gets one token per step)`);
  text($("out-ttft"), sig(view.ttft_s));
  const busy = Object.entries(view.utilization).map(([k, v]) => `${k} ${Math.round(v * 100)}%`).join(", ");
  text($("out-bottleneck"), `${est.bottleneck} (${busy} busy)`);
  text($("out-binding"), view.binding_memory);
  const pick = plan.server_pick;
  text($("out-pick"), !pick ? "-" : pick.unavailable ? `none: ${pick.unavailable}` :
    `${policyText(pick.policy)}: ${fmt(pick.generation_throughput_tok_s)} tok/s (${pick.program})`);
  text($("out-notes"), view.notes.join(" · ") || "-");
  const memory = $("memory");
  memory.replaceChildren();
  for (const tier of view.memory) {
    const row = document.createElement("div");
    row.className = "tier";
    const share = Math.min(1, tier.used_bytes / tier.capacity_bytes);
    row.innerHTML = `<span class="name"></span><span class="bar"><span class="fill"></span></span><span class="value"></span>`;
    text(row.querySelector(".name"), tier.tier);
    row.querySelector(".fill").style.width = `${(share * 100).toFixed(1)}%`;
    text(row.querySelector(".value"), `${gib(tier.used_bytes)} / ${gib(tier.capacity_bytes)} (${Math.round(share * 100)}%)`);
    memory.appendChild(row);
  }
  const body = $("explain").tBodies[0];
  body.replaceChildren();
  text($("explain-definition"), view.explain.share_definition || "");
  if (view.explain.error) { cell(body.insertRow(), view.explain.error); }
  else if (!view.explain.mechanisms.length) { cell(body.insertRow(), "engine ideal: no mechanism to explain"); }
  for (const m of view.explain.mechanisms || []) {
    if (!m.total_s && !m.gpu_bytes && !m.cpu_bytes) continue;  // a mechanism that costs nothing here
    const row = body.insertRow();
    cell(row, m.label); cell(row, sig(m.decode_layer_s * 1e3)); cell(row, sig(m.prefill_s));
    cell(row, sig(m.total_s)); cell(row, `${Math.round(m.share_of_gap * 100)}%`);
  }
  if (planUrl) URL.revokeObjectURL(planUrl);
  planUrl = URL.createObjectURL(new Blob([JSON.stringify(plan, null, 2)], {type: "application/json"}));
  $("download-plan").href = planUrl;
}

function showExports(result) {
  const exports = $("exports");
  exports.replaceChildren();
  if (!result.ok) { text(exports.appendChild(document.createElement("p")), result.data.error); return; }
  for (const [target, out] of Object.entries(result.data)) {
    const box = document.createElement("div");
    box.className = "export";
    text(box.appendChild(document.createElement("h4")), target + (out.exact === false ? " (nearest / re-planned)" : ""));
    text(box.appendChild(document.createElement(out.error ? "p" : "pre")), out.error || out.commands.join("\n"));
    exports.appendChild(box);
  }
}

function showCompare(result) {
  const body = $("compare").tBodies[0];
  body.replaceChildren();
  if (!result.ok) { cell(body.insertRow(), result.data.error); return; }
  let rank = 0;
  for (const [label, plan] of Object.entries(result.data)) {
    const row = body.insertRow();
    if (typeof plan === "string") { cell(row, "-"); cell(row, label); cell(row, plan); continue; }
    const est = plan.estimate, p = plan.policy;
    cell(row, ++rank); cell(row, label);
    cell(row, policyText(p));
    cell(row, fmt(est.generation_throughput_tok_s)); cell(row, fmt(est.decode_throughput_tok_s));
    cell(row, sig(est.breakdown.per_token_latency_s * 1e3));
    cell(row, sig(est.prefill_latency_s)); cell(row, est.bottleneck);
  }
}

async function showFigure(img, kind, query, body, hasUploads, mine, signal) {
  const loaded = () => {
    if (!latest(mine)) return;
    delete img.dataset.loading;
    img.closest("figure").classList.remove("loading");
  };
  if (!hasUploads) {
    img.onload = loaded;
    img.onerror = loaded;
    img.src = `/plot/${kind}.svg?${query}`;
    return;
  }
  try {
    const response = await fetch(`/api/plot/${kind}.svg`, {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify(body), signal});
    if (!latest(mine)) return;
    if (response.ok) { img.onload = loaded; img.src = URL.createObjectURL(await response.blob()); }
    else loaded();
  } catch (e) { if (e.name !== "AbortError") loaded(); }
}

async function plan(event) {
  if (event) event.preventDefault();
  const {mine, signal} = begin();
  clearResults();
  const shared = fields();
  const body = {...shared, ...(await uploads())};
  if (!latest(mine)) return;
  const hasUploads = "hw_yaml" in body || "model_config" in body;
  const query = new URLSearchParams(shared).toString();
  const started = performance.now();
  say("busy", "planning…");
  // the plan first, alone; every engine, the exports and the figures once it is shown
  const view = await post("/api/view", body, signal);
  if (view === null || !latest(mine)) return;
  if (!view.ok) {
    clearResults();
    $("results").hidden = true;
    say("error", `error: ${view.data.error}`);
    return;
  }
  const sharedQuery = shareQuery(shared, view.data.uploads);
  history.replaceState(null, "", `/?${sharedQuery}`);
  const url = `${location.origin}/?${sharedQuery}`;
  $("results").hidden = false;
  showSummary(view.data);
  const share = $("share-url");
  share.href = url;
  const held = Object.values(view.data.uploads || {});
  text(share, held.length ? `${url} (holds ${held.join(" and ")}: whoever opens it uploads the file again)` : url);
  say("done", `planned in ${((performance.now() - started) / 1000).toFixed(2)} s (search ${view.data.solve_s.toFixed(2)} s)`);
  document.body.dataset.planned = String(mine);
  showFigure($("fig-roofline"), "roofline", query, body, hasUploads, mine, signal);
  showFigure($("fig-timeline"), "timeline", query, body, hasUploads, mine, signal);
  const compareBody = {...body};
  delete compareBody.engine;
  const exported = post("/api/exports", body, signal).then((result) => {
    if (result === null || !latest(mine)) return;
    showExports(result);
    document.body.dataset.exported = String(mine);
  });
  const compared = await post("/api/compare", compareBody, signal);
  if (compared !== null && latest(mine)) {
    showCompare(compared);
    document.body.dataset.compared = String(mine);
  }
  await exported;
}

function slider(input) {
  const out = document.querySelector(`output[for="${input.id}"]`);
  out.textContent = input.dataset.set === "1" ? input.value : "unset";
}

document.addEventListener("DOMContentLoaded", () => {
  $("planner").addEventListener("submit", plan);
  for (const name of SLIDERS) {
    const input = $(name);
    slider(input);
    input.addEventListener("input", () => { input.dataset.set = "1"; slider(input); });
  }
  $("reset-whatif").addEventListener("click", () => {
    for (const name of SLIDERS) { delete $(name).dataset.set; slider($(name)); }
  });
  if (document.body.dataset.autorun === "yes") plan(null);
});
