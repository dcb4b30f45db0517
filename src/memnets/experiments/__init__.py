"""The experiments of docs/results.md are engine tasks (:mod:`memnets.train.families`), run by
``memnets train <family>/<preset>`` or, under their former names, ``memnets experiment``
(:mod:`memnets.cli.experiment`). :mod:`.lra` keeps the LRA model sizes for the benchmarks."""
