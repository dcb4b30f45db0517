/* The NAM part of one LSAM step, forward and backward (memnets.ops.lsam.native): the matrix
 * products h W_hh^T and dg W_hh stay with PyTorch, one product per step, and everything between
 * two products is one call here, one memory at a time (its d x d matrix stays in the first-level
 * cache), instead of a dozen tensor ops over all memories. Layouts as memnets/ops/lsam/loops.py
 * (N memories of d x d, T steps, per-head blocks of 3d + 2 rows [q k v r w]):
 *   GX, BLK, DGX [T, N, 3d+2]  X [N, d, d] = M^T (forward)  W [N, d, d] = M (backward)  dM [N, d, d]
 *   QK [T, N, 2, d]  NRM, P [T, N, 2]  CQ [T, N]  E, U, R, OUT, DOUT [T, N, d]  dh [N, d].
 * Memories n0 <= n < n1 of step t.
 */
#include <math.h>
#include <stddef.h>

#include "fastexp.h"
#include "common.h"

#define REAL float
#define SUF f32
#define EXP fast_expf
#define SQRT sqrtf
#include "lsam_t.h"
#undef REAL
#undef SUF
#undef EXP
#undef SQRT

#define REAL double
#define SUF f64
#define EXP exp
#define SQRT sqrt
#include "lsam_t.h"
