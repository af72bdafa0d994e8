"""A capture session as one self-contained HTML page: no network, no library, opens from disk.

Per lane one inline SVG: a bar per request, tokens reused (green) under tokens prefilled (orange), hatched
grey where the server did not say (never drawn as 0), its time to first token in the band below, and a red
marker where the prefix broke, labelled with the cause and the byte and linked to that break's section (the
diagnosis line and `diff`'s changed paths). Then what the prefill cost, charged to each cause, and the
session's totals. The DOM stays small whatever the session's length: each lane's bars are one `<path>` per
colour, and the hover text of every request is one JSON block read by a few lines of script.
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass

from stable_prefix.captures.session import COLD, KEPT, CostGroup, PrefillRate, RequestBar, Session

REUSED, PREFILLED, TTFT, BREAK, UNKNOWN = "#2ca25f", "#f28e2b", "#4e79a7", "#d62728", "#9a9a9a"
LEFT, RIGHT = 92, 24  # room for the axis labels
TOKENS_HEIGHT, TTFT_HEIGHT, GAP, AXIS_HEIGHT = 120, 44, 10, 18
LABEL_ROW, LABEL_ROWS, MARKER = 14, 3, 8
PLOT_WIDTH = 1000  # a lane's bars share it, each 3-24 px; a longer lane scrolls sideways
CHAR_PX = 6.2  # an 11 px label's mean character width, to keep labels from overlapping
DIFF_LINES = 40  # per break; the command beside it prints them all

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1280px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 2px}h3{font-size:14px;margin:18px 0 4px}
.sub,.note{color:#666}.scroll{overflow-x:auto}table{border-collapse:collapse;margin:8px 0}
td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #eee}td:first-child,th:first-child{text-align:left}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}code{font-size:12px}
.key{display:inline-block;width:12px;height:12px;vertical-align:-2px;margin:0 4px 0 12px}
svg text{font:11px system-ui,sans-serif;fill:#555}svg a text{fill:#d62728}
#tip{position:fixed;background:#222;color:#fff;padding:4px 8px;font-size:12px;border-radius:3px;pointer-events:none;max-width:720px}
"""

# Hover: the request under the pointer, from its lane's geometry and the JSON block of live lines.
SCRIPT = """
const lines = JSON.parse(document.getElementById('lines').textContent);
const tip = document.getElementById('tip');
for (const svg of document.querySelectorAll('svg.lane')) {
  const step = +svg.dataset.step, left = +svg.dataset.left, texts = lines[svg.dataset.lane];
  svg.addEventListener('mousemove', event => {
    const index = Math.floor((event.clientX - svg.getBoundingClientRect().left - left) / step);
    if (index < 0 || index >= texts.length) { tip.hidden = true; return; }
    tip.textContent = texts[index];
    tip.style.left = (event.clientX + 12) + 'px';
    tip.style.top = (event.clientY + 12) + 'px';
    tip.hidden = false;
  });
  svg.addEventListener('mouseleave', () => { tip.hidden = true; });
}
"""


def _e(text: object) -> str:
    return html.escape(str(text))


def _count(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'s' * (count != 1)}"


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:,.2f} s"


@dataclass(frozen=True)
class LaneGeometry:
    count: int
    label_rows: int

    @property
    def step(self) -> int:
        return max(3, min(24, PLOT_WIDTH // max(self.count, 1)))

    @property
    def bar_width(self) -> int:
        return self.step - 1 if self.step < 6 else self.step - 2

    @property
    def tokens_top(self) -> int:
        return 4 + self.label_rows * LABEL_ROW + MARKER

    @property
    def tokens_bottom(self) -> int:
        return self.tokens_top + TOKENS_HEIGHT

    @property
    def ttft_bottom(self) -> int:
        return self.tokens_bottom + GAP + TTFT_HEIGHT

    @property
    def width(self) -> int:
        return LEFT + self.count * self.step + RIGHT

    @property
    def height(self) -> int:
        return self.ttft_bottom + AXIS_HEIGHT

    def x(self, index: int) -> int:
        return LEFT + index * self.step


def _rect(x: float, y: float, width: float, height: float) -> str:
    return f"M{x:g} {y:g}h{width:g}v{height:g}h{-width:g}z"


def _tall(tokens: int, per_token: float) -> float:
    """A bar's height; a part that is not zero is at least one pixel, so it is seen."""
    return max(1.0, round(tokens * per_token, 1)) if tokens else 0.0


def _label_rows(bars: list[RequestBar], geometry: LaneGeometry) -> list[tuple[RequestBar, int | None]]:
    """Each break and the label row it fits in (None: no room; its marker keeps the hover title), left to right."""
    row_ends = [float("-inf")] * LABEL_ROWS
    placed = []
    for index, bar in enumerate(bars):
        if not bar.broke:
            continue
        start, width = geometry.x(index) - 2, len(_marker_label(bar)) * CHAR_PX
        row = next((row for row, end in enumerate(row_ends) if start > end + 6), None)
        if row is not None:
            row_ends[row] = start + width
        placed.append((bar, row))
    return placed


def _marker_label(bar: RequestBar) -> str:
    return f"#{bar.seq} {bar.broke.cause} · {bar.broke.where}"


def lane_svg(lane_index: int, bars: list[RequestBar], max_ttft: float) -> str:
    breaks = sum(1 for bar in bars if bar.broke)
    geometry = LaneGeometry(len(bars), min(LABEL_ROWS, breaks))
    step, width = geometry.step, geometry.bar_width
    max_tokens = max((bar.prompt_tokens or 0 for bar in bars), default=0)
    per_token, per_second = TOKENS_HEIGHT / (max_tokens or 1), TTFT_HEIGHT / (max_ttft or 1.0)
    index_of = {id(bar): index for index, bar in enumerate(bars)}
    reused, prefilled, unknown, ttft, ttft_unknown = [], [], [], [], []
    bottom = geometry.tokens_bottom
    for index, bar in enumerate(bars):
        x = geometry.x(index)
        if bar.prefilled_tokens is None:
            tall = _tall(bar.prompt_tokens, per_token) if bar.prompt_tokens else TOKENS_HEIGHT
            unknown.append(_rect(x, bottom - tall, width, tall))
        else:
            reused_tall, prefilled_tall = _tall(bar.reused_tokens, per_token), _tall(bar.prefilled_tokens, per_token)
            if reused_tall:
                reused.append(_rect(x, bottom - reused_tall, width, reused_tall))
            if prefilled_tall:
                prefilled.append(_rect(x, bottom - reused_tall - prefilled_tall, width, prefilled_tall))
        if bar.ttft_s is None:
            ttft_unknown.append(_rect(x, geometry.ttft_bottom - 3, width, 3))
        else:
            tall = max(1.0, round(bar.ttft_s * per_second, 1))
            ttft.append(_rect(x, geometry.ttft_bottom - tall, width, tall))
    placed = _label_rows(bars, geometry)
    labels_end = max((geometry.x(index_of[id(bar)]) + len(_marker_label(bar)) * CHAR_PX for bar, row in placed if row is not None), default=0)
    parts = [
        f'<svg class="lane" data-lane="{lane_index}" data-step="{step}" data-left="{LEFT}" width="{max(geometry.width, round(labels_end) + RIGHT)}" '
        f'height="{geometry.height}" shape-rendering="crispEdges" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{LEFT - 6}" y="{geometry.tokens_top + 10}" text-anchor="end">{f"{max_tokens:,}" if max_tokens else "?"} tok</text>',
        f'<text x="{LEFT - 6}" y="{bottom}" text-anchor="end">0</text>',
        f'<text x="{LEFT - 6}" y="{bottom + GAP + 10}" text-anchor="end">TTFT {max_ttft:.2f} s</text>',
        f'<path d="M{LEFT - 2} {bottom + 0.5}H{geometry.width - RIGHT}M{LEFT - 2} {geometry.ttft_bottom + 0.5}H{geometry.width - RIGHT}" stroke="#bbb"/>',
    ]
    for colour, rects in ((REUSED, reused), (PREFILLED, prefilled), ("url(#unknown)", unknown), (TTFT, ttft), (UNKNOWN, ttft_unknown)):
        if rects:
            parts.append(f'<path fill="{colour}" d="{"".join(rects)}"/>')
    every = max(1, round(60 / step))
    for index in range(0, len(bars), every):
        parts.append(f'<text x="{geometry.x(index)}" y="{geometry.height - 4}">#{bars[index].seq}</text>')
    for bar, row in placed:
        x = geometry.x(index_of[id(bar)]) + width / 2
        top = geometry.tokens_top - MARKER
        label = _marker_label(bar)
        text = f'<text x="{x - 2:g}" y="{top - 4 - row * LABEL_ROW}">{_e(label)}</text>' if row is not None else ""
        parts.append(
            f'<a class="break" href="#break-{bar.seq}"><title>{_e(label)}</title>'
            f'<path fill="{BREAK}" d="M{x - 5:g} {top}h10l-5 {MARKER}z"/>'
            f'<path stroke="{BREAK}" stroke-dasharray="3 3" d="M{x:g} {geometry.tokens_top}V{bottom}"/>{text}</a>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _lane_section(index: int, lane: str, bars: list[RequestBar], max_ttft: float) -> str:
    known = [bar for bar in bars if bar.prefilled_tokens is not None]
    prompt, reused = sum(bar.prompt_tokens for bar in known), sum(bar.reused_tokens for bar in known)
    share = f" ({reused / prompt:.0%})" if prompt else ""
    unknown = f" · reuse unknown for {len(bars) - len(known)}" if len(known) < len(bars) else ""
    breaks = sum(1 for bar in bars if bar.broke)
    return (
        f"<h3>{_e(lane)}</h3><p class=\"sub\">{_plural(len(bars), 'request')} · {reused:,} of {prompt:,} prompt tokens reused{share}"
        f"{unknown} · {_plural(breaks, 'break')}</p><div class=\"scroll\">{lane_svg(index, bars, max_ttft)}</div>"
    )


def _cost_rows(groups: list[CostGroup], rate: PrefillRate | None) -> str:
    rows = ["<tr><th>prefill charged to</th><th>requests</th><th>tokens prefilled</th><th>prefill time (estimated)</th>"
            "<th>TTFT measured (sum)</th></tr>"]
    for group in groups:
        estimate = _seconds(rate.seconds_for(group.prefilled_tokens)) if rate else "?"
        unknown = f" (+{group.unknown} unknown)" if group.unknown else ""
        name = f"break: {group.name}" if group.breaks else group.name
        rows.append(f"<tr><td>{_e(name)}</td><td>{group.requests:,}</td><td>{group.prefilled_tokens:,}{unknown}</td>"
                    f"<td>{estimate}</td><td>{_seconds(group.ttft_s)}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def _rate_note(rate: PrefillRate | None) -> str:
    if rate is None:
        return ("<p class=\"note\">No prefill rate: no request reported both its prefilled tokens and a time to first token "
                "(reuse unknown, or answers not streamed), so no time is estimated.</p>")
    if rate.method == "slope":
        how = (f"the slope of the time to first token against the tokens prefilled (least squares over the {rate.requests:,} "
               f"requests that report both, {rate.tokens:,} tokens). Its intercept, {rate.fixed_s:,.2f} s, is the part of a TTFT "
               "that does not grow with the prefill (the first token's decode, the queue, the proxy), charged to no cause; "
               "prefill grows faster than linearly with a long context, so the rate is that of this session's sizes")
    else:
        how = (f"the sum of prefilled tokens over the sum of the TTFTs of the {rate.requests:,} requests that report both "
               f"({rate.tokens:,} tokens; too few, or too alike, for a slope). A TTFT also holds the first token's decode, the "
               "queue and the proxy, so the rate is a lower bound and each estimated time an upper bound")
    return (
        f"<p class=\"note\">Prefill rate measured on this session: {rate.tokens_per_s:,.0f} tokens/s, {how}. A break's tokens "
        f"include its turn's new ones, which a kept prefix prefills too. \u201c{_e(COLD)}\u201d: the lane had nothing cached "
        f"yet; \u201c{_e(KEPT)}\u201d: what a kept prefix still prefills.</p>"
    )


def _totals(session: Session, rate: PrefillRate | None) -> str:
    totals = session.totals()
    prompt, reused = totals["prompt_tokens"], totals["reused_tokens"]
    breaks = ", ".join(f"{_e(cause)} ×{count}" for cause, count in totals["breaks"].most_common()) or "none"
    rows = [
        ("requests", f"{totals['requests']:,} in {_plural(totals['lanes'], 'lane')}"),
        ("prompt tokens", f"{prompt:,}" + (f" (+{_plural(totals['reuse_unknown'], 'request')} whose reuse is unknown)" if totals["reuse_unknown"] else "")),
        ("reused from the cache", f"{reused:,}" + (f" ({reused / prompt:.1%})" if prompt else "")),
        ("prefilled", f"{totals['prefilled_tokens']:,}"),
        ("prefix breaks", f"{sum(totals['breaks'].values())}: {breaks}"),
        ("time to first token (sum)", _seconds(totals["ttft_s"]) + (f" ({totals['ttft_unknown']} unknown)" if totals["ttft_unknown"] else "")),
        ("prefill rate", f"{rate.tokens_per_s:,.0f} tokens/s (estimated, below)" if rate else "?"),
    ]
    return "<table>" + "".join(f"<tr><td>{name}</td><td>{value}</td></tr>" for name, value in rows) + "</table>"


def _break_section(bar: RequestBar) -> str:
    broke = bar.broke
    heading = f"#{bar.seq} {_e(bar.lane)}: {_e(broke.cause)}, at {_e(broke.where)}"
    if broke.previous is None:
        body = "<p class=\"note\">The lane's previous request is not in this folder: no diff.</p>"
    else:
        command = f"stable-prefix diff {broke.previous} {bar.path} --normalized"
        lines = list(broke.diff_lines) or ["(a body was not JSON: no diff)"]
        more = f"\n… {len(lines) - DIFF_LINES} more lines: run the command above" if len(lines) > DIFF_LINES else ""
        body = (f"<p>What changed, as the backend saw the two requests (<code>{_e(command)}</code> gives the same under the "
                f"default rules):</p><pre>{_e(chr(10).join(lines[:DIFF_LINES]) + more)}</pre>")
    return f'<section class="break" id="break-{bar.seq}"><h3>{heading}</h3><p>{_e(bar.line)}</p>{body}</section>'


def render(session: Session, *, refresh_s: int | None = None) -> str:
    """The page; `refresh_s`: reload itself that often (the live page the proxy serves)."""
    rate = session.prefill_rate()
    requests = session.requests
    max_ttft = max((bar.ttft_s for bar in requests if bar.ttft_s is not None), default=0.0)
    lanes = "".join(_lane_section(index, lane, bars, max_ttft) for index, (lane, bars) in enumerate(session.lanes.items()))
    breaks = "".join(_break_section(bar) for bar in session.breaks) or "<p>None: every request kept its lane's prefix.</p>"
    hover = json.dumps([[bar.line for bar in bars] for bars in session.lanes.values()], ensure_ascii=False).replace("<", "\\u003c")
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    live = f" · refreshes every {refresh_s} s" if refresh_s else ""
    skipped = f"<p class=\"note\">Not read: {_e('; '.join(session.skipped))}</p>" if session.skipped else ""
    legend = (f'<p><span class="key" style="background:{REUSED}"></span>reused from the cache'
              f'<span class="key" style="background:{PREFILLED}"></span>prefilled'
              f'<span class="key" style="background:repeating-linear-gradient(45deg,{UNKNOWN} 0 2px,#e4e4e4 2px 4px)"></span>'
              f'the server did not say<span class="key" style="background:{TTFT}"></span>time to first token'
              f'<span class="key" style="background:{BREAK}"></span>prefix broke (click: its diff)</p>')
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{refresh}<title>stable-prefix · {_e(session.folder.name)}</title>'
        f"<style>{STYLE}</style></head><body>"
        '<svg width="0" height="0" style="position:absolute"><defs><pattern id="unknown" width="6" height="6" '
        f'patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#e4e4e4"/>'
        f'<rect width="3" height="6" fill="{UNKNOWN}"/></pattern></defs></svg>'
        f"<h1>Session {_e(session.folder.name)}</h1><p class=\"sub\">{_e(session.folder)} · {len(requests):,} requests · "
        f"written {time.strftime('%Y-%m-%d %H:%M:%S')}{live}</p>{skipped}"
        f"<h2>Totals</h2>{_totals(session, rate)}"
        f"<h2>Lanes</h2>{legend}{lanes}"
        f"<h2>What the prefill cost</h2>{_cost_rows(session.cost_groups(), rate)}{_rate_note(rate)}"
        f"<h2>Breaks</h2>{breaks}"
        f'<div id="tip" hidden></div><script type="application/json" id="lines">{hover}</script><script>{SCRIPT}</script>'
        "</body></html>"
    )


def waiting_page(text: str, refresh_s: int) -> str:
    """A page with only `text` on it, reloading itself (the live page before there is a session to draw)."""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{refresh_s}">'
            f"<title>stable-prefix · session</title><style>{STYLE}</style></head><body><h1>Session</h1><p>{_e(text)}</p></body></html>")
