"""memnets.train."""
