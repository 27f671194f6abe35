"""A run's report as one self-contained HTML page: sections of text, tables, code and images.

A report that links to files breaks when the run folder is copied, mailed or opened from an
archive, so every image is embedded (base64 PNG in a ``data:`` URI), the style is inline, and
the page names no external resource: the file alone is the report. The quickstart writes one
(``runs/quickstart/report.html``); any stage that leaves PNGs and numbers can add a section.

Not here: drawing the curves (``pretrain.plots.plot_loss``, ``rl.report.draw_report``).
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from opencomposer.io import atomic_write_text

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 980px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { border-bottom: 2px solid #444; padding-bottom: .2em; }
h2 { margin-top: 2em; border-bottom: 1px solid #bbb; }
table { border-collapse: collapse; margin: .8em 0; }
th, td { border: 1px solid #ccc; padding: .25em .7em; text-align: right; }
th { background: #f0f0f0; }
td:first-child, th:first-child { text-align: left; }
pre { background: #f6f6f6; padding: .7em; overflow-x: auto; white-space: pre-wrap; font-size: 85%; }
img { max-width: 100%; border: 1px solid #ddd; margin: .5em 0; }
nav a { margin-right: 1em; }
details { margin: .3em 0; } summary { cursor: pointer; font-size: 90%; }
.note { color: #555; font-size: 90%; }
"""


class HtmlReport:
    """``report.section("pretrain", "Pretraining"); report.text(...); report.image(png); report.write(path)``.

    Each call appends to the current section (the last one opened); text is escaped."""

    def __init__(self, title: str):
        self.title = title
        self.sections: list[tuple[str, str, list[str]]] = []  # (id, title, html parts)

    def section(self, anchor: str, title: str) -> None:
        self.sections.append((anchor, title, []))

    def _add(self, part: str) -> None:
        if not self.sections:
            raise ValueError("HtmlReport: open a section before adding to it")
        self.sections[-1][2].append(part)

    def text(self, text: str, *, note: bool = False) -> None:
        self._add(f'<p{" class=note" if note else ""}>{html.escape(text)}</p>')

    def code(self, text: str, caption: str = "") -> None:
        head = f"<p><b>{html.escape(caption)}</b></p>" if caption else ""
        self._add(f"{head}<pre>{html.escape(text)}</pre>")

    def details(self, summary: str, text: str) -> None:
        """A folded block: ``summary`` shown, ``text`` (as code) one click away."""
        self._add(f"<details><summary>{html.escape(summary)}</summary><pre>{html.escape(text)}</pre></details>")

    def table(self, header: list[str], rows: list[list[object]]) -> None:
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
        self._add(f"<table><tr>{head}</tr>{body}</table>")

    def image(self, png: Path, alt: str) -> None:
        """Embed the PNG at ``png`` (base64); a missing file is noted, not an error."""
        png = Path(png)
        if not png.is_file():
            self.text(f"({png.name} was not written)", note=True)
            return
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        self._add(f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">')

    def render(self) -> str:
        nav = " ".join(f'<a href="#{anchor}">{html.escape(title)}</a>' for anchor, title, _ in self.sections)
        body = "\n".join(f'<section id="{anchor}"><h2>{html.escape(title)}</h2>\n' + "\n".join(parts) + "</section>"
                         for anchor, title, parts in self.sections)
        return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8><title>{html.escape(self.title)}</title>"
                f"<style>{STYLE}</style></head>\n<body><h1>{html.escape(self.title)}</h1>\n<nav>{nav}</nav>\n"
                f"{body}\n</body></html>\n")

    def write(self, path: Path) -> Path:
        path = Path(path)
        atomic_write_text(path, self.render())
        return path
