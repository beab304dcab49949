// The page said while the database is unavailable: load the page asked for again as soon
// as /healthz says the database answers.
setInterval(function () {
  fetch("/healthz", { cache: "no-store" }).then(function (answer) {
    if (answer.ok) window.location.reload();
  }).catch(function () {});
}, 3000);
