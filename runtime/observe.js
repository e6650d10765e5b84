// Injected into the page by runtime/observation.py: marks the visible interactive elements
// with integer ids in DOM order (attribute data-webagent-id) and returns the visible
// page as a compact tree that Python renders to simplified HTML.
//
// Returned: {url, title, scrollY, viewportHeight, pageHeight, count, root}
// A node is a string (a text run, whitespace collapsed) or an object
//   {t: tag ("" for a block of transparent markup), i: id (interactive only),
//    a: {attribute: value} (allowlisted), f: fingerprint (interactive only),
//    b: bottom edge in page coordinates, c: [children]}
// Hidden elements (display:none, visibility:hidden, zero size, aria-hidden subtrees that
// are not focusable) are left out; open shadow roots are walked; iframes are not.
(args) => {
  const ID = args.idAttr;
  const MAXT = args.maxText;
  const WANT = new Set(args.attributes);
  const SKIP = new Set([
    "SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "HEAD", "svg", "SVG", "IFRAME", "FRAME",
    "OBJECT", "EMBED", "CANVAS", "AUDIO", "VIDEO", "MAP", "LINK", "META", "DATALIST",
  ]);
  const KEPT = new Set([
    "H1", "H2", "H3", "H4", "H5", "H6", "P", "LI", "TR", "DT", "DD", "CAPTION", "PRE",
    "BLOCKQUOTE", "TH", "TD", "LABEL", "TABLE", "IMG",
  ]);
  const BLOCK = new Set([
    "DIV", "SECTION", "ARTICLE", "HEADER", "FOOTER", "MAIN", "NAV", "ASIDE", "FORM",
    "FIELDSET", "UL", "OL", "DL", "TBODY", "THEAD", "TFOOT", "FIGURE", "FIGCAPTION", "BR",
    "HR", "ADDRESS", "DETAILS", "DIALOG", "MENU", "LEGEND", "HGROUP", "SEARCH", "CENTER",
    "BODY",
  ]);
  const ROLES = new Set([
    "button", "link", "checkbox", "radio", "tab", "menuitem", "menuitemcheckbox",
    "menuitemradio", "option", "switch", "combobox", "textbox", "searchbox", "slider",
    "spinbutton", "treeitem", "listbox",
  ]);
  const scrollY = Math.round(window.scrollY);

  const collapse = (s) => s.replace(/\s+/g, " ");
  const clip = (s) => (s.length > MAXT + 1 ? s.slice(0, MAXT + 1) : s);

  const isInteractive = (el) => {
    const tag = el.tagName;
    if (tag === "A") return el.hasAttribute("href") || el.hasAttribute("onclick");
    if (tag === "BUTTON" || tag === "SELECT" || tag === "TEXTAREA" || tag === "SUMMARY") {
      return true;
    }
    if (tag === "INPUT") return (el.getAttribute("type") || "").toLowerCase() !== "hidden";
    const role = (el.getAttribute("role") || "").toLowerCase();
    if (ROLES.has(role)) return true;
    if (el.hasAttribute("onclick")) return true;
    const editable = el.getAttribute("contenteditable");
    return editable === "" || editable === "true" || editable === "plaintext-only";
  };

  const hasBox = (el) => {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.height > 0) return true;
    for (const d of el.querySelectorAll("*")) {
      const dr = d.getBoundingClientRect();
      if (dr.width > 0 && dr.height > 0) return true;
    }
    return false;
  };

  const fingerprint = (el) =>
    el.tagName.toLowerCase() + "|" + collapse(el.textContent || "").trim().slice(0, 100) +
    "|" + (el.getAttribute("name") || "") + "|" + (el.getAttribute("type") || "");

  const attrsOf = (el) => {
    const out = {};
    const tag = el.tagName;
    for (const name of WANT) {
      if (name === "value") {
        if (tag === "INPUT") {
          const type = (el.getAttribute("type") || "text").toLowerCase();
          if (type === "checkbox" || type === "radio") {
            if (el.hasAttribute("value")) out.value = clip(el.getAttribute("value"));
          } else if (type === "password") {
            if (el.value) out.value = "*".repeat(Math.min(el.value.length, 16));
          } else if (el.value) {
            out.value = clip(collapse(el.value));
          }
        } else if (tag !== "TEXTAREA" && tag !== "SELECT" && el.hasAttribute("value")) {
          out.value = clip(el.getAttribute("value"));
        }
      } else if (name === "checked") {
        if (tag === "INPUT" && el.checked) out.checked = "";
        else if (el.getAttribute("aria-checked") === "true") out.checked = "";
      } else if (name === "selected") {
        if (tag === "OPTION" && el.selected) out.selected = "";
      } else if (el.hasAttribute(name)) {
        out[name] = clip(collapse(el.getAttribute(name)));
      }
    }
    return out;
  };

  const marks = [];
  let next = 1;

  // Children of `el` (its shadow root's, when it has an open one) into `out`.
  const walkChildren = (el, out, hidden) => {
    const root = el.shadowRoot || el;
    for (let n = root.firstChild; n !== null; n = n.nextSibling) walk(n, out, hidden);
    if (el.tagName === "SLOT") {
      for (const n of el.assignedNodes()) walk(n, out, hidden);
    }
  };

  const walk = (node, out, hidden) => {
    if (node.nodeType === Node.TEXT_NODE) {
      if (hidden) return;
      const text = collapse(node.nodeValue || "");
      if (text.trim() !== "") out.push(clip(text));
      else if (text !== "" && out.length > 0 && out[out.length - 1] !== " ") out.push(" ");
      return;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) return;
    const el = node;
    const tag = el.tagName;
    if (SKIP.has(tag)) return;
    if (typeof el.checkVisibility === "function" && !el.checkVisibility()) return;
    if (el.getAttribute("aria-hidden") === "true" && el.querySelector("a,button,input,select,textarea") === null) {
      return;
    }
    const invisible = typeof el.checkVisibility === "function"
      ? !el.checkVisibility({checkVisibilityCSS: true, visibilityProperty: true})
      : getComputedStyle(el).visibility !== "visible";
    if (tag === "SELECT") {
      if (invisible || !hasBox(el)) return;
      const opts = [];
      for (const o of el.querySelectorAll("option")) {
        opts.push({t: "option", a: attrsOf(o), c: [clip(collapse(o.textContent || "").trim())]});
      }
      const b = Math.round(el.getBoundingClientRect().bottom) + scrollY;
      const id = next++;
      marks.push([el, id]);
      out.push({t: "select", i: id, a: attrsOf(el), f: fingerprint(el), b, c: opts});
      return;
    }
    if (tag === "TEXTAREA") {
      if (invisible || !hasBox(el)) return;
      const b = Math.round(el.getBoundingClientRect().bottom) + scrollY;
      const id = next++;
      marks.push([el, id]);
      const value = collapse(el.value || "");
      out.push({t: "textarea", i: id, a: attrsOf(el), f: fingerprint(el), b, c: value ? [clip(value)] : []});
      return;
    }
    if (tag === "INPUT") {
      if (invisible || !isInteractive(el)) return;
      const r = el.getBoundingClientRect();
      if (!(r.width > 0 && r.height > 0)) {
        // Custom checkboxes hide the input behind a visible label: keep those.
        const type = (el.getAttribute("type") || "").toLowerCase();
        if (!((type === "checkbox" || type === "radio") && el.labels && el.labels.length)) return;
      }
      const id = next++;
      marks.push([el, id]);
      out.push({t: "input", i: id, a: attrsOf(el), f: fingerprint(el), b: Math.round(r.bottom) + scrollY, c: []});
      return;
    }
    if (isInteractive(el) && !invisible && hasBox(el)) {
      const id = next++;
      marks.push([el, id]);
      const c = [];
      walkChildren(el, c, hidden);
      const b = Math.round(el.getBoundingClientRect().bottom) + scrollY;
      out.push({t: tag.toLowerCase(), i: id, a: attrsOf(el), f: fingerprint(el), b, c});
      return;
    }
    const kept = KEPT.has(tag);
    const block = BLOCK.has(tag);
    if (!kept && !block) {
      walkChildren(el, out, invisible);
      return;
    }
    if (tag === "IMG") {
      const alt = collapse(el.getAttribute("alt") || "").trim();
      if (!invisible && alt && WANT.has("alt") && hasBox(el)) {
        out.push({t: "img", a: {alt: clip(alt)}, b: Math.round(el.getBoundingClientRect().bottom) + scrollY, c: []});
      }
      return;
    }
    const c = [];
    walkChildren(el, c, invisible);
    if (tag === "BR" || tag === "HR") {
      out.push({t: "", b: Math.round(el.getBoundingClientRect().bottom) + scrollY, c: []});
      return;
    }
    if (c.length === 0) return;
    const b = Math.round(el.getBoundingClientRect().bottom) + scrollY;
    out.push({t: kept ? tag.toLowerCase() : "", b, c});
  };

  // Clear the previous observation's marks (those inside shadow roots too).
  for (const old of window.__webagentMarks || []) old.removeAttribute(ID);
  for (const old of document.querySelectorAll("[" + ID + "]")) old.removeAttribute(ID);
  const rootChildren = [];
  if (document.body) walk(document.body, rootChildren, false);
  for (const [el, id] of marks) el.setAttribute(ID, String(id));
  window.__webagentMarks = marks.map(([el]) => el);
  return {
    url: location.href,
    title: collapse(document.title || "").trim(),
    scrollY,
    viewportHeight: window.innerHeight,
    pageHeight: document.documentElement ? document.documentElement.scrollHeight : 0,
    count: marks.length,
    root: {t: "", b: 0, c: rootChildren},
  };
}
