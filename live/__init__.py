"""The live views: `top` and `serve` on running processes.

The live session both share (session.py: the recorder's program loaded once, processes attached
and detached, batches drained), `top`'s view (top.py) and `serve`'s loop and /metrics server
(serve.py). Above probes/ (the program and the fold), renderers/ and exporters/ (what they draw).
"""
