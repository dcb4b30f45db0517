"""memnets.viz."""
