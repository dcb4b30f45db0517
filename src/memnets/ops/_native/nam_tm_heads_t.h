/* The body of nam_tm_heads.c, included once per type (REAL, FN). */
/* dst[l] = w[0] src[l+1] + w[1] src[l] + w[2] src[l-1] + w[3] j[l]  (indices mod L): the
 * LEFT, NOOP, RIGHT and JUMP moves of a head at once (an absent action has weight 0) */
static inline void FN(moves)(REAL *restrict dst, const REAL *restrict src, const REAL *restrict j,
                             const REAL *restrict w, long L)
{
    const REAL w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3];
    if (L == 1) {
        dst[0] = (w0 + w1 + w2) * src[0] + w3 * j[0];
        return;
    }
    dst[0] = w0 * src[1] + w1 * src[0] + w2 * src[L - 1] + w3 * j[0];
    for (long l = 1; l < L - 1; ++l) dst[l] = w0 * src[l + 1] + w1 * src[l] + w2 * src[l - 1] + w3 * j[l];
    dst[L - 1] = w0 * src[0] + w1 * src[L - 1] + w2 * src[L - 2] + w3 * j[L - 1];
}
/* out[a] = <move_a(src), d> for a = LEFT, NOOP, RIGHT, JUMP (move_JUMP(src) = j) */
static inline void FN(move_dots)(REAL *restrict out, const REAL *restrict src, const REAL *restrict j,
                                 const REAL *restrict d, long L)
{
    REAL s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (long l = 0; l < L; ++l) {
        s1 += src[l] * d[l];
        s3 += j[l] * d[l];
    }
    for (long l = 0; l + 1 < L; ++l) {
        s0 += src[l + 1] * d[l];
        s2 += src[l] * d[l + 1];
    }
    s0 += src[0] * d[L - 1];
    s2 += src[L - 1] * d[0];
    out[0] = s0; out[1] = s1; out[2] = s2; out[3] = s3;
}

/* y = x / max(|x|, eps), eps = 1e-6 (memnets.memories.nam_tm._unit); returns y; *n = the divisor,
 * *unclamped = whether the norm was at least eps */
static inline const REAL *FN(unit_row)(REAL *restrict y, const REAL *restrict x, long L, REAL *n, int *unclamped)
{
    REAL s = 0;
    for (long l = 0; l < L; ++l) s += x[l] * x[l];
    const REAL norm = sqrt(s), eps = (REAL)1e-6;
    *unclamped = norm >= eps;
    *n = *unclamped ? norm : eps;
    for (long l = 0; l < L; ++l) y[l] = x[l] / *n;
    return y;
}

void FN(nam_tm_heads_fwd)(long T, long B, long Tn, int bm, long L, long C, long A, const int *order,
                            int has_jump, int transposed, int unit_keys, const REAL *act, const REAL *q,
                            const REAL *k, const REAL *pw, const REAL *pe, REAL *Hs, REAL *Kc,
                            long S, REAL *Aa, REAL *U, REAL *J, REAL *work, long n0,
                            long n1)
{
    const long LC = L * C, X = transposed ? L : C, N = B * Tn;
    REAL *restrict hu = has_jump ? work + 2 * LC : NULL, hn; /* work (with JUMP): two key tapes, a row of L */
    int hfree;
    for (long n = n0; n < n1; ++n) {
        const long b = n / Tn, h = n % Tn;
        if (has_jump) memcpy(work, Kc + n * LC, sizeof(REAL) * LC); /* K_0 */
        for (long t = 0; t < T; ++t) {
            const long tn = ROW_S(t), th = ROW_H(t);
            if (t + 1 < T) { /* the rows of step t + 1 */
                const long sn = ROW_S(t + 1);
                PREFETCH_ROW(act + sn * 2 * A, 2 * A * sizeof(REAL), 0);
                PREFETCH_ROW(Hs + ROW_H(t + 2) * 2 * L, 2 * L * sizeof(REAL), 1);
                if (has_jump) {
                    PREFETCH_ROW(q + sn * C, C * sizeof(REAL), 0); PREFETCH_ROW(k + sn * C, C * sizeof(REAL), 0);
                    PREFETCH_ROW(Aa + sn * X, X * sizeof(REAL), 1); PREFETCH_ROW(U + sn * X, X * sizeof(REAL), 1);
                    PREFETCH_ROW(J + sn * L, L * sizeof(REAL), 1);
                    __builtin_prefetch(pw + sn); __builtin_prefetch(pe + sn);
                }
            }
            const REAL *restrict H = Hs + th * 2 * L;
            const REAL *restrict W = act + tn * 2 * A;
            REAL *restrict Hn = Hs + ROW_H(t + 1) * 2 * L;
            REAL *restrict j = NULL;
            if (has_jump) {
                /* K_t in work[t % 2]; K_t saved every S steps, K_T at the end */
                const REAL *restrict Kt = work + (t % 2) * LC;
                /* the key tape's head: H_w, or mu(H_w) with unit_keys */
                const REAL *restrict hw = unit_keys ? FN(unit_row)(hu, H + L, L, &hn, &hfree) : H + L;
                const REAL *restrict kk = k + tn * C;
                const REAL *restrict qq = q + tn * C;
                REAL *restrict Kn = work + ((t + 1) % 2) * LC;
                if (t % S == 0 && t > 0) memcpy(Kc + ((t / S) * N + n) * LC, Kt, sizeof(REAL) * LC);
                REAL *restrict a = Aa + tn * X;
                REAL *restrict u = U + tn * X;
                const REAL p_w = pw[tn], p_e = pe[tn];
                j = J + tn * L;
                if (!transposed) { /* a = K H_w; u = p_w k - p_e a; K' = K + u H_w^T; j = K'^T q */
                    FN(rows_accum)(a, Kt, hw, L, C, 1);
                    for (long c = 0; c < C; ++c) u[c] = p_w * kk[c] - p_e * a[c];
                    FN(rows_update_dot)(Kn, Kt, hw, u, qq, j, L, C);
                } else { /* a = K^T k; w = p_w H_w - p_e a; K' = K + k w^T; j = K'^T q */
                    FN(rows_dot)(a, Kt, kk, L, C, 1);
                    for (long l = 0; l < L; ++l) u[l] = p_w * hw[l] - p_e * a[l];
                    FN(rows_update_dot)(Kn, Kt, u, kk, qq, j, L, C);
                }
            }
            for (long e = 0; e < 2; ++e) { /* H'_e = sum_a act_{e,a} move_a(H_e), e = read, write */
                REAL w[4] = {0, 0, 0, 0};
                for (long i = 0; i < A; ++i) w[order[i]] = W[e * A + i];
                FN(moves)(Hn + e * L, H + e * L, j ? j : H + e * L, w, L);
            }
        }
        if (has_jump) /* K_T: returned, and saved for the backward */
            memcpy(Kc + (((T + S - 1) / S) * N + n) * LC, work + (T % 2) * LC, sizeof(REAL) * LC);
    }
}

void FN(nam_tm_heads_bwd)(long T, long B, long Tn, int bm, long L, long C, long A, const int *order,
                            int has_jump, int transposed, int unit_keys, const REAL *act, const REAL *q,
                            const REAL *k, const REAL *pw, const REAL *pe, const REAL *Hs,
                            const REAL *Kc, long S, const REAL *Aa, const REAL *U, const REAL *J,
                            const REAL *gH, REAL *dK, REAL *dact, REAL *dq, REAL *dk, REAL *dpw,
                            REAL *dpe, REAL *dH0, REAL *work, long n0, long n1)
{
    const long LC = L * C, X = transposed ? L : C, M = L > C ? L : C, N = B * Tn;
    long jpos = -1;
    for (long i = 0; i < A; ++i) if (order[i] == 3) jpos = i;
    /* work: the key tape (with JUMP), then the scratch rows below */
    REAL *restrict dHn = work + (has_jump ? LC : 0), *restrict dH = dHn + 2 * L, *restrict dj = dH + 2 * L;
    REAL *restrict dv = dj + L, *restrict da = dv + M, *restrict sc = da + M, *restrict hu = sc + L;
    REAL *restrict dhu = hu + L, hn;
    int hfree;
    for (long n = n0; n < n1; ++n) {
        REAL *dKr = has_jump ? dK + n * LC : NULL; /* of K_{t+1}^T, then of K_t^T */
        const long b = n / Tn, h = n % Tn;
        memcpy(dHn, gH + ROW_H(T) * 2 * L, sizeof(REAL) * 2 * L);
        for (long t = T - 1; t >= 0; --t) {
            const long tn = ROW_S(t), th = ROW_H(t);
            if (has_jump && (t == T - 1 || (t + 1) % S == 0)) { /* K_{t+1}, saved */
                const long slot = t + 1 == T ? (T + S - 1) / S : (t + 1) / S;
                memcpy(work, Kc + (slot * N + n) * LC, sizeof(REAL) * LC);
            }
            if (t > 0) { /* the rows of step t - 1 */
                const long sp = ROW_S(t - 1), hp = ROW_H(t - 1);
                PREFETCH_ROW(act + sp * 2 * A, 2 * A * sizeof(REAL), 0);
                PREFETCH_ROW(dact + sp * 2 * A, 2 * A * sizeof(REAL), 1);
                PREFETCH_ROW(Hs + hp * 2 * L, 2 * L * sizeof(REAL), 0);
                PREFETCH_ROW(gH + hp * 2 * L, 2 * L * sizeof(REAL), 0);
                if (has_jump) {
                    PREFETCH_ROW(q + sp * C, C * sizeof(REAL), 0); PREFETCH_ROW(k + sp * C, C * sizeof(REAL), 0);
                    PREFETCH_ROW(Aa + sp * X, X * sizeof(REAL), 0); PREFETCH_ROW(U + sp * X, X * sizeof(REAL), 0);
                    PREFETCH_ROW(J + sp * L, L * sizeof(REAL), 0);
                    PREFETCH_ROW(dq + sp * C, C * sizeof(REAL), 1); PREFETCH_ROW(dk + sp * C, C * sizeof(REAL), 1);
                    __builtin_prefetch(pw + sp); __builtin_prefetch(pe + sp);
                }
            }
            const REAL *restrict H = Hs + th * 2 * L;
            const REAL *restrict W = act + tn * 2 * A;
            const REAL *restrict g = gH + th * 2 * L;
            const REAL *restrict j = has_jump ? J + tn * L : NULL;
            REAL *restrict dW = dact + tn * 2 * A;
            for (long e = 0; e < 2; ++e) { /* e = read, write head */
                const REAL *restrict dn = dHn + e * L;
                REAL dots[4], w[4] = {0, 0, 0, 1}; /* the adjoint moves: LEFT^T = RIGHT, RIGHT^T = LEFT */
                FN(move_dots)(dots, H + e * L, j ? j : H + e * L, dn, L); /* <move_a(H), dH'> */
                for (long i = 0; i < A; ++i) {
                    const int a = order[i];
                    dW[e * A + i] = dots[a];
                    if (a != 3) w[2 - a] = W[e * A + i];
                }
                FN(moves)(dH + e * L, dn, g + e * L, w, L); /* dH = g + sum_a act_a move_a^T(dH') */
            }
            if (has_jump) {
                REAL *restrict Kn = work; /* K_{t+1}, then K_t */
                const REAL *restrict hw = unit_keys ? FN(unit_row)(hu, H + L, L, &hn, &hfree) : H + L;
                const REAL *restrict kk = k + tn * C;
                const REAL *restrict qq = q + tn * C;
                const REAL *restrict a = Aa + tn * X;
                const REAL *restrict u = U + tn * X;
                const REAL p_w = pw[tn], p_e = pe[tn];
                REAL *restrict dqq = dq + tn * C;
                REAL *restrict dkk = dk + tn * C;
                /* the gradient of the key tape's head: into dH_w, or into dhu and then through mu */
                REAL *restrict dhw = unit_keys ? dhu : dH + L;
                REAL sw = 0, se = 0;
                if (unit_keys) for (long l = 0; l < L; ++l) dhu[l] = 0;
                for (long l = 0; l < L; ++l) dj[l] = W[jpos] * dHn[l] + W[A + jpos] * dHn[L + l];
                for (long c = 0; c < C; ++c) dqq[c] = 0;
                if (!transposed) {
                    for (long c = 0; c < C; ++c) dv[c] = 0; /* du */
                    /* j = K'^T q and K' = K + u H_w^T: dq, du, and dH_w from the write */
                    FN(rows_adjoint)(dKr, Kn, dj, qq, hw, u, dqq, dv, da, sc, L, C);
                    for (long l = 0; l < L; ++l) dhw[l] += da[l];
                    for (long c = 0; c < C; ++c) { /* u = p_w k - p_e a */
                        dkk[c] = p_w * dv[c];
                        sw += kk[c] * dv[c];
                        se += a[c] * dv[c];
                        da[c] = -p_e * dv[c];
                    }
                    FN(rows_back_dot)(dKr, Kn, hw, u, da, dhw, L, C); /* K = K' - u H_w^T; a = K H_w */
                } else {
                    for (long c = 0; c < C; ++c) dkk[c] = 0;
                    /* j = K'^T q and K' = K + k w^T: dq, dk from the write, dw */
                    FN(rows_adjoint)(dKr, Kn, dj, qq, u, kk, dqq, dkk, dv, sc, L, C);
                    for (long l = 0; l < L; ++l) { /* w = p_w H_w - p_e a */
                        dhw[l] += p_w * dv[l];
                        sw += hw[l] * dv[l];
                        se += a[l] * dv[l];
                        da[l] = -p_e * dv[l];
                    }
                    FN(rows_back_acc)(dKr, Kn, u, kk, da, kk, dkk, L, C); /* K = K' - k w^T; a = K^T k */
                }
                if (unit_keys) { /* dH_w += (dhu - mu <mu, dhu>) / n  (the projection only where not clamped) */
                    REAL s = 0;
                    if (hfree) for (long l = 0; l < L; ++l) s += hu[l] * dhu[l];
                    for (long l = 0; l < L; ++l) dH[L + l] += (dhu[l] - hu[l] * s) / hn;
                }
                dpw[tn] = sw;
                dpe[tn] = -se;
            }
            memcpy(dHn, dH, sizeof(REAL) * 2 * L);
        }
        memcpy(dH0 + n * 2 * L, dHn, sizeof(REAL) * 2 * L);
    }
}
