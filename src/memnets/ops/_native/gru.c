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

#include "fastexp.h"

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
