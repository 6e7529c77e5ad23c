"""A small report document rendered both as markdown and as one self-contained HTML file.

The sweep comparison and the assignment report are built once as blocks (headings, paragraphs,
tables, images) and written in both forms, so the two renderings never drift apart.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

STYLE = (
    "body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}th{background:#f2f2f2}img{max-width:100%}"
)


@dataclass
class Document:
    title: str
    blocks: list[tuple[str, object]] = field(default_factory=list)

    def heading(self, text: str) -> None:
        self.blocks.append(("heading", text))

    def paragraph(self, text: str) -> None:
        self.blocks.append(("paragraph", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("table", (header, rows)))

    def image(self, alt: str, path: Path) -> None:
        self.blocks.append(("image", (alt, path)))

    def to_markdown(self, base_dir: Path) -> str:
        lines = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "heading":
                lines += [f"## {value}", ""]
            elif kind == "paragraph":
                lines += [str(value), ""]
            elif kind == "table":
                header, rows = value
                lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
                lines.append("")
            else:
                alt, path = value
                lines += [f"![{alt}]({path.relative_to(base_dir).as_posix()})", ""]
        return "\n".join(lines)

    def to_html(self) -> str:
        esc = html.escape
        parts = [
            f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(self.title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{esc(self.title)}</h1>"
        ]
        for kind, value in self.blocks:
            if kind == "heading":
                parts.append(f"<h2>{esc(str(value))}</h2>")
            elif kind == "paragraph":
                parts.append(f"<p>{esc(str(value))}</p>")
            elif kind == "table":
                header, rows = value
                parts.append(
                    "<table><tr>"
                    + "".join(f"<th>{esc(h)}</th>" for h in header)
                    + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
                    + "</table>"
                )
            else:
                # Embedded, so the file reads the same in a browser, an e-mail or MLflow's artifact view.
                alt, path = value
                data = base64.b64encode(path.read_bytes()).decode()
                parts.append(f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">')
        return "".join(parts) + "</body></html>"

    def write(self, out_dir: Path, stem: str) -> list[Path]:
        """Write STEM.md and STEM.html under out_dir (images must already lie under it)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        md, page = out_dir / f"{stem}.md", out_dir / f"{stem}.html"
        md.write_text(self.to_markdown(out_dir))
        page.write_text(self.to_html())
        return [md, page]
