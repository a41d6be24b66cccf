// HRM web planner, hrm fit's page: the machine, the model, the context (the tokens generated, the
// parallel users or a server's load if given) -> /api/fit -> the lines hrm fit prints (the server's
// hrm.analysis.fit.fit_report and hrm.analysis.fit_load.load_fit_lines: none is formatted here).
// requests.js, loaded before it, keeps only the latest Fit's answer.
"use strict";

// the machine's fields: a shipped profile, or parts from the catalog
const MACHINE = {profile: ["hw"], parts: ["gpu", "cpu", "ram"]};

function fitFields() {
  const kind = document.querySelector('input[name="machine"]:checked').value;
  const out = {};
  for (const name of [...MACHINE[kind], "model", "weight_dtype", "weight_format", "context", "gen", "users",
                      "rate_per_s", "requests"]) {
    const value = $(name).value.trim();
    if (value !== "") out[name] = value;
  }
  return out;
}

// the body: JSON, or a multipart form with the files: the profile's (with a profile) and the
// model's (a GGUF's first bytes only: the server reads its header, never its weights)
function fitBody(shared) {
  const profile = $("machine-profile").checked ? $("hw_file").files[0] : undefined;
  const model = $("model_file").files[0];
  if (!profile && !model) return shared;
  const form = new FormData();
  for (const [name, value] of Object.entries(shared)) form.append(name, value);
  if (profile) form.append("hw_file", profile);
  if (model) form.append("model_file", model.slice(0, Number(document.body.dataset.ggufHeadBytes)), model.name);
  return form;
}

function list(id, lines) {
  const ul = $(id);
  ul.replaceChildren();
  for (const line of lines) text(ul.appendChild(document.createElement("li")), line);
}

function clearFit() {
  for (const id of ["fit-heading", "fit-command", "fit-predicted", "fit-memory"]) text($(id), "");
  for (const key of ["decode", "prefill", "p90"]) delete $("fit-predicted").dataset[key];
  for (const id of ["fit-why", "fit-runners", "fit-ollama", "fit-servers", "fit-notes"]) $(id).replaceChildren();
  const share = $("share-url");
  share.href = "#";
  text(share, "");
  delete document.body.dataset.fitted;
}

// a server's load (hrm fit --rate-per-s): the lines hrm fit prints, in the same places
function showLoadFit(answer) {
  const lines = answer.report.lines;
  const command = answer.best.command;
  text($("fit-heading"), lines[0]);
  text($("fit-command"), command);
  text($("fit-predicted"), lines[1].trim().slice(command.length + 2)).dataset.p90 = answer.best.latency_p90_s;
  const runners = lines.indexOf("runners-up:");
  list("fit-why", [lines[2], lines[3].trim(), lines[4]]);
  list("fit-runners", runners < 0 ? [] : lines.slice(runners + 1).map((line) => line.trim()));
  list("fit-ollama", ["-"]);
  list("fit-servers", ["-"]);
  list("fit-notes", answer.report.notes.length ? answer.report.notes : ["-"]);
}

function showFit(answer) {
  if (answer.report.lines) return showLoadFit(answer);
  const report = answer.report;
  text($("fit-heading"), report.heading);
  text($("fit-command"), report.command);
  const predicted = text($("fit-predicted"), report.predicted);
  predicted.dataset.decode = answer.best.decode_tok_s;
  predicted.dataset.prefill = answer.best.prefill_tok_s;
  text($("fit-memory"), report.memory);
  list("fit-why", report.why);
  list("fit-runners", report.runners_up);
  list("fit-ollama", report.ollama.length ? report.ollama : ["-"]);
  list("fit-servers", report.servers.length ? report.servers : ["-"]);
  list("fit-notes", report.notes.length ? report.notes : ["-"]);
}

async function fit(event) {
  if (event) event.preventDefault();
  const {mine, signal} = begin();
  clearFit();
  const shared = fitFields();
  const started = performance.now();
  say("busy", "fitting…");
  const answer = await post("/api/fit", fitBody(shared), signal);
  if (answer === null || !latest(mine)) return;
  if (!answer.ok) {
    clearFit();
    $("results").hidden = true;
    say("error", `error: ${answer.data.error}`);
    return;
  }
  const query = shareQuery(shared, answer.data.uploads);
  history.replaceState(null, "", `/fit?${query}`);
  const url = `${location.origin}/fit?${query}`;
  $("results").hidden = false;
  showFit(answer.data);
  const share = $("share-url");
  share.href = url;
  const held = Object.values(answer.data.uploads || {});
  text(share, held.length ? `${url} (holds ${held.join(" and ")}: whoever opens it uploads the file again)` : url);
  say("done", `fitted in ${((performance.now() - started) / 1000).toFixed(2)} s`);
  document.body.dataset.fitted = String(mine);
}

document.addEventListener("DOMContentLoaded", () => {
  $("fit").addEventListener("submit", fit);
  // choosing a profile or a part picks that kind of machine
  for (const name of ["hw", "hw_file"]) $(name).addEventListener("change", () => { $("machine-profile").checked = true; });
  for (const name of MACHINE.parts) $(name).addEventListener("change", () => { $("machine-parts").checked = true; });
  if (document.body.dataset.autorun === "yes") fit(null);
});
