// Live run page: follow the run's server-sent events and let htmx redraw the live part.
document.addEventListener("DOMContentLoaded", function () {
  var live = document.querySelector("[data-stream]");
  if (!live || !window.EventSource) return;
  var source = new EventSource(live.dataset.stream);
  var refresh = function () { htmx.trigger(live, "refresh"); };
  source.addEventListener("run", refresh);
  source.addEventListener("end", function () { refresh(); source.close(); live.dataset.ended = "true"; });
});

// Live lists (runs, a ledger, leases, workers): one stream per list; on each `change`,
// htmx fetches the page again and swaps in the list (the element of the same id).
document.addEventListener("DOMContentLoaded", function () {
  if (!window.EventSource) return;
  document.querySelectorAll("[data-watch]").forEach(function (watched) {
    var id = watched.id;
    var source = new EventSource(watched.dataset.watch);
    source.addEventListener("change", function () {
      var now = document.getElementById(id);
      if (now) htmx.trigger(now, "refresh");
    });
    window.addEventListener("pagehide", function () { source.close(); });
  });
});

// A form that does what is hard to take back asks first, in words saying what will happen.
document.addEventListener("submit", function (event) {
  var ask = event.target.dataset ? event.target.dataset.confirm : null;
  if (ask && !window.confirm(ask)) event.preventDefault();
}, true);
