// The console's PromQL editor (console/templates/rules.html): a CodeMirror 6 view over a
// textarea, with codemirror-promql's highlighting, completion and linting. Completion reads the
// lab's metric names through the console's own read-only proxy of Prometheus's API
// (/rules/prometheus/api/v1/...), so the page's CSP stays 'self'. The textarea keeps the text:
// the form posts it as before, and without JavaScript the textarea is the editor.
import { EditorState } from "@codemirror/state";
import { EditorView, keymap, lineNumbers, highlightActiveLine } from "@codemirror/view";
import { defaultKeymap, history, historyKeymap } from "@codemirror/commands";
import { autocompletion, closeBrackets, completionKeymap } from "@codemirror/autocomplete";
import { syntaxHighlighting, defaultHighlightStyle, bracketMatching } from "@codemirror/language";
import { lintGutter, lintKeymap } from "@codemirror/lint";
import { PromQLExtension } from "@prometheus-io/codemirror-promql";

function mount(textarea, prometheusURL) {
  const promql = new PromQLExtension()
    .setComplete({ remote: { url: prometheusURL, httpMethod: "GET", lookbackInterval: 12 * 60 * 60 * 1000 } })
    .activateLinter(true);
  // In a shadow root: there CodeMirror's styles are constructed stylesheets (adoptedStyleSheets),
  // which the console's CSP (no inline style) allows; in the document they would be <style> tags.
  const host = document.createElement("div");
  host.className = "promql-editor";
  const shadow = host.attachShadow({ mode: "open" });
  const view = new EditorView({
    root: shadow,
    parent: shadow,
    state: EditorState.create({
      doc: textarea.value,
      extensions: [
        lineNumbers(), history(), bracketMatching(), closeBrackets(), highlightActiveLine(),
        autocompletion(), lintGutter(), syntaxHighlighting(defaultHighlightStyle),
        keymap.of([...defaultKeymap, ...historyKeymap, ...completionKeymap, ...lintKeymap]),
        EditorView.lineWrapping,
        promql.asExtension(),
        EditorView.updateListener.of((u) => { if (u.docChanged) textarea.value = u.state.doc.toString(); }),
      ],
    }),
  });
  textarea.hidden = true;
  textarea.parentNode.insertBefore(host, textarea.nextSibling);
  return view;
}

// Every textarea marked data-promql becomes an editor; the page names the proxy's address.
document.addEventListener("DOMContentLoaded", () => {
  for (const textarea of document.querySelectorAll("textarea[data-promql]")) {
    textarea.editor = mount(textarea, textarea.dataset.promql);
  }
});
