// One live connection for every tab of the site (a SharedWorker). A browser allows six
// connections to one host over HTTP/1.1: with a stream per tab, the seventh tab's pages
// would not load. Each tab tells this worker what it follows ("runs", "run:5",
// "ledger:5"...); the worker keeps ONE stream of all of them (/live/streams) and hands
// each event to the tabs that follow it. A tab says goodbye when it goes, and pings while
// it lives: one that stops pinging (closed without a word) is forgotten.
var tabs = [];
var source = null;
var current = "";
var pending = null;

function wanted() {
  var keys = {};
  tabs.forEach(function (tab) { tab.subs.forEach(function (key) { keys[key] = true; }); });
  return Object.keys(keys).sort();
}

function reconnect() {
  pending = null;
  var keys = wanted();
  var url = keys.length ? "/live/streams?" + keys.map(function (k) { return "s=" + encodeURIComponent(k); }).join("&") : "";
  if (url === current) return;
  if (source) source.close();
  source = null;
  current = url;
  if (!url) return;
  source = new EventSource(url);
  source.onopen = function () { send(null, "open", null); };
  source.onerror = function () { send(null, "error", null); };
  ["run", "end", "change"].forEach(function (name) {
    source.addEventListener(name, function (event) {
      var message = JSON.parse(event.data);
      send(message.sub, name, message.data);
    });
  });
}

// The set of subscriptions changes in bursts (a tab opening sends its list once): wait a
// moment, then open one stream for the new set.
function soon() {
  if (pending === null) pending = setTimeout(reconnect, 50);
}

function send(sub, name, data) {
  tabs.forEach(function (tab) {
    if (sub === null || tab.subs.indexOf(sub) >= 0) tab.port.postMessage({ sub: sub, name: name, data: data });
  });
}

onconnect = function (event) {
  var tab = { port: event.ports[0], subs: [], seen: Date.now() };
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
