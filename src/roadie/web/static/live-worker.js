// One live connection for every tab of the site (a SharedWorker). A browser allows six
// connections to one host over HTTP/1.1: with a stream per tab, the seventh tab's pages
// would not load. Each tab tells this worker what it follows ("runs", "run:5",
// "ledger:5"...); the worker keeps ONE stream of all of them (/live/streams) and hands
// each event to the tabs that follow it. A tab says goodbye when it goes, and pings while
// it lives: one that stops pinging (closed without a word) is forgotten.
// While the database is unavailable (the stream says `outage`, or fails), the worker asks
// /healthz every few seconds, tells the tabs (which show a banner), and opens the stream
// again once the database answers.
var tabs = [];
var source = null;
var current = "";
var pending = null;
var checking = null;

function wanted() {
  var keys = {};
  tabs.forEach(function (tab) { tab.subs.forEach(function (key) { keys[key] = true; }); });
  return Object.keys(keys).sort();
}

function reconnect() {
  pending = null;
  var keys = wanted();
  var url = keys.length ? "/live/streams?" + keys.map(function (k) { return "s=" + encodeURIComponent(k); }).join("&") : "";
  if (url === current) {
    // A tab that follows only what is followed already: the stream is open for it too.
    if (source && source.readyState === 1) tellOpen();
    return;
  }
  if (source) source.close();
  source = null;
  current = url;
  if (!url) return;
  source = new EventSource(url);
  source.onopen = function () {
    tabs.forEach(function (tab) { tab.told = false; });
    tellOpen();
  };
  source.onerror = function () { outage(null); };
  source.addEventListener("outage", function (event) { outage(JSON.parse(event.data).data || null); });
  ["run", "end", "change", "watching"].forEach(function (name) {
    source.addEventListener(name, function (event) {
      var message = JSON.parse(event.data);
      send(message.sub, name, message.data);
    });
  });
}

function outage(said) {
  if (source) source.close();
  source = null;
  current = "";
  if (checking !== null) return;
  check(said);
}

function check(said) {
  checking = setTimeout(function () {
    fetch("/healthz", { cache: "no-store" }).then(function (answer) {
      return answer.json().then(function (health) { return { ok: answer.ok, health: health }; });
    }).then(function (got) {
      if (got.ok) {
        checking = null;
        send(null, "health", { ok: true });
        reconnect();
      } else {
        var database = got.health.database || {};
        send(null, "health", { ok: false, state: database.state, reason: database.reason });
        check(null);
      }
    }).catch(function () {
      send(null, "health", { ok: false, state: "unreachable", reason: "the server does not answer" });
      check(null);
    });
  }, said === null ? 2000 : 0);
}

// The set of subscriptions changes in bursts (a tab opening sends its list once): wait a
// moment, then open one stream for the new set.
function soon() {
  if (pending === null) pending = setTimeout(reconnect, 50);
}

function tellOpen() {
  tabs.forEach(function (tab) {
    if (!tab.told) { tab.told = true; tab.port.postMessage({ sub: null, name: "open", data: null }); }
  });
}

function send(sub, name, data) {
  tabs.forEach(function (tab) {
    if (sub === null || tab.subs.indexOf(sub) >= 0) tab.port.postMessage({ sub: sub, name: name, data: data });
  });
}

onconnect = function (event) {
  var tab = { port: event.ports[0], subs: [], seen: Date.now(), told: false };
  tabs.push(tab);
  tab.port.onmessage = function (message) {
    var said = message.data || {};
    tab.seen = Date.now();
    if (said.subs) { tab.subs = said.subs.slice(0, 64); soon(); }
    if (said.bye) { tabs = tabs.filter(function (t) { return t !== tab; }); soon(); }
  };
  tab.port.start();
};

setInterval(function () {
  var now = Date.now();
  var before = tabs.length;
  tabs = tabs.filter(function (tab) { return now - tab.seen < 30000; });
  if (tabs.length !== before) soon();
}, 10000);
