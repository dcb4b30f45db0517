/* The memory access of one DNC step (docs/maths.md §8), forward (memnets.ops.dnc.forward) and
 * backward (memnets.ops.dnc.backward's reverse loop, dnc_access_bwd in dnc_t.h), as plain loops
 * for the CPU. Forward: from the step's interface vector (already W_xi h + b_xi, in the
 * order of memnets.ops.dnc.layout.interface_layout) and the state the step starts from, every
 * value the PyTorch ops of run_forward write into the forward workspace, for batch rows
 * b0 <= b < b1: strengths, gates, read modes, keys, retention, usage, its stable ascending sort
 * and the allocation, the write content weighting and write weighting, the erase/add write,
 * link, precedence, directional weightings, the read content weighting, the read weightings and
 * the reads (into RD, and into X0). The backward (memnets.ops.dnc.backward) reads those buffers
 * as it reads the ops'. alloc [B, N] is scratch.
 * Layouts: every buffer [T(+1), B, ...] contiguous, as memnets.ops.dnc.workspace; LL [T+1, B,
 * N, 2N] holds [L | L^T] row by row; X0 [T+1, B, XW] takes the reads of step t in row t + 1,
 * columns 0 .. R*W. PHI is int64.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "fastexp.h"

#define REAL float
#define SUF f32
#define EXP fast_expf
#define LOG1P log1pf
#define SQRT sqrtf
#include "dnc_t.h"
#undef REAL
#undef SUF
#undef EXP
#undef LOG1P
#undef SQRT

#define REAL double
#define SUF f64
#define EXP exp
#define LOG1P log1p
#define SQRT sqrt
#include "dnc_t.h"
