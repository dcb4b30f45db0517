/* A NAM memory scanned step by step (memnets.ops.nam_tape), forward and its hand-derived
 * backward, as plain loops for the CPU: for each sequence (b, h) and t = 0..T-1
 *     a = S k;   u = p_w v - p_e a;   S' = S + u k^T;   o = p_r S' q        (docs/maths.md §1)
 * with S stored transposed (S^T: K rows of V numbers). Sequences are independent, so each
 * call runs n0 <= n < n1 (n = b * H + h) to the end: S stays in the first-level cache.
 * Layouts (contiguous, batch-major as memnets.ops.nam_scan): q, k [B,T,H,K]  v, o [B,T,H,V]
 * p_w, p_e, p_r [B,T,H]  state [B,H,K,V]. The backward walks S back, S = S' - u k^T, from
 * copies saved every S_ steps and at the end (so rounding builds up over at most S_ steps).
 */
#include <stddef.h>
#include <string.h>

#include "common.h"

#define REAL float
#define SUF f32
#include "rows.h"
#include "nam_tape_t.h"
#undef REAL
#undef SUF

#define REAL double
#define SUF f64
#include "rows.h"
#include "nam_tape_t.h"
