/* Shared by the memnets C kernels. A kernel's body is written once, in <kernel>_t.h, for a
 * number type REAL and names FN(f) = f_<suffix>, and included once per type. */
#ifndef FN
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SUF)
#endif

#ifndef PREFETCH_ROW
/* Ask for a row of the next step early: rows of one sequence are a few hundred bytes apart,
 * in a dozen arrays at once, more streams than the hardware prefetchers follow. */
#define PREFETCH_ROW(p, bytes, rw) do { \
        for (long o_ = 0; o_ < (long)(bytes); o_ += 64) __builtin_prefetch((const char *)(p) + o_, rw, 3); \
    } while (0)
#endif

#ifndef IVDEP
/* Before a loop over rows the caller allocated apart (never overlapping): vectorise it without
 * run-time overlap checks. GCC does not take `restrict` on pointers declared inside a function
 * as proof, and with more than a few arrays in a loop gives up on the checks and on vectorising. */
#if defined(__clang__)
#define IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define IVDEP _Pragma("GCC ivdep")
#else
#define IVDEP
#endif
#endif
