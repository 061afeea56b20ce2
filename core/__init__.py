"""The ground floor: what every other folder stands on and nothing here stands on them.

The trace format (columns, meta, validate, trace, stream), the rules that say what a checkpoint
is (rules, buffers, order), and the shared plumbing: errors, units, terminal text, safe output,
stdio, heap, stop signals, the request file and the load generator. Imports only itself.
"""
