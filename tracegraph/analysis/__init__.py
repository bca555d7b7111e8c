"""Analysis on the graph: critical path, bubble blame, stragglers, pipeline, the whole pass."""
