"""Experiment commands (``python -m memnets.experiments.<name>``): learning runs that write results."""
