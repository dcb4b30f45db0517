/* fast_expf and fast_logf, shared by the kernels that take an exponential or a logarithm of
 * float32 (gru.c, lsam.c, dnc.c, ntm.c). */
#ifndef MEMNETS_FASTEXP_H
#define MEMNETS_FASTEXP_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp for float32 without a library call, so that loops over it vectorise: 2^k e^r with
 * |r| <= ln 2 / 2 and a degree-7 polynomial (relative error below 2e-7, about that of expf).
 * The reduction r = x - k ln 2 is one subtraction in double, which no reassociation of the
 * sums (-fassociative-math) can undo, unlike the usual two-part float reduction. NaN stays NaN
 * (and is never converted to an integer); x > 88.72 gives inf, x < -87 gives 0 (the true value
 * is below 1.7e-38 there). */
static inline float fast_expf(float x)
{
    const int nan = x != x;
    const float xc = nan ? 0.0f : x < -87.0f ? -87.0f : x > 88.72284f ? 88.72284f : x;
    const float k = floorf(xc * 1.44269504088896341f + 0.5f); /* -126 <= k <= 128 */
    const float r = (float)((double)xc - (double)k * 0.69314718055994530942);
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const float hi = k > 127.0f ? 1.0f : 0.0f; /* 2^128 = 2^127 * 2: the exponent field stops at 254 */
    const uint32_t bits = (uint32_t)((int32_t)(k - hi) + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    const float y = p * scale * (1.0f + hi);
    return nan ? x : x > 88.72284f ? INFINITY : x < -87.0f ? 0.0f : y;
}

/* log for float32 without a library call, so that loops over it vectorise: x = 2^e m with
 * sqrt(1/2) <= m < sqrt(2), log x = e ln 2 + log1p(m - 1), the latter by the minimax polynomial
 * of Cephes' logf (relative error below 3e-7 over the positive normal numbers); e ln 2 is added
 * in double, which no reassociation of the sums can split. NaN and +inf come back as they are,
 * 0 gives -inf, a negative x NaN; denormal x (below 1.2e-38) is taken as 0. */
static inline float fast_logf(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const int32_t e0 = (int32_t)((bits >> 23) & 0xffu) - 127;
    const uint32_t mbits = (bits & 0x007fffffu) | 0x3f800000u; /* m in [1, 2) */
    float m;
    memcpy(&m, &mbits, sizeof m);
    const int big = m > 1.41421356f;
    const float f = (big ? 0.5f * m : m) - 1.0f;
    const float e = (float)(e0 + big);
    const float z = f * f;
    float p = 7.0376836292e-2f;
    p = p * f - 1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f - 1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f - 1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f - 2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    const float l1p = f + (p * f * z - 0.5f * z); /* log1p(f) */
    const float y = (float)((double)e * 0.69314718055994530942 + (double)l1p);
    return x != x ? x : x == INFINITY ? x : x < 1.17549435e-38f ? (x < 0.0f ? NAN : -INFINITY) : y;
}

#endif
