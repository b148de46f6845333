"""What browser_get_images may return: a bounded list, whatever the page holds or redefines.

The listing runs as JS in an isolated world of the page (BrowserSession.evaluate), where the
page's scripts cannot redefine what it calls, so its caps hold in the page; `capped_images` checks
and caps the result again in Python all the same, before it reaches the model.
"""

from __future__ import annotations

from typing import Any

# browser_get_images lists at most this many images, each src and alt cut to these lengths, and
# stops adding images once the result reaches the snapshot's cap (snapshot_max_chars): a page can
# hold 100 images with megabytes of alt text each. `capped_images` applies the same caps again in
# Python to whatever comes back.
_MAX_IMAGES = 100
_SRC_CHARS = 500
_ALT_CHARS = 300
# Images still loading are waited for, up to this long: their natural size is what the model asks
# for, and without the wait it got the layout size or the natural one depending on the network's
# timing (navigation returns at DOMContentLoaded).
_LOAD_WAIT_MS = 3000
IMAGES_JS = f"""async (maxChars) => {{
  const listed = Array.from(document.images).slice(0, {_MAX_IMAGES});
  const pending = listed.filter((img) => !img.complete);
  if (pending.length) {{
    await Promise.race([
      Promise.all(pending.map((img) => new Promise((done) => {{
        img.addEventListener('load', done, {{once: true}});
        img.addEventListener('error', done, {{once: true}});
      }}))),
      new Promise((done) => setTimeout(done, {_LOAD_WAIT_MS})),
    ]);
  }}
  const images = [];
  let chars = 0;
  for (const img of listed) {{
    const item = {{src: String(img.currentSrc || img.src || '').slice(0, {_SRC_CHARS}),
                  alt: String(img.alt || '').slice(0, {_ALT_CHARS}),
                  width: img.naturalWidth || img.width, height: img.naturalHeight || img.height}};
    chars += item.src.length + item.alt.length + 60;
    if (chars > maxChars) break;
    images.push(item);
  }}
  return {{images, total: document.images.length}};
}}"""


def capped_images(raw: Any, max_chars: int) -> tuple[list[dict[str, Any]], int]:
    """The images `IMAGES_JS` returned, checked and capped again (types, lengths, total size),
    and how many images the page has."""
    items = raw.get("images") if isinstance(raw, dict) else None
    items = items if isinstance(items, list) else []
    total = raw.get("total") if isinstance(raw, dict) else None
    total = total if isinstance(total, int) and not isinstance(total, bool) else len(items)

    def text(value: Any, limit: int) -> str:
        return value[:limit] if isinstance(value, str) else ""

    def size(value: Any) -> int:
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e9 else 0

    images: list[dict[str, Any]] = []
    chars = 0
    for item in items[:_MAX_IMAGES]:
        if not isinstance(item, dict):
            continue
        image = {"src": text(item.get("src"), _SRC_CHARS), "alt": text(item.get("alt"), _ALT_CHARS),
                 "width": size(item.get("width")), "height": size(item.get("height"))}
        chars += len(image["src"]) + len(image["alt"]) + 60
        if chars > max_chars:
            break
        images.append(image)
    return images, max(total, len(images))
