/* The elementwise part of one GRU step, forward and backward (memnets.ops.gru): the matrix
 * products h W_hh^T and dg W_hh stay with PyTorch, one batched product per step, and
 * everything between two products is one call here instead of a handful of tensor ops.
 * Layouts as memnets/ops/gru.py: gx [D,B,T,3h]  RZ [D,B,T,2h]  NN, GHN, DN, dO [D,B,T,h]
 * HS [D,B,T+2,h] (time tau at row tau + 1)  DGH [D,B,T,3h]; per step gh, dg [D,B,3h] and
 * h, dh, direct [D,B,h]. Step t of direction d is time tau = t, or T - 1 - t for the second
 * direction of a reversed pair.
 */
#include <math.h>
#include <stddef.h>
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

/* tanh for float32 from fast_expf: (1 - e) / (1 + e) with e = exp(-2|x|), and its Taylor
 * series below |x| = 1/8, where 1 - e would cancel (relative error about 1e-6). */
static inline float fast_tanhf(float x)
{
    const float a = x < 0 ? -x : x, x2 = x * x;
    const float e = fast_expf(-2.0f * a);
    const float big = (1.0f - e) / (1.0f + e);
    const float small = a * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f + x2 * (-17.0f / 315.0f))));
    const float y = a < 0.125f ? small : big;
    return x < 0 ? -y : y;
}

#include "common.h"


#define REAL float
#define SUF f32
#define EXP fast_expf
#define TANH fast_tanhf
#include "gru_t.h"
#undef REAL
#undef SUF
#undef EXP
#undef TANH

#define REAL double
#define SUF f64
#define EXP exp
#define TANH tanh
#include "gru_t.h"
