// The event editor (/editor): CodeMirror 6 (vendor/codemirror.min.js, the global
// RoadieCM) over the form's textarea, which it keeps filled, so the form posts the same
// field with or without this script.
//
// The server is the one authority on a file: as staff type, the text is sent to
// POST /api/v1/events/check and what it answers is shown, marked at each problem's line
// and listed above the text; this script judges nothing itself. Completion comes from
// the catalogue and the event schema the page carries (#editor-data): which key or value
// fits is read from the indentation of the lines above the cursor, as the server's
// loader reads a broken file (roadie/definitions/yaml_errors.py). Saving an event that
// exists shows what changes from its newest version first, and stores only over that one.
(function () {
  "use strict";

  var ITEM = /^-(?:\s+|$)/;
  var KEY = /^("[^"]*"|'[^']*'|[^\s#'"{\[\]},&*!|>%@`?-][^#]*?|-[^\s#]+?)\s*:(?:\s|$)/;
  var BLOCK_SCALAR = /:\s+[|>][-+0-9]*\s*(?:#.*)?$/;

  // The lines of a YAML text as their indentation reads: each key's path. `stack` is what
  // is open after the last line, for the line being typed.
  function outline(texts) {
    var stack = [];
    var lines = [];
    var blockColumn = null;
    texts.forEach(function (raw) {
      var stripped = raw.replace(/^[ \t]+/, "");
      var column = raw.length - stripped.length;
      if (blockColumn !== null) {
        if (!stripped.trim() || column > blockColumn) { lines.push(null); return; }
        blockColumn = null;
      }
      if (!stripped.trim() || stripped[0] === "#" || /^(---|\.\.\.)/.test(stripped)) { lines.push(null); return; }
      var read = readLine(stack, raw, column);
      if (read.key !== null && BLOCK_SCALAR.test(raw)) blockColumn = read.column;
      lines.push(read);
    });
    return { lines: lines, stack: stack };
  }

  // One line read onto `stack` (changed in place): its items, then its key if any.
  function readLine(stack, raw, column) {
    var position = column;
    var match;
    while ((match = ITEM.exec(raw.slice(position)))) {
      var index = 0;
      while (stack.length) {
        var top = stack[stack.length - 1];
        if (!(top.column > position || (top.column === position && top.closed))) break;
        stack.pop();
        if (top.column === position && top.key === null) { index = top.index + 1; break; }
      }
      stack.push({ column: position, key: null, index: index, closed: true });
      position += match[0].length;
    }
    var rest = raw.slice(position);
    var keyMatch = KEY.exec(rest);
    var key = null;
    var value = "";
    if (keyMatch) {
      key = keyMatch[1].replace(/^["']|["']$/g, "");
      while (stack.length && stack[stack.length - 1].column >= position) stack.pop();
      value = rest.slice(keyMatch[0].length).replace(/\s+#.*$/, "").trim();
      stack.push({ column: position, key: key, index: 0, closed: value !== "" && value[0] !== "#" });
    } else if (position === column) {
      while (stack.length && stack[stack.length - 1].column >= position) stack.pop();
    }
    return { column: position, key: key, value: value, path: pathOf(stack) };
  }

  function pathOf(stack) {
    return stack.map(function (e) { return e.key !== null ? e.key : e.index; });
  }

  function samePath(a, b) {
    return a.length === b.length && a.every(function (part, i) { return part === b[i]; });
  }

  function unquote(text) {
    return text.replace(/^["']|["']$/g, "");
  }

  // -- what the catalogue and the schema offer ----------------------------------------------

  function Knowledge(data) {
    this.schema = data.event_schema;
    this.actions = {};
    this.leases = {};
    var self = this;
    data.modules.forEach(function (module) {
      module.actions.forEach(function (a) { self.actions[a.id] = a; });
      module.leases.forEach(function (l) { self.leases[l.id] = l; });
    });
    this.leaseAction = data.lease_action;
    this.actions[data.lease_action.id] = {
      id: data.lease_action.id,
      reversible: "override",
      description: data.lease_action.description || "borrow a setting (a lease) while the run holds it",
      schema: data.lease_action.schema,
    };
  }

  // A schema node with its local $ref followed and an optional (anyOf with null) unwrapped.
  function resolve(node, root) {
    var guard = 0;
    while (node && guard++ < 20) {
      if (node.$ref && node.$ref.indexOf("#/$defs/") === 0) {
        node = (root.$defs || {})[node.$ref.slice(8)];
        continue;
      }
      var options = (node.anyOf || node.oneOf || []).filter(function (o) { return o.type !== "null"; });
      if (options.length === 1 && !node.properties) {
        var merged = Object.assign({}, node, options[0]);
        delete merged.anyOf; delete merged.oneOf;
        node = merged;
        continue;
      }
      return node;
    }
    return node || null;
  }

  function walk(node, root, parts) {
    for (var i = 0; i < parts.length && node; i++) {
      node = resolve(node, root);
      var part = parts[i];
      if (typeof part === "number") node = node.items || null;
      else if (node.properties && node.properties[part]) node = node.properties[part];
      else if (node.additionalProperties && typeof node.additionalProperties === "object") node = node.additionalProperties;
      else node = null;
    }
    return node ? resolve(node, root) : null;
  }

  function typeName(node, root) {
    node = resolve(node, root) || {};
    if (node.enum) return node.enum.map(String).join(" | ");
    if (node.anyOf) return node.anyOf.map(function (o) { return typeName(o, root); }).join(" or ");
    if (node.type === "array") return "list of " + typeName(node.items || {}, root);
    return node.type || "any";
  }

  // The schema at `path` and the root its $refs are read against: inside a step's `with`,
  // its action's parameters; elsewhere, the event file's.
  Knowledge.prototype.schemaAt = function (path, lines) {
    var at = path.indexOf("with");
    if (at >= 2 && path[at - 2] === "steps" && typeof path[at - 1] === "number") {
      var action = this.actions[valueAt(lines, path.slice(0, at).concat(["action"]))];
      if (!action) return null;
      return { node: walk(action.schema, action.schema, path.slice(at + 1)), root: action.schema, step: path.slice(0, at) };
    }
    return { node: walk(this.schema, this.schema, path), root: this.schema, step: null };
  };

  function valueAt(lines, path) {
    for (var i = 0; i < lines.length; i++) {
      if (lines[i] && lines[i].key !== null && samePath(lines[i].path, path)) return unquote(lines[i].value);
    }
    return null;
  }

  Knowledge.prototype.keys = function (path, lines) {
    var found = this.schemaAt(path, lines);
    if (!found || !found.node || !found.node.properties) return [];
    var required = found.node.required || [];
    return Object.keys(found.node.properties).map(function (name) {
      var prop = found.node.properties[name];
      var resolved = resolve(prop, found.root) || {};
      return {
        label: name,
        type: "property",
        detail: typeName(prop, found.root) + (required.indexOf(name) >= 0 ? " · required" : ""),
        info: prop.description || resolved.description || undefined,
        apply: name + ": ",
        boost: required.indexOf(name) >= 0 ? 1 : 0,
      };
    });
  };

  Knowledge.prototype.values = function (path, lines) {
    var self = this;
    var key = path[path.length - 1];
    var parent = path.slice(0, -1);
    if (key === "action" && parent.length >= 2 && parent[parent.length - 2] === "steps") {
      return Object.keys(this.actions).sort().map(function (id) {
        var a = self.actions[id];
        return { label: id, type: "function", detail: a.reversible, info: a.description || undefined };
      });
    }
    var found = this.schemaAt(path, lines);
    var leaseStep = found && found.step && valueAt(lines, found.step.concat(["action"])) === this.leaseAction.id;
    if (leaseStep && path.length === found.step.length + 2 && key === "lease") {
      return Object.keys(this.leases).sort().map(function (id) {
        var l = self.leases[id];
        return { label: id, type: "variable", detail: l.takes + (l.targeted ? " · targeted" : ""), info: l.description || undefined };
      });
    }
    var node = found && found.node;
    if (leaseStep && key === "value") {
      var lease = this.leases[valueAt(lines, found.step.concat(["with", "lease"]))];
      node = lease && lease.value ? resolve(lease.value, lease.value) : null;
    }
    if (!node) return [];
    if (node.enum) return node.enum.map(function (v) { return { label: String(v), type: "enum" }; });
    if (node.type === "boolean") return ["true", "false"].map(function (v) { return { label: v, type: "keyword" }; });
    return [];
  };

  // -- completion ---------------------------------------------------------------------------

  var KEY_TYPED = /^([ \t]*)((?:-[ \t]+)*)([^\s:#'"{\[-][^:#]*)?$/;
  var VALUE_TYPED = /^([ \t]*)((?:-[ \t]+)*)([^\s:#'"{\[][^:#]*?)[ \t]*:[ \t]+(["']?)([^"'{\[#]*)$/;

  function completer(knowledge) {
    return function (context) {
      var line = context.state.doc.lineAt(context.pos);
      var before = line.text.slice(0, context.pos - line.from);
      var above = [];
      for (var n = 1; n < line.number; n++) above.push(context.state.doc.line(n).text);
      var all = context.state.doc.toString().split("\n");
      var read = outline(above);
      var everything = outline(all).lines;
      var stack = read.stack.slice();
      var typed;
      if ((typed = VALUE_TYPED.exec(before))) {
        var here = readLine(stack, before.replace(/[ \t]*:[ \t]+["']?[^"'{\[#]*$/, ": "), typed[1].length);
        var word = typed[5];
        var options = knowledge.values(here.path, everything);
        if (!options.length) return null;
        return { from: context.pos - word.length, options: options, validFor: /^[\w.#-]*$/ };
      }
      if ((typed = KEY_TYPED.exec(before))) {
        var start = typed[1].length + typed[2].length;
        var word2 = typed[3] || "";
        if (!word2 && !context.explicit && !typed[2]) return null;
        readLine(stack, before.slice(0, start) + "x: ", typed[1].length);
        stack.pop(); // the key being typed: what is asked for is its mapping's keys
        var keys = knowledge.keys(pathOf(stack), everything);
        if (!keys.length) return null;
        return { from: context.pos - word2.length, options: keys, validFor: /^[\w-]*$/ };
      }
      return null;
    };
  }

  // -- the server's word --------------------------------------------------------------------

  function Checker(form) {
    this.csrf = form.querySelector("input[name=csrf]").value;
    this.filename = form.querySelector("#filename").value || "event.yaml";
  }

  // What the server says of `text`: {ok, problems, body, error}.
  Checker.prototype.check = function (text) {
    var url = "/api/v1/events/check?filename=" + encodeURIComponent(this.filename);
    return fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "text/plain; charset=utf-8", "X-CSRF-Token": this.csrf, Accept: "application/json" },
      body: text,
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (body) {
        if (response.ok) return { ok: true, problems: [], body: body };
        if (response.status === 422 && body.problems) return { ok: false, problems: body.problems, body: body };
        return { ok: false, problems: null, error: body.error || "the server answered " + response.status };
      });
    }, function () {
      return { ok: false, problems: null, error: "the server cannot be reached" };
    });
  };

  function diagnostics(doc, problems) {
    return problems.map(function (p) {
      var number = Math.min(Math.max(p.line || 1, 1), doc.lines);
      var line = doc.line(number);
      var indent = line.text.length - line.text.replace(/^\s+/, "").length;
      return {
        from: line.from + indent,
        to: line.to,
        severity: "error",
        source: "server",
        message: (p.field ? p.field + ": " : "") + p.message,
      };
    });
  }

  // -- the page -----------------------------------------------------------------------------

  function start() {
    var CM = window.RoadieCM;
    var textarea = document.querySelector("textarea[data-editor]");
    var dataNode = document.getElementById("editor-data");
    if (!CM || !textarea || !dataNode) return;
    var form = textarea.form;
    var knowledge = new Knowledge(JSON.parse(dataNode.textContent));
    var checker = new Checker(form);
    var panel = document.getElementById("problems");
    var checkState = document.getElementById("check-state");
    var review = document.getElementById("review");
    var base = document.getElementById("base");
    var pendingBase = null;
    var view;

    function show(answer) {
      var html;
      if (answer.ok) {
        var b = answer.body;
        checkState.textContent = "";
        html = '<p class="ok" id="check-ok">The server finds no problem: event <code></code>, ' + b.phases + " phase" +
          (b.phases === 1 ? "" : "s") + " and " + b.steps + " step" + (b.steps === 1 ? "" : "s") +
          "; " + (b.version === b.current ? "it defines the same event as version " + b.current + ", so saving makes no new version"
            : "saving makes version " + b.version) + ".</p>";
        if (panel.dataset.shown !== html + b.event_id) {
          panel.innerHTML = html;
          panel.querySelector("code").textContent = b.event_id;
          panel.dataset.shown = html + b.event_id;
        }
        return;
      }
      if (!answer.problems) {
        checkState.textContent = "Not checked: " + answer.error;
        return;
      }
      checkState.textContent = "";
      var key = JSON.stringify(answer.problems);
      if (panel.dataset.shown === key) return;
      panel.dataset.shown = key;
      panel.textContent = "";
      var heading = document.createElement("h2");
      heading.id = "problems-heading";
      heading.tabIndex = -1;
      var count = answer.problems.length;
      heading.textContent = count + " problem" + (count === 1 ? "" : "s") + " the server finds";
      var list = document.createElement("ul");
      list.className = "problems";
      answer.problems.forEach(function (p) {
        var item = document.createElement("li");
        var go = document.createElement("button");
        go.type = "button";
        go.className = "link problem";
        go.textContent = (p.line ? "line " + p.line + ": " : "") + (p.field ? p.field + ": " : "") + p.message;
        go.addEventListener("click", function () {
          var line = view.state.doc.line(Math.min(Math.max(p.line || 1, 1), view.state.doc.lines));
          view.dispatch({ selection: { anchor: line.from }, scrollIntoView: true });
          view.focus();
        });
        item.appendChild(go);
        list.appendChild(item);
      });
      panel.appendChild(heading);
      panel.appendChild(list);
    }

    var lint = CM.linter(function (v) {
      var text = v.state.doc.toString();
      checkState.textContent = "Checking…";
      return checker.check(text).then(function (answer) {
        show(answer);
        return answer.problems ? diagnostics(v.state.doc, answer.problems) : [];
      });
    }, { delay: 500 });

    var theme = CM.EditorView.theme({
      "&": { border: "1px solid #c9d0da", borderRadius: "6px", background: "#fff", maxWidth: "100%" },
      "&.cm-focused": { outline: "2px solid #2f5fd1", outlineOffset: "1px" },
      ".cm-scroller": { fontFamily: "ui-monospace, Menlo, Consolas, monospace", fontSize: "13px", minHeight: "16em", maxHeight: "70vh" },
      ".cm-gutters": { background: "#f6f7f9", color: "#5b6576", borderRight: "1px solid #dfe3ea" },
      ".cm-activeLineGutter": { background: "#e4effc", color: "#1d2430" },
      ".cm-activeLine": { background: "#f3f6fb" },
      ".cm-tooltip-autocomplete ul li[aria-selected]": { background: "#2f5fd1", color: "#fff" },
      ".cm-completionDetail": { color: "#5b6576" },
      ".cm-diagnostic-error": { borderLeft: "5px solid #c53030", color: "#1d2430" },
    });

    view = new CM.EditorView({
      doc: textarea.value,
      extensions: [
        CM.lineNumbers(),
        CM.highlightActiveLineGutter(),
        CM.history(),
        CM.drawSelection(),
        CM.indentOnInput(),
        CM.indentUnit.of("  "),
        CM.EditorState.tabSize.of(2),
        CM.syntaxHighlighting(CM.defaultHighlightStyle, { fallback: true }),
        CM.highlightActiveLine(),
        CM.yaml(),
        CM.autocompletion({ override: [completer(knowledge)], icons: false }),
        lint,
        CM.lintGutter(),
        // Tab indents, as in any code editor; Escape then Tab (or Shift+Tab) leaves the
        // text, which CodeMirror provides, and the help above the editor says.
        CM.keymap.of([].concat(CM.completionKeymap, CM.defaultKeymap, CM.historyKeymap, CM.lintKeymap, [CM.indentWithTab])),
        CM.EditorView.contentAttributes.of({
          "aria-labelledby": "source-label",
          "aria-describedby": "editor-help",
          autocapitalize: "off",
          spellcheck: "false",
          // Focusable already (contenteditable); said outright so that axe counts the
          // scrolling box around it as reachable by keyboard. Still one tab stop.
          tabindex: "0",
        }),
        CM.EditorView.updateListener.of(function (update) {
          if (!update.docChanged) return;
          textarea.value = update.state.doc.toString();
          if (!review.hidden) review.hidden = true; // what it showed is no longer the text
        }),
        theme,
      ],
    });
    textarea.hidden = true;
    textarea.insertAdjacentElement("afterend", view.dom);
    document.getElementById("source-label").removeAttribute("for");

    function focusHeading(id) {
      var heading = document.getElementById(id);
      if (heading) heading.focus();
    }

    form.addEventListener("submit", function (event) {
      if (form.dataset.confirmed) return;
      event.preventDefault();
      textarea.value = view.state.doc.toString();
      checkState.textContent = "Checking…";
      checker.check(textarea.value).then(function (answer) {
        show(answer);
        if (answer.problems) view.dispatch(CM.setDiagnostics(view.state, diagnostics(view.state.doc, answer.problems)));
        if (!answer.ok) {
          if (answer.problems) focusHeading("problems-heading");
          return;
        }
        var b = answer.body;
        if (b.current === 0) { // a new event: nothing to compare with
          base.value = "0";
          form.dataset.confirmed = "1";
          form.submit();
          return;
        }
        pendingBase = b.current;
        var says = b.version === b.current
          ? "It defines the same event as version " + b.current + " of " + b.event_id + ": saving makes no new version. "
          : "Saving stores this file as version " + b.version + " of " + b.event_id + ". ";
        document.getElementById("review-says").textContent = says +
          (b.changes.length ? "What it changes from version " + b.current + ":" : "Its text is that of version " + b.current + ".");
        var diff = document.getElementById("review-diff");
        diff.textContent = "";
        diff.hidden = !b.changes.length;
        b.changes.forEach(function (text) {
          var span = document.createElement("span");
          if (text.slice(0, 2) === "@@") span.className = "hunk";
          else if (text[0] === "+" && text.slice(0, 3) !== "+++") span.className = "added";
          else if (text[0] === "-" && text.slice(0, 3) !== "---") span.className = "removed";
          span.textContent = text + "\n";
          diff.appendChild(span);
        });
        document.getElementById("save-button").textContent = b.version === b.current ? "Save" : "Save as version " + b.version;
        review.hidden = false;
        focusHeading("review-heading");
      });
    });

    document.getElementById("save-button").addEventListener("click", function () {
      base.value = String(pendingBase);
      form.dataset.confirmed = "1";
      form.submit();
    });
    document.getElementById("keep-editing").addEventListener("click", function () {
      review.hidden = true;
      view.focus();
    });
    window.roadieEditor = view; // for the browser tests, and for a curious admin's console
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
