"""What-if replay: re-time the dependency graph, edited, to predict what a fix gains."""
