"""Plain-text tables: the one formatter the notebooks, the runner's summary and the regression report share."""
from __future__ import annotations


def format_table(rows: list[dict], columns: list[str], floatfmt: str = ".3g", align: str = "right") -> str:
    """`columns` of `rows` as aligned text, a header and a rule; floats formatted with `floatfmt`.

    align: "right" (numbers) or "left" (names, free text). No pandas needed.
    """
    if align not in ("left", "right"):
        raise ValueError(f"align must be 'left' or 'right', got {align!r}")
    def f(x):
        return format(x, floatfmt) if isinstance(x, float) else str(x)
    cells = [list(columns)] + [[f(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    pad = str.rjust if align == "right" else str.ljust
    lines = ["  ".join(pad(c, w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)
