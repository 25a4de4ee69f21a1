"""What every report page must be, for the report tests (unit and integration): a self-contained
HTML page with each PNG beside it embedded and linked from the Markdown, each PNG a real figure."""
from __future__ import annotations

import base64
import io
import re

import matplotlib.image as mpimg

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_png(data: bytes) -> None:
    """A decodable PNG that is not blank (some pixel differs from the first)."""
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    pixels = mpimg.imread(io.BytesIO(data), format="png")
    assert pixels.shape[0] > 200 and pixels.shape[1] > 300
    assert (pixels != pixels[0, 0]).any()


def check_page(out, kind: str) -> str:
    """HTML with every PNG beside it embedded, nothing fetched from elsewhere; Markdown links them."""
    page = (out / f"{kind}.html").read_text()
    md = (out / f"{kind}.md").read_text()
    pngs = sorted(out.glob("*.png"))
    assert pngs
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(embedded) == len(pngs)
    for png in pngs:
        data = png.read_bytes()
        check_png(data)
        assert base64.b64encode(data).decode() in embedded
        assert f"]({png.name})" in md
    assert not re.search(r'(src|href)="(?!data:)', page), "the page must not load other files"
    for csv in out.glob("*.csv"):
        assert f"{csv.name}" in page and f"({csv.name})" in md
    return page
