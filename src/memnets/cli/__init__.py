"""memnets.cli."""
