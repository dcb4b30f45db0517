/* The body of lsam.c, included once per type (REAL, FN, EXP, SQRT). */

/* g = GX[t] + BLK[t] (the input's part and h_{t-1} W_hh^T), the step's pre-activations (rows
 * [q k v r w] per memory): (q, k) = mu(.), (p_r, p_w) = sigma(.), (a_q, a_k) = (M q, M k),
 * u = p_w (v - a_k), M <- M + u k^T (X = M^T in place), h = p_r (a_q + u (q.k)). Saves what
 * the backward step reads. */
void FN(lsam_fwd_step)(long N, long d, long t, long n0, long n1, double eps_, const REAL *restrict BLK,
                       const REAL *restrict GX, REAL *restrict X, REAL *restrict QK, REAL *restrict NRM,
                       REAL *restrict P, REAL *restrict CQ, REAL *restrict E, REAL *restrict U,
                       REAL *restrict R, REAL *restrict OUT)
{
    const long G = 3 * d + 2;
    const REAL eps = (REAL)eps_;
    for (long n = n0; n < n1; ++n) {
        const long tn = t * N + n;
        const REAL *restrict gh = BLK + tn * G, *restrict gi = GX + tn * G;
        REAL g[G];
        for (long j = 0; j < G; ++j) g[j] = gi[j] + gh[j];
        REAL *restrict qs = QK + tn * 2 * d;
        REAL *restrict x = X + n * d * d;
        REAL *restrict e = E + tn * d, *restrict u = U + tn * d, *restrict r = R + tn * d;
        REAL *restrict out = OUT + tn * d;
        REAL sq = 0, sk = 0;
        for (long j = 0; j < d; ++j) {
            sq += g[j] * g[j];
            sk += g[d + j] * g[d + j];
        }
        REAL nq = SQRT(sq), nk = SQRT(sk);
        nq = nq > eps ? nq : eps;
        nk = nk > eps ? nk : eps;
        NRM[tn * 2] = nq;
        NRM[tn * 2 + 1] = nk;
        REAL c = 0, q[d], k[d];
        for (long j = 0; j < d; ++j) {
            q[j] = g[j] / nq;
            k[j] = g[d + j] / nk;
            qs[j] = q[j];
            qs[d + j] = k[j];
            c += q[j] * k[j];
        }
        const REAL p_r = 1 / (1 + EXP(-g[3 * d])), p_w = 1 / (1 + EXP(-g[3 * d + 1]));
        P[tn * 2] = p_r;
        P[tn * 2 + 1] = p_w;
        CQ[tn] = c;
        /* (a_q, a_k)[j] = sum_i (q, k)[i] X[i][j], summed in arrays of this call's own (no
         * aliasing with the buffers, so the loops vectorise) */
        REAL aq[d], ak[d];
        for (long j = 0; j < d; ++j) {
            aq[j] = 0;
            ak[j] = 0;
        }
        for (long i = 0; i < d; ++i) {
            const REAL *restrict xi = x + i * d;
            const REAL qi = q[i], ki = k[i];
            for (long j = 0; j < d; ++j) {
                aq[j] += qi * xi[j];
                ak[j] += ki * xi[j];
            }
        }
        for (long j = 0; j < d; ++j) {
            e[j] = g[2 * d + j] - ak[j]; /* v - M k */
            u[j] = p_w * e[j];
            r[j] = aq[j] + u[j] * c; /* M_t q = M q + u (k.q) */
            out[j] = p_r * r[j];
        }
        for (long i = 0; i < d; ++i) { /* X <- X + k u^T */
            REAL *restrict xi = x + i * d;
            const REAL ki = k[i];
            for (long j = 0; j < d; ++j) xi[j] += ki * u[j];
        }
    }
}

/* The reverse of one step: W (= M_t, row-major) becomes M_{t-1} = M_t - u k^T, dM (the gradient
 * of M_t) becomes that of M_{t-1}; with dh_t = DOUT[t] + dh (dh: the gradient reaching h_t
 * through the next step's product), writes the gradients of the step's pre-activations into
 * DGX[t] (rows [q k v r w]). */
void FN(lsam_bwd_step)(long N, long d, long t, long n0, long n1, double eps_, REAL *restrict W,
                       REAL *restrict dM, const REAL *restrict DOUT, const REAL *restrict dh,
                       const REAL *restrict QK, const REAL *restrict NRM, const REAL *restrict P,
                       const REAL *restrict CQ, const REAL *restrict E, const REAL *restrict U,
                       const REAL *restrict R, REAL *restrict DGX)
{
    const long G = 3 * d + 2;
    const REAL eps = (REAL)eps_;
    for (long n = n0; n < n1; ++n) {
        const long tn = t * N + n;
        const REAL *restrict qs = QK + tn * 2 * d, *restrict us = U + tn * d;
        const REAL *restrict e = E + tn * d, *restrict r = R + tn * d;
        const REAL *restrict dout = DOUT + tn * d, *restrict dhn = dh + n * d;
        REAL *restrict w = W + n * d * d, *restrict dm = dM + n * d * d;
        REAL *restrict gq = DGX + tn * G, *restrict gk = gq + d, *restrict gv = gq + 2 * d;
        const REAL p_r = P[tn * 2], p_w = P[tn * 2 + 1], c = CQ[tn];
        /* dq, dk, da_q = dh p_r and du in arrays of this call's own (no aliasing with the
         * buffers, so the sweeps vectorise) */
        REAL dq[d], dk[d], daq[d], du[d], q[d], k[d], u[d];
        for (long j = 0; j < d; ++j) {
            q[j] = qs[j];
            k[j] = qs[d + j];
            u[j] = us[j];
        }
        REAL dp_r = 0;
        for (long j = 0; j < d; ++j) {
            const REAL dhj = dout[j] + dhn[j];
            dp_r += dhj * r[j];
            daq[j] = dhj * p_r;
            dq[j] = 0;
            dk[j] = 0;
        }
        REAL dc = 0;
        for (long j = 0; j < d; ++j) dc += daq[j] * u[j];
        /* sweep 1: M_{t-1} = M_t - u k^T; du[i] = (dM k)[i] + da_q[i] c */
        for (long i = 0; i < d; ++i) {
            REAL *restrict wi = w + i * d;
            const REAL *restrict dmi = dm + i * d;
            const REAL ui = u[i];
            REAL s = 0;
            for (long j = 0; j < d; ++j) {
                wi[j] -= ui * k[j];
                s += dmi[j] * k[j];
            }
            du[i] = s + daq[i] * c;
        }
        REAL dp_w = 0;
        for (long i = 0; i < d; ++i) dp_w += du[i] * e[i];
        /* sweep 2: dq += M_{t-1}^T da_q, dk += M_{t-1}^T da_k + dM_t^T u, then dM += da_q q^T + da_k k^T
         * (da_k = -p_w du) */
        for (long i = 0; i < d; ++i) {
            const REAL *restrict wi = w + i * d;
            REAL *restrict dmi = dm + i * d;
            const REAL aq = daq[i], ak = -p_w * du[i], ui = u[i];
            for (long j = 0; j < d; ++j) {
                dq[j] += aq * wi[j];
                dk[j] += ak * wi[j] + ui * dmi[j];
                dmi[j] += aq * q[j] + ak * k[j];
            }
        }
        for (long j = 0; j < d; ++j) gv[j] = p_w * du[j]; /* dv */
        /* + dc (k, q), then mu's backward: (dx - x (dx . x_masked)) / max(|x|, eps) */
        const REAL nq = NRM[tn * 2], nk = NRM[tn * 2 + 1];
        REAL pq = 0, pk = 0;
        for (long j = 0; j < d; ++j) {
            dq[j] += dc * k[j];
            dk[j] += dc * q[j];
            pq += dq[j] * q[j];
            pk += dk[j] * k[j];
        }
        pq = nq > eps ? pq : 0;
        pk = nk > eps ? pk : 0;
        for (long j = 0; j < d; ++j) {
            gq[j] = (dq[j] - q[j] * pq) / nq;
            gk[j] = (dk[j] - k[j] * pk) / nk;
        }
        gq[3 * d] = dp_r * p_r * (1 - p_r);
        gq[3 * d + 1] = dp_w * p_w * (1 - p_w);
    }
}
