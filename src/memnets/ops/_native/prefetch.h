/* Shared by the memnets C kernels. */
#ifndef PREFETCH_ROW
/* Ask for a row of the next step early: rows of one sequence are a few hundred bytes apart,
 * in a dozen arrays at once, more streams than the hardware prefetchers follow. */
#define PREFETCH_ROW(p, bytes, rw) do { \
        for (long o_ = 0; o_ < (long)(bytes); o_ += 64) __builtin_prefetch((const char *)(p) + o_, rw, 3); \
    } while (0)
#endif
