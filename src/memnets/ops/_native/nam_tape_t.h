/* The body of nam_tape.c, included once per type (REAL, FN). */
void FN(nam_tape_fwd)(long B, long T, long H, long K, long V, long qb, long qt, long qh,
                       const REAL *q, const REAL *k,
                        const REAL *v, const REAL *pw, const REAL *pe, const REAL *pr, REAL *o,
                        REAL *St, REAL *Sc, long S_, REAL *Aa, REAL *U, REAL *work, long n0,
                        long n1)
{
    const long KV = K * V;
    for (long n = n0; n < n1; ++n) {
        const long b = n / H, h = n % H;
        memcpy(work, St + n * KV, sizeof(REAL) * KV); /* S_0 */
        for (long t = 0; t < T; ++t) {
            const long i = (b * T + t) * H + h; /* the (b, t, h) row */
            const REAL *restrict Sp = work + (t % 2) * KV;
            REAL *restrict Sn = work + ((t + 1) % 2) * KV;
            const long iq = b * qb + t * qt + h * qh; /* q, k: any strides but the last */
            if (t + 1 < T) { /* the rows of step t + 1 */
                PREFETCH_ROW(q + iq + qt, K * sizeof(REAL), 0); PREFETCH_ROW(k + iq + qt, K * sizeof(REAL), 0);
                PREFETCH_ROW(v + (i + H) * V, V * sizeof(REAL), 0);
                PREFETCH_ROW(o + (i + H) * V, V * sizeof(REAL), 1);
                PREFETCH_ROW(Aa + (i + H) * V, V * sizeof(REAL), 1); PREFETCH_ROW(U + (i + H) * V, V * sizeof(REAL), 1);
            }
            const REAL *restrict kk = k + iq, *restrict qq = q + iq;
            const REAL *restrict vv = v + i * V;
            REAL *restrict a = Aa + i * V, *restrict u = U + i * V, *restrict oo = o + i * V;
            const REAL p_w = pw[i], p_e = pe[i], p_r = pr ? pr[i] : (REAL)1;
            if (t % S_ == 0) memcpy(Sc + ((t / S_) * B * H + n) * KV, Sp, sizeof(REAL) * KV);
            FN(rows_accum)(a, Sp, kk, K, V, 1); /* a = S k */
            for (long c = 0; c < V; ++c) {
                u[c] = p_w * vv[c] - p_e * a[c];
                oo[c] = 0;
            }
            FN(rows_update_acc)(Sn, Sp, kk, u, qq, oo, K, V);     /* S' = S + u k^T; o = S' q */
            for (long c = 0; c < V; ++c) oo[c] *= p_r;
        }
        memcpy(St + n * KV, work + (T % 2) * KV, sizeof(REAL) * KV); /* S_T */
        memcpy(Sc + (((T + S_ - 1) / S_) * B * H + n) * KV, work + (T % 2) * KV, sizeof(REAL) * KV);
    }
}

void FN(nam_tape_bwd)(long B, long T, long H, long K, long V, long qb, long qt, long qh,
                       const REAL *q, const REAL *k,
                        const REAL *v, const REAL *pw, const REAL *pe, const REAL *pr,
                        const REAL *Sc, long S_, const REAL *Aa, const REAL *U, const REAL *go,
                        REAL *dS, REAL *dq, REAL *dk, REAL *dv, REAL *dpw, REAL *dpe, REAL *dpr,
                        REAL *work, long n0, long n1)
{
    const long KV = K * V;
    /* work: S (K x V), then four scratch rows of V */
    REAL *restrict du = work + KV, *restrict da = du + V, *restrict dr = da + V, *restrict rho = dr + V;
    for (long n = n0; n < n1; ++n) {
        const long b = n / H, h = n % H;
        REAL *restrict dSr = dS + n * KV; /* of S_{t+1}^T, then of S_t^T */
        for (long t = T - 1; t >= 0; --t) {
            if (t == T - 1 || (t + 1) % S_ == 0) { /* S_{t+1}, saved */
                const long slot = t + 1 == T ? (T + S_ - 1) / S_ : (t + 1) / S_;
                memcpy(work, Sc + (slot * B * H + n) * KV, sizeof(REAL) * KV);
            }
            const long i = (b * T + t) * H + h;
            REAL *restrict Sn = work; /* S_{t+1}, then S_t */
            const long iq = b * qb + t * qt + h * qh;
            if (t > 0) { /* the rows of step t - 1 */
                const long ip = i - H, iqp = iq - qt;
                PREFETCH_ROW(q + iqp, K * sizeof(REAL), 0); PREFETCH_ROW(k + iqp, K * sizeof(REAL), 0);
                PREFETCH_ROW(v + ip * V, V * sizeof(REAL), 0); PREFETCH_ROW(go + ip * V, V * sizeof(REAL), 0);
                PREFETCH_ROW(Aa + ip * V, V * sizeof(REAL), 0); PREFETCH_ROW(U + ip * V, V * sizeof(REAL), 0);
                PREFETCH_ROW(dq + ip * K, K * sizeof(REAL), 1); PREFETCH_ROW(dk + ip * K, K * sizeof(REAL), 1);
                PREFETCH_ROW(dv + ip * V, V * sizeof(REAL), 1);
            }
            const REAL *restrict kk = k + iq, *restrict qq = q + iq, *restrict vv = v + i * V;
            const REAL *restrict a = Aa + i * V, *restrict u = U + i * V, *restrict g = go + i * V;
            const REAL p_w = pw[i], p_e = pe[i], p_r = pr ? pr[i] : (REAL)1;
            REAL *restrict dqq = dq + i * K, *restrict dkk = dk + i * K, *restrict dvv = dv + i * V;
            REAL sr = 0, sw = 0, se = 0;
            for (long c = 0; c < V; ++c) { dr[c] = p_r * g[c]; du[c] = 0; rho[c] = 0; }
            /* o = p_r S' q and S' = S + u k^T: dq, rho = S' q, du, and dk from the write */
            FN(rows_adjoint)(dSr, Sn, qq, dr, kk, u, rho, du, dkk, dqq, K, V);
            IVDEP for (long c = 0; c < V; ++c) { /* u = p_w v - p_e a */
                sr += g[c] * rho[c];
                dvv[c] = p_w * du[c];
                sw += vv[c] * du[c];
                se += a[c] * du[c];
                da[c] = -p_e * du[c];
            }
            FN(rows_back_dot)(dSr, Sn, kk, u, da, dkk, K, V); /* S_t = S_{t+1} - u k^T; a = S_t k */
            dpw[i] = sw;
            dpe[i] = -se;
            if (dpr) dpr[i] = sr;
        }
    }
}
