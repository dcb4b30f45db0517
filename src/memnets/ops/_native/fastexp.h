/* fast_expf, shared by the kernels that take an exponential of float32 (gru.c, lsam.c). */
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

#endif
