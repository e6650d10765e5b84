// Injected into the page by runtime/observation.py: marks the visible interactive elements
// with integer ids in DOM order (attribute data-webagent-id) and returns the visible
// page as a compact tree that Python renders to simplified HTML.
//
// Returned: {url, title, scrollY, viewportHeight, pageHeight, count, root}
// A node is a string (a text run, whitespace collapsed) or an object
//   {t: tag ("" for a block of transparent markup), i: id (interactive only),
//    a: {attribute: value} (allowlisted), f: fingerprint (interactive only),
//    b: bottom edge in page coordinates, c: [children]}
// Past 100 levels of that tree, blocks are transparent and an interactive element keeps
// only its text (a deeper tree is more than a JSON decoder reads).
// Hidden elements (display:none, visibility:hidden, zero size, aria-hidden subtrees that
// are not focusable) are left out; open shadow roots are walked; iframes are not.
// Elements not painted because a scroll container (overflow other than visible) clips them
// away, or because they lie wholly left of or above the document, are left out too: a
// sidebar that scrolls on its own shows only what is on screen (Scroll Down moves it).
// `window.__webagentShown(el)` is left behind for the session: is a marked element still
// shown as this script would judge it (a stale id of a hidden element is refused)?
(args) => {
  const ID = args.idAttr;
  const MAXT = args.maxText;
  const MAX_DEPTH = 100;
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
  // Elements that may scroll their content (or clip it) on their own.
  const CONTAINERS = new Set([
    "DIV", "SECTION", "ARTICLE", "MAIN", "NAV", "ASIDE", "UL", "OL", "DL", "PRE", "TABLE",
    "TBODY", "FORM", "FIELDSET", "MENU", "DIALOG", "DETAILS",
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

  // Is `el` (a marked element) shown: rendered, visible, with a box of its own, of a
  // descendant, or (a styled checkbox or radio) of its label?
  const shown = (el) => {
    if (typeof el.checkVisibility === "function" &&
        !el.checkVisibility({checkVisibilityCSS: true, visibilityProperty: true})) {
      return false;
    }
    if (hasBox(el)) return true;
    const type = (el.getAttribute("type") || "").toLowerCase();
    if (el.tagName !== "INPUT" || (type !== "checkbox" && type !== "radio") || !el.labels) {
      return false;
    }
    return [...el.labels].some((label) => hasBox(label));
  };
  window.__webagentShown = shown;

  // The part of the viewport that scroll containers let through: {l, t, r, b} or null.
  const scrollX = window.scrollX;
  const outside = (r, area) =>
    r.right + scrollX <= 0 || r.bottom + scrollY <= 0 || (area !== null &&
      (r.right <= area.l || r.left >= area.r || r.bottom <= area.t || r.top >= area.b));
  const areaOf = (el, r, area) => {
    if (el.scrollHeight <= el.clientHeight + 1 && el.scrollWidth <= el.clientWidth + 1) {
      return area; // nothing overflows: nothing is clipped
    }
    // Across, only what can never scroll into view is clipped (a wide table in a
    // scrolling wrapper keeps its columns: the actions scroll up and down only).
    const style = getComputedStyle(el);
    const x = style.overflowX === "hidden" || style.overflowX === "clip";
    const y = style.overflowY !== "visible";
    if (!x && !y) return area;
    const l = r.left + el.clientLeft;
    const t = r.top + el.clientTop;
    const own = {
      l: x ? l : -Infinity,
      t: y ? t : -Infinity,
      r: x ? l + el.clientWidth : Infinity,
      b: y ? t + el.clientHeight : Infinity,
    };
    if (area === null) return own;
    return {
      l: Math.max(own.l, area.l),
      t: Math.max(own.t, area.t),
      r: Math.min(own.r, area.r),
      b: Math.min(own.b, area.b),
    };
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
  const walkChildren = (el, out, hidden, area, depth) => {
    const root = el.shadowRoot || el;
    for (let n = root.firstChild; n !== null; n = n.nextSibling) walk(n, out, hidden, area, depth);
    if (el.tagName === "SLOT") {
      for (const n of el.assignedNodes()) walk(n, out, hidden, area, depth);
    }
  };

  // `depth`: how many nodes of the returned tree hold `out`. Past MAX_DEPTH, blocks are
  // transparent and an interactive element keeps only its text, so that the tree stays
  // readable (a page that nests 20,000 divs made JSON no decoder reads).
  const walk = (node, out, hidden, outerArea, depth) => {
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
    // Clipped away by a scroll container (a fixed element escapes its ancestors' clips).
    // (Boxes are measured only inside a scroll container, and for the containers: most
    // elements of a long page are neither.)
    let area = outerArea;
    const container = CONTAINERS.has(tag) || tag.includes("-"); // custom elements too
    if (area !== null || container || isInteractive(el)) {
      const rect = el.getBoundingClientRect();
      if (rect.width > 0 && rect.height > 0 && outside(rect, area)) {
        if (getComputedStyle(el).position !== "fixed") return;
        area = null;
        if (outside(rect, area)) return;
      }
      if (container) area = areaOf(el, rect, area);
    }
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
      if (depth < MAX_DEPTH) walkChildren(el, c, hidden, area, depth + 1);
      else if (collapse(el.textContent || "").trim()) c.push(clip(collapse(el.textContent).trim()));
      const b = Math.round(el.getBoundingClientRect().bottom) + scrollY;
      out.push({t: tag.toLowerCase(), i: id, a: attrsOf(el), f: fingerprint(el), b, c});
      return;
    }
    const kept = KEPT.has(tag);
    const block = BLOCK.has(tag);
    if ((!kept && !block) || (depth >= MAX_DEPTH && tag !== "IMG")) {
      walkChildren(el, out, invisible, area, depth);
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
    walkChildren(el, c, invisible, area, depth + 1);
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
  if (document.body) walk(document.body, rootChildren, false, null, 1);
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
