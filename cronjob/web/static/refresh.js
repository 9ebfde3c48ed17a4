// jobrunner's dashboard: the page reloads itself every few seconds (the server's
// data-refresh on <body>), unless the viewer paused it (kept in localStorage, for every
// page of the dashboard), is typing in a field, or has the tab hidden. A reload asks for
// the same address with GET: no form is sent again, and the browser keeps the scroll.
(function () {
  "use strict";
  var KEY = "jobrunner.refresh";
  var body = document.body;
  var url = new URL(window.location.href);
  // An action's confirmation is said once: a reload must not say it again.
  if (url.searchParams.has("done")) {
    url.searchParams.delete("done");
    window.history.replaceState(window.history.state, "", url.pathname + url.search + url.hash);
  }
  var seconds = parseFloat(body.getAttribute("data-refresh") || "0");
  var button = document.getElementById("refresh-toggle");
  if (!(seconds > 0) || !button) {
    return;
  }

  function paused() {
    try {
      return window.localStorage.getItem(KEY) === "paused";
    } catch (e) {
      return false;
    }
  }

  function show() {
    var off = paused();
    button.textContent = off ? "Resume auto-refresh" : "Pause auto-refresh";
    button.setAttribute("aria-pressed", off ? "true" : "false");
    body.setAttribute("data-refresh-state", off ? "paused" : "on");
  }

  // A field being typed in, or holding what was typed, would be lost by a reload.
  function busy() {
    var active = document.activeElement;
    if (active && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) {
      return true;
    }
    var fields = document.querySelectorAll("input, textarea");
    for (var i = 0; i < fields.length; i += 1) {
      if (fields[i].type !== "hidden" && fields[i].value !== fields[i].defaultValue) {
        return true;
      }
    }
    return false;
  }

  button.addEventListener("click", function () {
    try {
      if (paused()) {
        window.localStorage.removeItem(KEY);
      } else {
        window.localStorage.setItem(KEY, "paused");
      }
    } catch (e) {
      // Storage refused (a private window's policy): the page keeps refreshing.
    }
    show();
  });
  button.hidden = false;
  show();

  var skipped = 0;
  window.setInterval(function () {
    if (paused() || busy() || document.hidden) {
      skipped += 1;
      body.setAttribute("data-refresh-skipped", String(skipped));
      return;
    }
    window.location.reload();
  }, seconds * 1000);
})();
