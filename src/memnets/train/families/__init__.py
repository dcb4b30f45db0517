"""The task families of the training engine, one module each (:mod:`memnets.train.task`).

* :mod:`.nsp`: the masked-completion algorithmic tasks fib, addition, palindrome, reduce;
* :mod:`.ntm`: the NTM tasks copy, repeat_copy, associative_recall, priority_sort.
"""
