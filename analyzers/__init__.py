"""Pure functions from trace events (typed DataFrames) to breakdowns, summaries and comparisons."""
