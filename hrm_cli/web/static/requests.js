// The web planner's pages (planner.js, fit.js): the requests of a submit, of which only the
// latest's answers are shown. Each submit calls begin(), which aborts the requests of the one
// before (the server drops those that have not started), and every reply is checked with
// latest(mine) before it touches the page.
"use strict";

const $ = (id) => document.getElementById(id);
function text(el, value) { el.textContent = value; return el; }

let generation = 0;
let controller = null;
function latest(mine) { return mine === generation; }
function begin() {
  if (controller) controller.abort();
  controller = new AbortController();
  return {mine: ++generation, signal: controller.signal};
}

// POST a JSON object, or a FormData (multipart: a file's bytes); null once a newer submit aborted it
async function post(path, body, signal) {
  const init = body instanceof FormData ? {method: "POST", body, signal} :
    {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body), signal};
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    if (e.name === "AbortError") return null;  // a newer submit took over
    return {ok: false, status: 0, data: {error: `no answer from the server (${e.message})`}};
  }
  let data;
  try { data = await response.json(); } catch (e) { data = {error: `HTTP ${response.status}`}; }
  return {ok: response.ok, status: response.status, data};
}

// the status line: "busy", "done" or "error"
function say(state, message) {
  const status = $("status");
  text(status, message);
  status.className = state;
}

// the URL's fields: the form's, with an upload named as the answer names it (model=upload:NAME)
function shareQuery(shared, uploads) {
  return new URLSearchParams({...shared, ...(uploads || {})}).toString();
}
