"""Renderers, side by side and apart from the CLI: analyses and comparisons in, text or JSON out.

text.py: the `analyze` and `compare` reports (80 columns); json.py: the `--json` documents;
csv.py: `analyze --csv`. The HTML dashboard lives in dashboards/.
"""
