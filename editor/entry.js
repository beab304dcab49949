// The CodeMirror 6 pieces Roadie's event editor (src/roadie/web/static/editor.js) uses,
// exposed as one global, `RoadieCM`, so that the editor's own code needs no build step.
export { EditorState, Compartment } from "@codemirror/state";
export { EditorView, keymap, lineNumbers, highlightActiveLine, highlightActiveLineGutter, drawSelection, placeholder } from "@codemirror/view";
export { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
export { syntaxHighlighting, defaultHighlightStyle, indentOnInput, bracketMatching, indentUnit } from "@codemirror/language";
export { yaml } from "@codemirror/lang-yaml";
export { autocompletion, completionKeymap, closeBrackets, closeBracketsKeymap, startCompletion, completionStatus, currentCompletions, acceptCompletion } from "@codemirror/autocomplete";
export { linter, lintGutter, lintKeymap, forceLinting, setDiagnostics, diagnosticCount } from "@codemirror/lint";
