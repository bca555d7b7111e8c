"""The dependency graph: timeline ops, cross-stream and cross-rank matches, clocks, `DepGraph`."""
