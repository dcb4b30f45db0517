/* Row kernels shared by the memnets C kernels: a matrix is n rows of m numbers, row r at
 * X + r * m. Rows are taken four at a time, so that four independent sums are in flight
 * (one row at a time, a sum kept in memory waits on its own previous store), then one at a
 * time for the rest. 
 */

/* Included once per type, with REAL (the number type) and FN(name) (name_<suffix>) defined. */

#include "common.h"

#ifndef ROW4
#define ROW4(REAL, X, r, m) const REAL *restrict X##0 = X + (r) * (m), *restrict X##1 = X##0 + (m), \
                      *restrict X##2 = X##1 + (m), *restrict X##3 = X##2 + (m)
#define WROW4(REAL, X, r, m) REAL *restrict X##0 = X + (r) * (m), *restrict X##1 = X##0 + (m),      \
                       *restrict X##2 = X##1 + (m), *restrict X##3 = X##2 + (m)
#endif

/* acc[:] (+)= sum_r s[r] R[r, :]  (set when init) */
static inline void FN(rows_accum)(REAL *restrict acc, const REAL *restrict R,
                                    const REAL *restrict s, long n, long m, int init)
{
    if (init) for (long c = 0; c < m; ++c) acc[c] = 0;
    long r = 0;
    for (; r + 4 <= n; r += 4) {
        ROW4(REAL, R, r, m);
        const REAL s0 = s[r], s1 = s[r + 1], s2 = s[r + 2], s3 = s[r + 3];
        for (long c = 0; c < m; ++c) acc[c] += s0 * R0[c] + s1 * R1[c] + s2 * R2[c] + s3 * R3[c];
    }
    for (; r < n; ++r) {
        const REAL *restrict R0 = R + r * m;
        const REAL s0 = s[r];
        for (long c = 0; c < m; ++c) acc[c] += s0 * R0[c];
    }
}
/* out[r] (+)= R[r, :] . y  (set when init) */
static inline void FN(rows_dot)(REAL *restrict out, const REAL *restrict R,
                                  const REAL *restrict y, long n, long m, int init)
{
    long r = 0;
    for (; r + 4 <= n; r += 4) {
        ROW4(REAL, R, r, m);
        REAL a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (long c = 0; c < m; ++c) {
            a0 += R0[c] * y[c]; a1 += R1[c] * y[c]; a2 += R2[c] * y[c]; a3 += R3[c] * y[c];
        }
        if (init) { out[r] = a0; out[r + 1] = a1; out[r + 2] = a2; out[r + 3] = a3; }
        else { out[r] += a0; out[r + 1] += a1; out[r + 2] += a2; out[r + 3] += a3; }
    }
    for (; r < n; ++r) {
        const REAL *restrict R0 = R + r * m;
        REAL a0 = 0;
        for (long c = 0; c < m; ++c) a0 += R0[c] * y[c];
        out[r] = init ? a0 : out[r] + a0;
    }
}
/* O[r, :] = R[r, :] + s[r] x[:], and j[r] = O[r, :] . y */
static inline void FN(rows_update_dot)(REAL *restrict O, const REAL *restrict R,
                                         const REAL *restrict s, const REAL *restrict x,
                                         const REAL *restrict y, REAL *restrict j, long n, long m)
{
    long r = 0;
    for (; r + 4 <= n; r += 4) {
        ROW4(REAL, R, r, m);
        WROW4(REAL, O, r, m);
        const REAL s0 = s[r], s1 = s[r + 1], s2 = s[r + 2], s3 = s[r + 3];
        REAL a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (long c = 0; c < m; ++c) {
            const REAL v0 = R0[c] + s0 * x[c], v1 = R1[c] + s1 * x[c];
            const REAL v2 = R2[c] + s2 * x[c], v3 = R3[c] + s3 * x[c];
            O0[c] = v0; O1[c] = v1; O2[c] = v2; O3[c] = v3;
            a0 += v0 * y[c]; a1 += v1 * y[c]; a2 += v2 * y[c]; a3 += v3 * y[c];
        }
        j[r] = a0; j[r + 1] = a1; j[r + 2] = a2; j[r + 3] = a3;
    }
    for (; r < n; ++r) {
        const REAL *restrict R0 = R + r * m;
        REAL *restrict O0 = O + r * m;
        const REAL s0 = s[r];
        REAL a0 = 0;
        for (long c = 0; c < m; ++c) {
            const REAL v0 = R0[c] + s0 * x[c];
            O0[c] = v0;
            a0 += v0 * y[c];
        }
        j[r] = a0;
    }
}
/* O[r, :] = R[r, :] + s[r] x[:], and acc[:] += sum_r y[r] O[r, :] */
static inline void FN(rows_update_acc)(REAL *restrict O, const REAL *restrict R,
                                         const REAL *restrict s, const REAL *restrict x,
                                         const REAL *restrict y, REAL *restrict acc, long n,
                                         long m)
{
    long r = 0;
    for (; r + 4 <= n; r += 4) {
        ROW4(REAL, R, r, m);
        WROW4(REAL, O, r, m);
        const REAL s0 = s[r], s1 = s[r + 1], s2 = s[r + 2], s3 = s[r + 3];
        const REAL y0 = y[r], y1 = y[r + 1], y2 = y[r + 2], y3 = y[r + 3];
        for (long c = 0; c < m; ++c) {
            const REAL v0 = R0[c] + s0 * x[c], v1 = R1[c] + s1 * x[c];
            const REAL v2 = R2[c] + s2 * x[c], v3 = R3[c] + s3 * x[c];
            O0[c] = v0; O1[c] = v1; O2[c] = v2; O3[c] = v3;
            acc[c] += y0 * v0 + y1 * v1 + y2 * v2 + y3 * v3;
        }
    }
    for (; r < n; ++r) {
        const REAL *restrict R0 = R + r * m;
        REAL *restrict O0 = O + r * m;
        const REAL s0 = s[r], y0 = y[r];
        for (long c = 0; c < m; ++c) {
            const REAL v0 = R0[c] + s0 * x[c];
            O0[c] = v0;
            acc[c] += y0 * v0;
        }
    }
}
/* The adjoint of O = R + s x^T followed by a read of O with weights d (rows) and x2 (cols):
 * G[r, :] += d[r] x2[:] (G, the gradient of O, becomes complete); then
 * acc1[:] += sum_r d[r] P[r, :];  acc2[:] += sum_r s[r] G[r, :];  dot[r] = G[r, :] . y;
 * dot2[r] = P[r, :] . x2. */
static inline void FN(rows_adjoint)(REAL *restrict G, const REAL *restrict P,
                                      const REAL *restrict d, const REAL *restrict x2,
                                      const REAL *restrict s, const REAL *restrict y,
                                      REAL *restrict acc1, REAL *restrict acc2,
                                      REAL *restrict dot, REAL *restrict dot2, long n, long m)
{
    long r = 0;
    for (; r + 2 <= n; r += 2) { /* two rows at a time: four at a time runs out of registers */
        const REAL *restrict P0 = P + r * m, *restrict P1 = P0 + m;
        REAL *restrict G0 = G + r * m, *restrict G1 = G0 + m;
        const REAL d0 = d[r], d1 = d[r + 1], s0 = s[r], s1 = s[r + 1];
        REAL a0 = 0, a1 = 0, b0 = 0, b1 = 0;
        for (long c = 0; c < m; ++c) {
            const REAL g0 = G0[c] + d0 * x2[c], g1 = G1[c] + d1 * x2[c];
            G0[c] = g0; G1[c] = g1;
            acc1[c] += d0 * P0[c] + d1 * P1[c];
            acc2[c] += s0 * g0 + s1 * g1;
            a0 += g0 * y[c]; a1 += g1 * y[c];
            b0 += P0[c] * x2[c]; b1 += P1[c] * x2[c];
        }
        dot[r] = a0; dot[r + 1] = a1;
        dot2[r] = b0; dot2[r + 1] = b1;
    }
    for (; r < n; ++r) {
        const REAL *restrict P0 = P + r * m;
        REAL *restrict G0 = G + r * m;
        const REAL d0 = d[r], s0 = s[r];
        REAL a0 = 0, b0 = 0;
        for (long c = 0; c < m; ++c) {
            const REAL g0 = G0[c] + d0 * x2[c];
            G0[c] = g0;
            acc1[c] += d0 * P0[c];
            acc2[c] += s0 * g0;
            a0 += g0 * y[c];
            b0 += P0[c] * x2[c];
        }
        dot[r] = a0;
        dot2[r] = b0;
    }
}
/* The adjoint of a read of P followed, going backwards, by P's previous value:
 * P[r, :] -= sr[r] xr[:]  (P becomes the memory before the write O = P + sr xr^T);
 * G[r, :] += s[r] x[:];  dot[r] += P[r, :] . x   (s = sr: the adjoint of a = sum_r s[r] P[r, :]) */
static inline void FN(rows_back_dot)(REAL *restrict G, REAL *restrict P, const REAL *restrict s,
                                     const REAL *restrict xr, const REAL *restrict x,
                                     REAL *restrict dot, long n, long m)
{
    long r = 0;
    for (; r + 2 <= n; r += 2) {
        REAL *restrict P0 = P + r * m, *restrict P1 = P0 + m;
        REAL *restrict G0 = G + r * m, *restrict G1 = G0 + m;
        const REAL s0 = s[r], s1 = s[r + 1];
        REAL a0 = 0, a1 = 0;
        for (long c = 0; c < m; ++c) {
            const REAL p0 = P0[c] - s0 * xr[c], p1 = P1[c] - s1 * xr[c];
            P0[c] = p0; P1[c] = p1;
            G0[c] += s0 * x[c]; G1[c] += s1 * x[c];
            a0 += p0 * x[c]; a1 += p1 * x[c];
        }
        dot[r] += a0; dot[r + 1] += a1;
    }
    for (; r < n; ++r) {
        REAL *restrict P0 = P + r * m, *restrict G0 = G + r * m;
        const REAL s0 = s[r];
        REAL a0 = 0;
        for (long c = 0; c < m; ++c) {
            const REAL p0 = P0[c] - s0 * xr[c];
            P0[c] = p0;
            G0[c] += s0 * x[c];
            a0 += p0 * x[c];
        }
        dot[r] += a0;
    }
}
/* P[r, :] -= sr[r] xr[:] (as above); G[r, :] += s[r] x[:];  acc[:] += sum_r s[r] P[r, :]
 * (the adjoint of a[r] = P[r, :] . x) */
static inline void FN(rows_back_acc)(REAL *restrict G, REAL *restrict P, const REAL *restrict sr,
                                     const REAL *restrict xr, const REAL *restrict s,
                                     const REAL *restrict x, REAL *restrict acc, long n, long m)
{
    long r = 0;
    for (; r + 2 <= n; r += 2) {
        REAL *restrict P0 = P + r * m, *restrict P1 = P0 + m;
        REAL *restrict G0 = G + r * m, *restrict G1 = G0 + m;
        const REAL q0 = sr[r], q1 = sr[r + 1], s0 = s[r], s1 = s[r + 1];
        for (long c = 0; c < m; ++c) {
            const REAL p0 = P0[c] - q0 * xr[c], p1 = P1[c] - q1 * xr[c];
            P0[c] = p0; P1[c] = p1;
            G0[c] += s0 * x[c]; G1[c] += s1 * x[c];
            acc[c] += s0 * p0 + s1 * p1;
        }
    }
    for (; r < n; ++r) {
        REAL *restrict P0 = P + r * m, *restrict G0 = G + r * m;
        const REAL q0 = sr[r], s0 = s[r];
        for (long c = 0; c < m; ++c) {
            const REAL p0 = P0[c] - q0 * xr[c];
            P0[c] = p0;
            G0[c] += s0 * x[c];
            acc[c] += s0 * p0;
        }
    }
}
