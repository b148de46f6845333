"""A page's console output, kept and capped inside the page, so a page cannot flood the runner.

Playwright's `console` event carries every message whole from Chromium to this process (a page
logging megabytes in a loop moved them all), so the browser tools never subscribe to it. Instead
an init script (CONSOLE_JS), run in every document before the page's own scripts, wraps the
console methods: each message's text and the page's URL are cut to TEXT_CHARS as they are
logged, and only the last KEEP messages are held. It uses built-ins it captured before the page
could redefine them, keeps the messages in its closure, and hands them over through a property of
`window` the page can neither replace nor delete (`window` itself is unforgeable), as one JSON
string of at most READ_CHARS built by concatenation: nothing a page defines (a `toJSON`, an
iterator, a getter) takes part. `parse` checks and caps what arrives once more.

A page can still stop logging through it (replace `console.log` again): its messages are then
lost, which harms nobody but the page. Messages of a document that was left before a browser tool
call read them are lost too (BrowserTool drains the page before and after every action).
"""

from __future__ import annotations

from typing import Any

import orjson

KEEP = 200  # messages held per document (and per sample, session.py)
TEXT_CHARS = 1000  # of a message's text and of its page's URL
READ_CHARS = 512 << 10  # one read's JSON: newest messages first, until this much
READER = "__trajforge_console"
READ_EXPRESSION = f"(typeof window.{READER} === 'function') ? window.{READER}() : '[]'"

CONSOLE_JS = f"""(() => {{
  const NAME = {orjson.dumps(READER).decode()}, KEEP = {KEEP}, TEXT = {TEXT_CHARS}, BUDGET = {READ_CHARS};
  if (Object.getOwnPropertyDescriptor(window, NAME)) return;
  const apply = Reflect.apply, slice = String.prototype.slice, S = String, stringify = JSON.stringify;
  const cut = v => {{ try {{ return apply(slice, S(v), [0, TEXT]); }} catch (e) {{ return '[unprintable]'; }} }};
  let kept = [];
  const log = (type, args) => {{
    let text = '';
    for (let i = 0; i < args.length && text.length < TEXT; i++) text += (i ? ' ' : '') + cut(args[i]);
    let url = '';
    try {{ url = cut(location.href); }} catch (e) {{}}
    kept[kept.length] = '{{"type":' + stringify(type) + ',"text":' + stringify(apply(slice, text, [0, TEXT])) +
      ',"url":' + stringify(url) + '}}';
    if (kept.length > 2 * KEEP) {{
      const newer = [];
      for (let i = kept.length - KEEP; i < kept.length; i++) newer[newer.length] = kept[i];
      kept = newer;
    }}
  }};
  const methods = [['log', 'log'], ['info', 'info'], ['warn', 'warning'], ['error', 'error'], ['debug', 'debug']];
  for (let m = 0; m < methods.length; m++) {{
    const name = methods[m][0], type = methods[m][1], original = console[name];
    console[name] = function (...args) {{
      log(type, args);
      return apply(original, console, args);
    }};
  }}
  Object.defineProperty(window, NAME, {{configurable: false, enumerable: false, writable: false, value: () => {{
    let out = '', size = 2;
    for (let i = kept.length - 1, n = 0; i >= 0 && n < KEEP; i--, n++) {{
      if (size + kept[i].length + 1 > BUDGET) break;
      out = kept[i] + (out ? ',' + out : '');
      size += kept[i].length + 1;
    }}
    kept = [];
    return '[' + out + ']';
  }}}});
}})();"""


def parse(raw: Any) -> list[dict[str, str]]:
    """The messages one read returned, checked and capped again (a page could have made the
    reader unreachable and returned anything of its own; it cannot make this larger)."""
    if not isinstance(raw, str) or len(raw) > READ_CHARS + 2:
        return []
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    messages = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("type", "text", "url")):
            messages.append({"type": item["type"][:20], "text": item["text"][:TEXT_CHARS],
                             "url": item["url"][:TEXT_CHARS]})
    return messages[-KEEP:]
