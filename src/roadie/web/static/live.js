// Live pages: the run page redraws its live part on each `run` event, and a list (runs, a
// ledger, leases, workers) fetches its page again and swaps in its table on each
// `change` (htmx), and on `watching`, when its stream has first read what it compares
// against: the page was drawn before that, and what changed in between would otherwise
// go unheard (at a stream's first opening as at every reopening). What a page follows is
// in its elements' data-live ("run:5", "runs", "ledger:5"). Every tab of the browser
// shares one connection through live-worker.js (a SharedWorker); where there is none,
// the page keeps one stream of its own.
(function () {
  var handlers = {};
  var channel = null;

  function subs() { return Object.keys(handlers); }

  // The banner said while the database is unavailable, above the page's content.
  function banner(health) {
    var shown = document.getElementById("outage");
    if (health.ok) {
      if (shown) shown.remove();
      return;
    }
    if (!shown) {
      shown = document.createElement("p");
      shown.id = "outage";
      shown.className = "card banner";
      shown.setAttribute("role", "alert");
      var main = document.querySelector("main");
      main.insertBefore(shown, main.firstChild);
    }
    var why = health.reason ? " (" + health.reason + ")" : "";
    shown.textContent = health.state === "lost"
      ? "The database is gone" + why + ": nothing can be read or written. Restore the file, then restart roadie serve."
      : "The database does not answer" + why + ": changes are refused until it is back. This page updates by itself.";
  }

  function dispatch(message) {
    if (message.sub === null) {
      if (message.name === "health") {
        banner(message.data);
        document.documentElement.dataset.streamState = message.data.ok ? "waking" : "down";
        return;
      }
      // The stream (re)opened. Each list looks again at its stream's `watching`, and a
      // run page redraws at its stream's first `run`: nothing to do here but say so.
      if (message.name === "open") document.documentElement.dataset.streamState = "open";
      return;
    }
    var handler = handlers[message.sub];
    if (handler) handler(message.name, message.data);
  }

  function tell() { if (channel) channel.post({ subs: subs() }); }

  function follow(key, handler) { handlers[key] = handler; }

  function unfollow(key) { delete handlers[key]; tell(); }

  function shared() {
    var worker = new SharedWorker("/static/live-worker.js");
    worker.port.onmessage = function (event) { dispatch(event.data); };
    worker.port.start();
    setInterval(function () { worker.port.postMessage({ ping: true }); }, 10000);
    window.addEventListener("pagehide", function () { worker.port.postMessage({ bye: true }); });
    return { post: function (message) { worker.port.postMessage(message); } };
  }

  function own() {
    var source = null;
    function open() {
      if (source) source.close();
      var keys = subs();
      if (!keys.length || !window.EventSource) return;
      source = new EventSource("/live/streams?" + keys.map(function (k) { return "s=" + encodeURIComponent(k); }).join("&"));
      source.onopen = function () { dispatch({ sub: null, name: "open" }); };
      source.onerror = function () { source.close(); wait(); };
      source.addEventListener("outage", function () { source.close(); wait(); });
      ["run", "end", "change", "watching"].forEach(function (name) {
        source.addEventListener(name, function (event) {
          var message = JSON.parse(event.data);
          dispatch({ sub: message.sub, name: name, data: message.data });
        });
      });
    }
    function wait() {
      setTimeout(function () {
        fetch("/healthz", { cache: "no-store" }).then(function (answer) {
          return answer.json().then(function (health) {
            var database = health.database || {};
            dispatch({ sub: null, name: "health", data: { ok: answer.ok, state: database.state, reason: database.reason } });
            if (answer.ok) open(); else wait();
          });
        }).catch(function () {
          dispatch({ sub: null, name: "health", data: { ok: false, state: "unreachable", reason: "the server does not answer" } });
          wait();
        });
      }, 2000);
    }
    window.addEventListener("pagehide", function () { if (source) source.close(); });
    return { post: open };
  }

  document.addEventListener("DOMContentLoaded", function () {
    var live = document.querySelector("#live[data-live]");
    if (live) {
      var key = live.dataset.live;
      follow(key, function (name) {
        htmx.trigger(live, "refresh");
        if (name === "end") { live.dataset.ended = "true"; unfollow(key); }
      });
    }
    document.querySelectorAll("[data-watch][data-live]").forEach(function (watched) {
      var id = watched.id;
      follow(watched.dataset.live, function () {
        var now = document.getElementById(id);
        if (now) htmx.trigger(now, "refresh");
      });
    });
    if (!subs().length) return;
    channel = window.SharedWorker ? shared() : own();
    tell();
  });
})();

// A form that does what is hard to take back asks first, in words saying what will happen.
document.addEventListener("submit", function (event) {
  var ask = event.target.dataset ? event.target.dataset.confirm : null;
  if (ask && !window.confirm(ask)) event.preventDefault();
}, true);
