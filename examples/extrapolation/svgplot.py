"""A dependency-free SVG line plot of perplexity against evaluation length: two panels (all
tokens of each window; its last L tokens), one line per position scheme, log-scaled axes."""

import math
from xml.sax.saxutils import escape

COLOURS = {"alibi": "#1f77b4", "dpb": "#2ca02c", "t5": "#9467bd", "sinusoidal": "#d62728",
           "none": "#7f7f7f"}
DASHES = {"alibi": "", "dpb": "6,3", "t5": "2,3", "sinusoidal": "", "none": "8,3,2,3"}


def nice_ticks(lo, hi):
    """Tick values for a log axis between lo and hi: 1-2-5 steps, at least three ticks."""
    ticks = []
    for base in (1, 2, 5, 1.5, 3, 4, 6, 8):
        for e in range(int(math.floor(math.log10(lo))) - 1, int(math.ceil(math.log10(hi))) + 1):
            v = base * 10.0**e
            if lo <= v <= hi:
                ticks.append(v)
        if len(ticks) >= 3:
            break
    return sorted(set(ticks))


def fmt(v):
    return f"{v:g}"


def write_plot(results, path, title=None):
    schemes = results["schemes"]
    config = results["config"]
    seq_len = config["seq_len"]
    lengths = [r["length"] for r in next(iter(schemes.values()))["eval"]]
    values = [r[k] for s in schemes.values() for r in s["eval"] for k in ("ppl_all", "ppl_last")]
    lo, hi = min(values) / 1.08, max(values) * 1.08
    panel_w, panel_h, left, top, gap = 360, 300, 70, 60, 80
    width = left + 2 * panel_w + gap + 150
    height = top + panel_h + 70
    out = []
    add = out.append
    add(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">')
    add(f'<rect width="{width}" height="{height}" fill="white"/>')
    title = title or (f"Train at L = {seq_len} ({config['steps']} steps), evaluate at "
                      f"{', '.join(str(n // seq_len) + 'L' for n in lengths)}")
    add(f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="15">{escape(title)}</text>')

    def xpos(x0, n):
        a, b = math.log(lengths[0]), math.log(lengths[-1])
        t = 0.5 if a == b else (math.log(n) - a) / (b - a)
        return x0 + 20 + t * (panel_w - 40)

    def ypos(v):
        t = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return top + panel_h - t * panel_h

    for p, (key, name) in enumerate((("ppl_all", "all tokens of each window"),
                                     ("ppl_last", f"last L = {seq_len} tokens of each window"))):
        x0 = left + p * (panel_w + gap)
        add(f'<rect x="{x0}" y="{top}" width="{panel_w}" height="{panel_h}" fill="none" '
            f'stroke="#444"/>')
        add(f'<text x="{x0 + panel_w / 2}" y="{top - 10}" text-anchor="middle">'
            f'{escape(name)}</text>')
        for v in nice_ticks(lo, hi):
            y = ypos(v)
            add(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + panel_w}" y2="{y:.1f}" '
                f'stroke="#ddd"/>')
            add(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
        for n in lengths:
            x = xpos(x0, n)
            add(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + panel_h}" '
                f'stroke="#eee"/>')
            add(f'<text x="{x:.1f}" y="{top + panel_h + 18}" text-anchor="middle">{n}</text>')
        add(f'<text x="{x0 + panel_w / 2}" y="{top + panel_h + 40}" text-anchor="middle">'
            f'evaluation length (bytes, log scale)</text>')
        yc = top + panel_h / 2
        add(f'<text x="{x0 - 50}" y="{yc}" text-anchor="middle" '
            f'transform="rotate(-90 {x0 - 50} {yc})">perplexity (log scale)</text>')
        for scheme, res in schemes.items():
            colour = COLOURS.get(scheme, "#000")
            dash = DASHES.get(scheme, "")
            pts = " ".join(f"{xpos(x0, r['length']):.1f},{ypos(r[key]):.1f}" for r in res["eval"])
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            add(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"'
                f'{dash_attr}/>')
            for r in res["eval"]:
                add(f'<circle cx="{xpos(x0, r["length"]):.1f}" cy="{ypos(r[key]):.1f}" r="3" '
                    f'fill="{colour}"/>')
    lx = left + 2 * panel_w + gap + 20
    for k, scheme in enumerate(schemes):
        y = top + 20 + 22 * k
        colour = COLOURS.get(scheme, "#000")
        dash = DASHES.get(scheme, "")
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        add(f'<line x1="{lx}" y1="{y}" x2="{lx + 30}" y2="{y}" stroke="{colour}" '
            f'stroke-width="2"{dash_attr}/>')
        add(f'<text x="{lx + 38}" y="{y + 4}">{escape(scheme)}</text>')
    add("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
