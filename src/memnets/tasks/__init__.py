"""memnets.tasks."""
