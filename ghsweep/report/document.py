"""A small report document rendered both as markdown and as one self-contained HTML file.

The sweep comparison and the assignment report are built once as blocks (headings, paragraphs,
tables, images) and written in both forms, so the two renderings never drift apart.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ghsweep.core.atomic import write_atomic

STYLE = (
    "body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}th{background:#f2f2f2}img{max-width:100%}"
)


@dataclass(frozen=True)
class TextBlock:
    kind: Literal["heading", "paragraph"]
    text: str


@dataclass(frozen=True)
class TableBlock:
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class ImageBlock:
    alt: str
    path: Path


Block = TextBlock | TableBlock | ImageBlock


@dataclass
class Document:
    title: str
    blocks: list[Block] = field(default_factory=list)

    def heading(self, text: str) -> None:
        self.blocks.append(TextBlock("heading", text))

    def paragraph(self, text: str) -> None:
        self.blocks.append(TextBlock("paragraph", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(TableBlock(header, rows))

    def image(self, alt: str, path: Path) -> None:
        self.blocks.append(ImageBlock(alt, path))

    def to_markdown(self, base_dir: Path) -> str:
        lines = [f"# {self.title}", ""]
        for block in self.blocks:
            if isinstance(block, TextBlock) and block.kind == "heading":
                lines += [f"## {block.text}", ""]
            elif isinstance(block, TextBlock):
                lines += [str(block.text), ""]
            elif isinstance(block, TableBlock):
                header, rows = block.header, block.rows
                lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
                lines.append("")
            else:
                alt, path = block.alt, block.path
                lines += [f"![{alt}]({path.relative_to(base_dir).as_posix()})", ""]
        return "\n".join(lines)

    def to_html(self) -> str:
        esc = html.escape
        parts = [
            f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(self.title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{esc(self.title)}</h1>"
        ]
        for block in self.blocks:
            if isinstance(block, TextBlock) and block.kind == "heading":
                parts.append(f"<h2>{esc(str(block.text))}</h2>")
            elif isinstance(block, TextBlock):
                parts.append(f"<p>{esc(str(block.text))}</p>")
            elif isinstance(block, TableBlock):
                header, rows = block.header, block.rows
                parts.append(
                    "<table><tr>"
                    + "".join(f"<th>{esc(h)}</th>" for h in header)
                    + "</tr>"
                    + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
                    + "</table>"
                )
            else:
                # Embedded, so the file reads the same in a browser, an e-mail or MLflow's artifact view.
                alt, path = block.alt, block.path
                data = base64.b64encode(path.read_bytes()).decode()
                parts.append(f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">')
        return "".join(parts) + "</body></html>"

    def write(self, out_dir: Path, stem: str) -> list[Path]:
        """Write STEM.md and STEM.html under out_dir (images must already lie under it)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        md, page = out_dir / f"{stem}.md", out_dir / f"{stem}.html"
        write_atomic(md, self.to_markdown(out_dir), mode=0o644)
        write_atomic(page, self.to_html(), mode=0o644)
        return [md, page]
