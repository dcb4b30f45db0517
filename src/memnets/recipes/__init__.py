"""Evaluations specific to one experiment family, used by its engine tasks (:mod:`memnets.train.families`).

* :mod:`.fewshot`: generalised few-shot episodes (Novel / Base / Both with 95% confidence
  intervals), the NAM gates and the frozen-feature extraction of the Omniglot tasks.
"""
