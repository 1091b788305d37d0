// Measures generated pages in the browser (see test_docs_browser.py). The harness page defines
// PAGES (file names beside it); each is loaded in an iframe, laid out at 1000 px, and measured
// from its rendered boxes; the results are written as JSON into <pre id="result">.
"use strict";

const INVISIBLE = new Set(["\u2061", "\u2062", "\u2063", "\u2064", ""]);
const OPEN = new Set(["(", "[", "{"]);

function visible(el) {
  const b = el.getBoundingClientRect();
  return b.width > 0 || b.height > 0;
}

function isWord(t) {  // a name of several letters, set as one token
  return t.localName === "mi" && [...t.textContent].length > 1;
}

function isOperand(t) {
  if (t.localName === "mi" || t.localName === "mn") return true;
  return t.localName === "mo" && OPEN.has(t.textContent);
}

function measure(d) {
  const win = d.defaultView;
  const r = {textLength: (d.body.innerText || "").length};
  // every math token actually drawn
  const tokens = [...d.querySelectorAll("math mi, math mn, math mo, math mtext")]
    .filter(t => !INVISIBLE.has(t.textContent.trim()) && visible(t));
  r.mathTokens = tokens.length;
  r.minFont = 1e9;
  r.minTok = null;
  for (const t of tokens) {
    const fs = parseFloat(win.getComputedStyle(t).fontSize);
    if (fs < r.minFont) { r.minFont = fs; r.minTok = t.textContent + " in " + t.closest("math").getAttribute("alttext"); }
  }
  // names run together: consecutive drawn tokens of one formula, invisible operators skipped
  r.touching = [];
  r.dotWidths = [];
  for (const m of d.querySelectorAll("math")) {
    if (!visible(m)) continue;
    const seq = [...m.querySelectorAll("mi, mn, mo, mspace, mtext")]
      .filter(t => t.localName === "mspace" || (!INVISIBLE.has(t.textContent.trim()) && visible(t)));
    for (let i = 0; i + 1 < seq.length; i++) {
      const a = seq[i], b = seq[i + 1];
      if (a.localName === "mo" && a.textContent === "\u00b7") r.dotWidths.push(a.getBoundingClientRect().width);
      // a function name followed by its parenthesis is a call, not a product
      const call = a.localName === "mi" && a.nextElementSibling && a.nextElementSibling.textContent === "\u2061";
      if (call) continue;
      const closing = a.localName === "mo" && [")", "]", "}"].includes(a.textContent);
      if ((isWord(a) && isOperand(b)) || ((isOperand(a) || closing) && isWord(b) && !OPEN.has(a.textContent))) {
        // (a subscript's letters against the next operand are not a product of names: only tokens of
        // one size count)
        // one size, side by side on one line (not a numerator over its denominator)
        const fa = parseFloat(win.getComputedStyle(a).fontSize), fb = parseFloat(win.getComputedStyle(b).fontSize);
        const ra = a.getBoundingClientRect(), rb = b.getBoundingClientRect();
        const sameLine = Math.abs((ra.top + ra.bottom) / 2 - (rb.top + rb.bottom) / 2) < 0.3 * fa;
        const beside = rb.left >= ra.right - 1 && rb.left - ra.right < 0.5 * fa;
        if (Math.abs(fa - fb) < 0.5 && sameLine && beside) {
          r.touching.push(a.textContent + "|" + b.textContent + " in " + m.getAttribute("alttext"));
        }
      }
    }
  }
  // bars over adjoints: a rule along the top of the whole name's box
  r.bars = [];
  for (const el of d.querySelectorAll("math mrow[style*='border-top']")) {
    if (!visible(el)) continue;
    const inner = el.firstElementChild;
    r.bars.push({border: parseFloat(win.getComputedStyle(el).borderTopWidth),
                 width: el.getBoundingClientRect().width, inner: inner ? inner.getBoundingClientRect().width : 0});
  }
  // table values: one line
  r.valueHeights = [];
  for (const el of d.querySelectorAll("td .value math")) {
    if (!visible(el)) continue;
    r.valueHeights.push({height: el.getBoundingClientRect().height, font: parseFloat(win.getComputedStyle(el).fontSize),
                         alt: el.getAttribute("alttext")});
  }
  // a number and its unit: the gap between the number's box and the unit's
  r.unitGaps = [];
  for (const sp of d.querySelectorAll("math mspace")) {
    const a = sp.previousElementSibling, b = sp.nextElementSibling;
    if (!a || !b || !visible(sp.closest("math"))) continue;
    const ra = a.getBoundingClientRect(), rb = b.getBoundingClientRect();
    if (ra.width === 0 || rb.width === 0) continue;
    r.unitGaps.push(rb.left - ra.right);
  }
  // text outside code and math: raw backticks, shared temporaries (t̃)
  r.backticks = [];
  r.temporaries = false;
  const walker = d.createTreeWalker(d.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const p = n.parentElement;
    if (!p || p.closest("pre, code, script, style")) continue;
    if (!p.closest("math") && n.textContent.includes("`")) r.backticks.push(n.textContent.trim().slice(0, 80));
    if (n.textContent.includes("t\u0303")) r.temporaries = true;
  }
  // images
  const imgs = [...d.querySelectorAll("img")];
  r.images = imgs.length;
  r.brokenImages = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute("src").slice(0, 60));
  // Markdown tables rendered as tables, no raw table rows in paragraphs
  r.tables = d.querySelectorAll("table").length;
  r.rawPipes = [...d.querySelectorAll("p")].map(p => p.textContent).filter(t => /^\s*\|.*\|\s*$/m.test(t))
    .map(t => t.slice(0, 80));
  return r;
}

function load(name) {
  return new Promise(resolve => {
    const f = document.createElement("iframe");
    f.style.width = "1000px";
    f.style.height = "800px";
    f.onload = () => {
      let out;
      try {
        const d = f.contentDocument;
        const imgs = [...d.images];
        Promise.all(imgs.map(i => i.complete ? null : new Promise(ok => { i.onload = i.onerror = ok; })))
          .then(() => {
            try { out = measure(d); } catch (e) { out = {error: String(e)}; }
            f.remove();
            resolve([name, out]);
          });
      } catch (e) {
        f.remove();
        resolve([name, {error: String(e)}]);
      }
    };
    f.src = name;
    document.body.appendChild(f);
  });
}

(async () => {
  const results = {};
  for (const name of PAGES) {
    const [n, r] = await load(name);
    results[n] = r;
  }
  document.getElementById("result").textContent = JSON.stringify(results);
})();
