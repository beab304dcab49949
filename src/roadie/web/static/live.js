// Live run page: follow the run's server-sent events and let htmx redraw the live part.
document.addEventListener("DOMContentLoaded", function () {
  var live = document.querySelector("[data-stream]");
  if (!live || !window.EventSource) return;
  var source = new EventSource(live.dataset.stream);
  var refresh = function () { htmx.trigger(live, "refresh"); };
  source.addEventListener("run", refresh);
  source.addEventListener("end", function () { refresh(); source.close(); live.dataset.ended = "true"; });
});
