/* The NAM-TM head and key-tape recurrence (memnets.ops.nam_tm_heads), forward and its
 * hand-derived backward, as plain loops for the CPU.
 *
 * The recurrence is independent across n (batch x tapes), so each call runs sequences
 * n0 <= n < n1 to the end before the next one: a sequence's key tape (L x C numbers) stays
 * in the first-level cache for all T steps, and the caller splits n over threads.
 * Layouts are those of memnets/ops/nam_tm_heads.py, contiguous, N = B * Tn sequences, either
 * time-major (bm = 0; B = 1, Tn = N) or batch-major (bm = 1), which keeps a sequence's
 * steps close together in memory:
 *   per step: act [.,2,A], q, k [.,C], pw, pe [.], Aa, U [.,X] (X = C for the position key
 *   tape, L for the transposed one), J [.,L], each [T,N,...] or [B,T,Tn,...]; Hs [T+1,N,2,L]
 *   or [B,T+1,Tn,2,L]; per sequence n: h0 [N,2,L] and the saved key tapes Kc [slots,N,L,C].
 * Actions: 0 LEFT (out[l] = in[l+1]), 1 NOOP, 2 RIGHT (out[l] = in[l-1]), 3 JUMP (out = j).
 * The maths is in docs/maths.md (NAM-TM); the Python docstrings give each product.
 */
#include <stddef.h>
#include <math.h>
#include <string.h>


/* the row of step t of sequence n = b * Tn + h in the per-step arrays (S) and in Hs (H) */
#define ROW_S(t) (bm ? (b * T + (t)) * Tn + h : (t) * N + n)
#define ROW_H(t) (bm ? (b * (T + 1) + (t)) * Tn + h : (t) * N + n)

#include "common.h"

#define REAL float
#define SUF f32
#include "rows.h"
#include "nam_tm_heads_t.h"
#undef REAL
#undef SUF

#define REAL double
#define SUF f64
#include "rows.h"
#include "nam_tm_heads_t.h"
