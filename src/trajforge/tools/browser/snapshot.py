"""The text snapshot of a page that `browser_snapshot` returns, and how refs find elements again.

Playwright's own accessibility snapshot API is gone from recent releases, and a raw DOM dump is
far too long for a model, so one script run in the page walks the rendered DOM and prints an
accessibility-tree-like outline: controls, links, headings and images as `role "name" [ref=eN]`
lines, structural containers (lists, forms, tables) as indented groups, and the remaining
visible text. Each listed element gets a `data-tf-ref` attribute, so `browser_click` and
`browser_type` find it with a plain CSS locator. Refs are numbered from a per-sample counter that
the caller passes in: a ref copied from an older page never silently names a new element.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.async_api import Locator, Page

REF_ATTR = "data-tf-ref"

_SNAPSHOT_JS = r"""
(args) => {
  const REF = args.attr, maxChars = args.maxChars;
  let next = args.start, chars = 0, truncated = false;
  const out = [];
  const clean = s => (s || '').replace(/\s+/g, ' ').trim();
  const cut = (s, n) => s.length > n ? s.slice(0, n - 1) + '\u2026' : s;
  const q = (s, n = 120) => JSON.stringify(cut(clean(s), n));
  const SKIP = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'HEAD', 'META', 'LINK', 'svg',
                        'SVG', 'IFRAME', 'CANVAS', 'OBJECT', 'EMBED', 'VIDEO', 'AUDIO']);
  const GROUPS = {UL: 'list', OL: 'list', LI: 'listitem', FORM: 'form', NAV: 'navigation',
                  TABLE: 'table', TR: 'row', TD: 'cell', TH: 'columnheader', DIALOG: 'dialog',
                  FIELDSET: 'group', P: 'paragraph', BLOCKQUOTE: 'blockquote', PRE: 'code',
                  MAIN: 'main'};
  const LEAF_ROLES = new Set(['button', 'link', 'checkbox', 'radio', 'tab', 'menuitem', 'option',
                              'switch', 'textbox', 'searchbox', 'combobox', 'slider', 'heading']);
  const INTERESTING = 'a[href],button,input:not([type=hidden]),textarea,select,img,h1,h2,h3,h4,h5,' +
    'h6,summary,[role],[onclick],[contenteditable=""],[contenteditable=true],' +
    Object.keys(GROUPS).join(',');
  const emit = (depth, line) => {
    if (truncated) return;
    const text = '  '.repeat(depth) + '- ' + line;
    if (chars + text.length + 1 > maxChars) { truncated = true; return; }
    out.push(text); chars += text.length + 1;
  };
  const visible = el => {
    if (el.getAttribute('aria-hidden') === 'true' || el.hidden) return false;
    if (getComputedStyle(el).display === 'contents') return true;
    return el.checkVisibility ? el.checkVisibility({visibilityProperty: true}) : true;
  };
  const ref = el => {
    if (!el.getAttribute(REF)) el.setAttribute(REF, 'e' + (next++));
    return '[ref=' + el.getAttribute(REF) + ']';
  };
  const labelOf = el => {
    const by = el.getAttribute('aria-labelledby');
    const fromIds = by ? by.split(/\s+/).map(id => document.getElementById(id))
      .filter(Boolean).map(e => e.innerText).join(' ') : '';
    // A label may wrap its control: only its own text names it, not the options of a select.
    const ownText = l => {
      const w = document.createTreeWalker(l, NodeFilter.SHOW_TEXT);
      let t = '';
      while (w.nextNode()) {
        if (!w.currentNode.parentElement.closest('select,textarea,button')) t += ' ' + w.currentNode.textContent;
      }
      return t;
    };
    const labels = el.labels ? Array.from(el.labels).map(ownText).join(' ') : '';
    return clean(el.getAttribute('aria-label')) || clean(fromIds) || clean(labels) ||
      clean(el.getAttribute('placeholder')) || clean(el.getAttribute('title')) ||
      clean(el.getAttribute('name'));
  };
  const leaf = el => {
    const tag = el.tagName, role = el.getAttribute('role');
    const type = (el.getAttribute('type') || '').toLowerCase();
    if (role && LEAF_ROLES.has(role)) return role;
    if (tag === 'A' && el.hasAttribute('href')) return 'link';
    if (tag === 'BUTTON' || tag === 'SUMMARY') return 'button';
    if (tag === 'INPUT') {
      if (['button', 'submit', 'reset', 'image'].includes(type)) return 'button';
      if (type === 'checkbox' || type === 'radio') return type;
      return 'textbox';
    }
    if (tag === 'TEXTAREA') return 'textbox';
    if (tag === 'SELECT') return 'combobox';
    if (tag === 'IMG') return 'img';
    if (/^H[1-6]$/.test(tag)) return 'heading';
    if (el.isContentEditable && el.getAttribute('contenteditable') !== null) return 'textbox';
    if (el.hasAttribute('onclick')) return 'clickable';
    return null;
  };
  const describe = (el, role) => {
    const tag = el.tagName;
    let name = '', extra = '';
    if (role === 'textbox' || role === 'combobox' || role === 'checkbox' || role === 'radio' ||
        role === 'searchbox' || role === 'slider' || role === 'switch') {
      name = labelOf(el);
    } else if (role === 'img') {
      name = el.getAttribute('alt') || el.getAttribute('title') || '';
    } else {
      name = clean(el.getAttribute('aria-label')) || clean(el.innerText) || clean(el.value) ||
        clean(el.getAttribute('title')) ||
        (el.querySelector('img[alt]') ? el.querySelector('img[alt]').getAttribute('alt') : '');
    }
    if (role === 'heading' && /^H[1-6]$/.test(tag)) extra += ' [level=' + tag[1] + ']';
    if (role === 'link') extra += ' -> ' + cut(el.getAttribute('href'), 100);
    if (tag === 'INPUT' || tag === 'TEXTAREA') {
      const type = (el.getAttribute('type') || 'text').toLowerCase();
      if (type === 'checkbox' || type === 'radio') extra += el.checked ? ' [checked]' : '';
      else if (role === 'textbox') {
        if (!['text', ''].includes(type) && tag === 'INPUT') extra += ' [type=' + type + ']';
        if (el.value) extra += ' value=' + (type === 'password' ? '"***"' : q(el.value, 200));
      }
    }
    if (tag === 'SELECT') {
      const opts = Array.from(el.options);
      const sel = opts.filter(o => o.selected).map(o => clean(o.text));
      extra += ' value=' + q(sel.join(', ')) + ' options=' +
        JSON.stringify(opts.slice(0, 15).map(o => cut(clean(o.text), 40)));
    }
    if (el.disabled) extra += ' [disabled]';
    return role + (name ? ' ' + q(name) : '') + ' ' + ref(el) + extra;
  };
  const walk = (node, depth) => {
    for (const child of (node.shadowRoot || node).childNodes) {
      if (truncated) return;
      if (child.nodeType === Node.TEXT_NODE) {
        const t = clean(child.textContent);
        if (t) emit(depth, 'text ' + q(t, 400));
        continue;
      }
      if (child.nodeType !== Node.ELEMENT_NODE || SKIP.has(child.tagName)) continue;
      if (child.tagName === 'INPUT' && (child.type || '').toLowerCase() === 'hidden') continue;
      if (!visible(child)) continue;
      const role = leaf(child);
      if (role) { emit(depth, describe(child, role)); continue; }
      const group = GROUPS[child.tagName];
      const nested = child.shadowRoot || child.querySelector(INTERESTING);
      if (!nested) {
        const t = clean(child.innerText);
        if (t) emit(depth, (group || 'text') + ' ' + q(t, 400));
        continue;
      }
      if (group) { emit(depth, group); walk(child, depth + 1); } else walk(child, depth);
    }
  };
  if (document.body) walk(document.body, 0);
  return {text: out.join('\n'), next, truncated};
}
"""


@dataclass(frozen=True, slots=True)
class Snapshot:
    text: str
    next_ref: int
    truncated: bool


async def take_snapshot(evaluate: Callable[[str, Any], Awaitable[Any]], *, start_ref: int,
                        max_chars: int) -> Snapshot:
    """Outline the page's visible content, tagging listed elements with refs from `start_ref` on.
    `evaluate(script, arg)` runs the script in an isolated world of the page (BrowserSession.evaluate),
    where the page's own scripts cannot change what it calls, so its cap holds in the page."""
    raw: Any = await evaluate(_SNAPSHOT_JS, {"attr": REF_ATTR, "start": start_ref, "maxChars": max_chars})
    # Checked again all the same: types and caps cost nothing here.
    raw = raw if isinstance(raw, dict) else {}
    text = raw.get("text") if isinstance(raw.get("text"), str) else ""
    nxt = raw.get("next")
    nxt = nxt if isinstance(nxt, int) and not isinstance(nxt, bool) and start_ref <= nxt < start_ref + 10**6 else start_ref
    return Snapshot(text=text[:max_chars], next_ref=nxt, truncated=bool(raw.get("truncated")) or len(text) > max_chars)


def ref_locator(page: Page, ref: str) -> Locator:
    """The element a snapshot tagged with `ref`; the caller checks that it still exists."""
    return page.locator(f'[{REF_ATTR}="{ref}"]')


def normalize_ref(ref: Any) -> str | None:
    """`e12` from what a model may pass (`e12`, `[ref=e12]`, `ref=e12`); None if it is no ref
    (such strings must never reach the CSS selector)."""
    if not isinstance(ref, str):
        return None
    ref = ref.strip().strip("[]").removeprefix("ref=").strip()
    return ref if len(ref) > 1 and ref[0] == "e" and ref[1:].isdigit() else None
