"""The web portal: static pages (HTML, a little JS and SVG) that speak to the same API, with the same rights."""

from pathlib import Path

STATIC = Path(__file__).parent / "static"
