/* The memory access of one NTM step (docs/maths.md §7), forward and backward, as plain loops
 * for the CPU (memnets.ops.ntm_access). From the heads' raw parameters (the controller's head
 * layer output), the erase and add vectors and the state the step starts from, for batch rows
 * b0 <= b < b1: the write heads address M_{t-1} (content, interpolation, circular shift,
 * sharpening), the erase/add write makes M_t, the read heads address M_t and read it. The
 * backward takes the gradients of the step's outputs and returns those of its inputs.
 * Layouts, every buffer contiguous, batch first: HP [B, R+Hw, P] (the R read heads first;
 * P = W + 3 + S: key, strength, gate, sharpening, S shift logits), ER / AD [B, Hw, W],
 * M0 / M1 [B, N, W], WR0 / WR1 [B, R, N], WW0 / WW1 [B, Hw, N], RD [B, R, W], AUX [B, R+Hw, 4N]
 * (per head: cosine, content weighting, interpolated and shifted weighting, for the backward),
 * SCR [B, ntm_scratch(N, W, S)] (each row its own: rows may run on different threads).
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common.h"
#include "fastexp.h"

/* slot i of N for -N <= i < 2N (the shift j - n read at slot i is slot i - j + n) */
static inline long ntm_wrap(long i, long N) { return i < 0 ? i + N : i >= N ? i - N : i; }

#define REAL float
#define SUF f32
#define EXP fast_expf
#define LOG fast_logf
#define LOG1P log1pf
#define SQRT sqrtf
#define TANH tanhf
#include "ntm_t.h"
#undef REAL
#undef SUF
#undef EXP
#undef LOG
#undef LOG1P
#undef SQRT
#undef TANH

#define REAL double
#define SUF f64
#define EXP exp
#define LOG log
#define LOG1P log1p
#define SQRT sqrt
#define TANH tanh
#include "ntm_t.h"
