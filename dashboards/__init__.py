"""Renderers: analyzer frames in, one self-contained HTML file out."""
