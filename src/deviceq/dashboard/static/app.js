// deviceq dashboard: live updates over Server-Sent Events (no third-party code).
// Pages marked data-live="refresh" re-render their #content from the server when the pool's
// event stream moves (at most once a second); the Events page appends the events themselves.
"use strict";
(function () {
  var body = document.body;
  var mode = body.getAttribute("data-live");
  var badge = document.getElementById("live");
  var content = document.getElementById("content");

  function setLive(on) {
    if (!badge) return;
    badge.className = on ? "live on" : "live off";
    body.setAttribute("data-stream", on ? "open" : "closed");
  }

  // confirmation of actions (event delegation: #content is replaced by live refreshes)
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var msg = form && form.getAttribute && form.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });

  // inputs marked data-keep (the task list's check boxes, the bulk limit) keep what the
  // operator set across live refreshes of #content
  function keep() {
    var out = {};
    if (!content) return out;
    content.querySelectorAll("input[data-keep]").forEach(function (el) {
      if (el.id) out[el.id] = el.type === "checkbox" ? el.checked : el.value;
    });
    return out;
  }
  function restore(kept) {
    Object.keys(kept).forEach(function (id) {
      var el = document.getElementById(id);
      if (!el) return;
      if (el.type === "checkbox") el.checked = kept[id]; else el.value = kept[id];
    });
  }
  // "check all" of the task list
  document.addEventListener("change", function (ev) {
    var box = ev.target;
    if (!box || box.id !== "check-all") return;
    document.querySelectorAll("#tasks input.pick").forEach(function (el) {
      el.checked = box.checked;
    });
  });

  // a running attempt's live log (task page): chunks appended as they come, until "end"
  var logPre = document.getElementById("task-log");
  var logUrl = logPre && logPre.getAttribute("data-log-stream");
  if (window.EventSource && logUrl) {
    var logState = document.getElementById("log-state");
    var les = new EventSource(logUrl);
    les.onmessage = function (ev) {
      var chunk = JSON.parse(ev.data);
      var span = document.createElement("span");
      span.className = "log-" + chunk.stream;
      span.textContent = chunk.text;
      var atEnd = logPre.scrollTop + logPre.clientHeight >= logPre.scrollHeight - 4;
      logPre.appendChild(span);
      if (atEnd) logPre.scrollTop = logPre.scrollHeight;
    };
    les.addEventListener("end", function () {
      les.close();
      logPre.setAttribute("data-log-state", "ended");
      if (logState) logState.textContent = "ended";
    });
  }

  if (!window.EventSource || !mode || mode === "off") return;

  if (mode === "refresh") {
    var pending = false, running = false, last = 0, refreshes = 0;
    var refresh = function () {
      if (running) { pending = true; return; }
      running = true; pending = false; last = Date.now();
      fetch(window.location.href, { headers: { "X-Dashboard-Partial": "1" }, credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html !== null && content) {
            var kept = keep();
            content.innerHTML = html;
            restore(kept);
            refreshes += 1;
            body.setAttribute("data-refreshes", String(refreshes));
          }
        })
        .catch(function () {})
        .then(function () {
          running = false;
          if (pending) schedule();
        });
    };
    var timer = null;
    var schedule = function () {
      if (timer) return;
      var wait = Math.max(300, 1000 - (Date.now() - last));
      timer = setTimeout(function () { timer = null; refresh(); }, wait);
    };
    var es = new EventSource("/api/stream");
    // the stream starts at connect time: refresh once connected, so that an event between
    // the page's render and the connection (a cancel that just completed) is not missed
    es.onopen = function () { setLive(true); schedule(); };
    es.onerror = function () { setLive(false); };
    es.onmessage = function () { schedule(); };
    return;
  }

  if (mode === "events") {
    var table = document.getElementById("events");
    var rows = document.getElementById("event-rows");
    var pause = document.getElementById("e-pause");
    if (!table || !rows) return;
    var MAX_ROWS = 500;
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    var fmt = function (ms) {
      var d = new Date(ms);
      return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) +
        " " + pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds());
    };
    var cell = function (tr, text, cls) {
      var td = document.createElement("td");
      if (cls) td.className = cls;
      if (text !== null) td.textContent = text;
      tr.appendChild(td);
      return td;
    };
    var es2 = new EventSource(table.getAttribute("data-stream"));
    es2.onopen = function () { setLive(true); };
    es2.onerror = function () { setLive(false); };
    es2.onmessage = function (msg) {
      if (pause && pause.checked) return;
      var e;
      try { e = JSON.parse(msg.data); } catch (err) { return; }
      var tr = document.createElement("tr");
      tr.className = "new";
      cell(tr, fmt(e.time_ms));
      cell(tr, e.id, "mono");
      var t = cell(tr, null);
      var span = document.createElement("span");
      span.className = "ev ev-" + String(e.type).replace(/[^A-Za-z0-9_-]/g, "");
      span.textContent = e.type;
      t.appendChild(span);
      var tc = cell(tr, null);
      var task = e.task_id || e.task;
      if (task) {
        var a = document.createElement("a");
        a.className = "mono";
        a.href = "/tasks/" + encodeURIComponent(task);
        a.textContent = task;
        tc.appendChild(a);
      }
      cell(tr, e.host_id || e.host || "");
      cell(tr, e.device_id || e.device || "");
      var skip = ["id", "type", "time_ms", "task", "host", "device", "task_id", "host_id", "device_id"];
      var rest = [];
      Object.keys(e).forEach(function (k) {
        if (skip.indexOf(k) < 0 && e[k] !== "" && e[k] !== null) {
          var v = String(e[k]);
          // a daemon session id: its first characters (as the task page shows it)
          if (k === "session" && v.length > 8) v = v.slice(0, 8) + "\u2026";
          rest.push(k + "=" + v);
        }
      });
      cell(tr, rest.join(" "), "mono");
      rows.insertBefore(tr, rows.firstChild);
      while (rows.children.length > MAX_ROWS) rows.removeChild(rows.lastChild);
    };
  }
})();
